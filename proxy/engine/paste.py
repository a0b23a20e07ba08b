"""Where a pasted block begins and ends inside one huge text: the user's own words around it stay theirs.

A user who pastes a megabyte log writes a line before it ("Here's the log from last night:") and often a
question after it ("Why does the worker restart every 5 minutes?"). Interception stores the paste out of line;
the words around it must stay in the message, verbatim and in place, or the model never sees the question.

The words are read from each end of the text inward, line by line, within ``max_tokens`` (a few hundred
tokens) and a window of characters, so the work is bounded whatever the paste (no regex runs over it):

* blank lines, and lines that read as prose, are the user's words;
* a line that reads as machine output or code (indented, opening with a bracket, timestamped, a syslog
  line, a statement or block opening, mostly digits and symbols: ``machine_line``), or a fence (three or
  more backticks or tildes) that does not close within the budget, is where the paste begins (ends, reading
  from the end): everything before it (after it) is the user's;
* when the budget runs out first (a paste that reads as prose, or whose lines look like the words), only the
  outermost paragraph is the user's: up to the first blank line; at the start, failing that, up to a line
  that ends with a colon ("Here's the log:"); failing that, the outermost line. A short fenced block the
  user wrote (a command, a snippet) is part of their words.

Errors fall on the side of the words: a paste line read as prose stays in the message (at most
``max_tokens`` of them at each end), whereas a user's line read as paste would hide it in the stub.

A paste that is one fenced block keeps its fence lines in the message's stored original and stores only what
is inside, as ``<file>`` blocks do; the stub replaces the block, fences included. A text with no words at
either end is all paste (``find`` returns None) and is intercepted as a whole, as before.

Deterministic: the same text always splits the same way (the forwarded message stays byte-stable).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy import tokens

DEFAULT_NAME = "pasted-text.txt"
MAX_WORDS_TOKENS = 512  # of the user's words at each end of a paste
WINDOW_CHARS_PER_TOKEN = 8  # the words are looked for in this many characters per token of budget
_MONTHS = frozenset(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
# Info strings of a fence that name a kind the explorers know (structure, code outline): the stored payload's
# name gets the extension, so a pasted ```python block is outlined as code.
_EXTENSIONS = {
    "python": "py", "py": "py", "javascript": "js", "js": "js", "jsx": "jsx", "typescript": "ts", "ts": "ts",
    "tsx": "tsx", "go": "go", "golang": "go", "rust": "rs", "rs": "rs", "java": "java", "kotlin": "kt",
    "c": "c", "cpp": "cpp", "c++": "cpp", "csharp": "cs", "cs": "cs", "ruby": "rb", "rb": "rb", "php": "php",
    "swift": "swift", "scala": "scala", "sh": "sh", "bash": "sh", "shell": "sh", "sql": "sql", "lua": "lua",
    "json": "json", "jsonl": "jsonl", "ndjson": "ndjson", "yaml": "yaml", "yml": "yaml", "xml": "xml",
    "csv": "csv", "tsv": "tsv",
}  # fmt: skip


@dataclass(frozen=True)
class Paste:
    """The paste in a text: ``text[start:end]`` is replaced by the stub in what is forwarded (the fence lines
    included); ``text[inner_start:inner_end]`` is what is stored out of line."""

    start: int
    end: int
    inner_start: int
    inner_end: int
    name: str  # of the stored payload


def whole(text: str) -> Paste:
    """All of ``text`` as the paste: a text with no words around it."""
    return Paste(0, len(text), 0, len(text), DEFAULT_NAME)


def words_budget(large_threshold: int) -> int:
    """Tokens of words kept at each end of a paste: a few hundred, and at most a quarter of the threshold
    above which a text is intercepted (so the paste is always most of such a text)."""
    return max(0, min(MAX_WORDS_TOKENS, large_threshold // 4))


def find(text: str, max_tokens: int) -> Paste | None:
    """The pasted block between the user's words in ``text``; None when the text has no words around it
    (all of it is the paste) or when the words cannot be told apart within ``max_tokens``."""
    if max_tokens <= 0:
        return None
    window = max_tokens * WINDOW_CHARS_PER_TOKEN
    start = _lead_end(text, max_tokens, window)
    end = _trail_start(text, max_tokens, window)
    if start >= end or not (text[:start].strip() or text[end:].strip()):
        return None
    inner_start, inner_end, info = _unfenced(text, start, end)
    if inner_start >= inner_end:
        return None
    extension = _EXTENSIONS.get(info.split()[0].lower() if info.split() else "", "txt")
    return Paste(start, end, inner_start, inner_end, f"pasted-text.{extension}")


def machine_line(line: str) -> bool:
    """Whether a (non-blank) line reads as machine output or code rather than a person's sentence. Decided
    on a few sure signs only: a person's line taken for machine output would end up inside the stub."""
    if line.startswith(("\t", "    ")):
        return True  # indented code, a stack trace's frames
    stripped = line.strip()
    if not stripped:
        return False
    if stripped[0] in ("{", "}", "[", "]", "<", "|"):
        return True  # JSON, a bracketed log prefix, markup, a table
    words = stripped.split(None, 3)
    if _stamped(words[0]):
        return True  # 2024-05-01T03:14:07Z …, 10.0.0.1 - - …, 03:14:07.123 …
    if len(words) >= 3 and words[0][:3].lower() in _MONTHS and words[1].isdigit() and _stamped(words[2]):
        return True  # syslog: Jan 12 03:14:07 host …
    if stripped.endswith(("{", ";")) or (stripped.endswith("):") and _called(stripped)):
        return True  # a statement, a block's opening line: def handler(event):, if (x) {
    visible = len(stripped) - stripped.count(" ")
    letters = sum(c.isalpha() for c in stripped)
    return visible >= 8 and 5 * letters < 2 * visible  # numbers, hex, symbols


def _called(line: str) -> bool:
    """Whether a name is followed by an opening parenthesis (``handler(``), as in code, not in a sentence."""
    at = line.find("(")
    while at >= 0:
        if at > 0 and (line[at - 1].isalnum() or line[at - 1] == "_"):
            return True
        at = line.find("(", at + 1)
    return False


def _stamped(word: str) -> bool:
    """A date, time, version or address: digits joined by separators at least twice (``2024-05-01``,
    ``03:14:07``, ``10.0.0.1``), not a number a sentence may open with ("1.5 seconds", "12:30")."""
    joins = 0
    for i in range(1, len(word) - 1):
        if word[i] in "-:/." and word[i - 1].isdigit() and word[i + 1].isdigit():
            joins += 1
            if joins >= 2:
                return True
    return False


def fence(line: str) -> tuple[str, int, str] | None:
    """(character, length, info string) of a fence line (CommonMark: at most 3 spaces of indent, then 3 or more
    backticks or tildes), or None."""
    body = line.lstrip(" ")
    if len(line) - len(body) > 3 or body[:1] not in ("`", "~"):
        return None
    char = body[0]
    length = len(body) - len(body.lstrip(char))
    info = body[length:].strip()
    if length < 3 or (char == "`" and "`" in info):
        return None
    return char, length, info


def _closes(line: str, char: str, length: int) -> bool:
    found = fence(line)
    return found is not None and found[0] == char and found[1] >= length and not found[2]


def _cost(line: str) -> int:
    return tokens.count_text(line) + 1  # and its line break


def _lead_end(text: str, max_tokens: int, window: int) -> int:
    """Where the user's words at the start of ``text`` end (0: none): at the start of a line."""
    limit = min(len(text), window)
    position = used = 0
    blank_break = colon_break = line_break = None
    after_blank = False
    while True:
        newline = text.find("\n", position, limit)
        if newline < 0:
            break  # a line longer than the window: not a line of words
        line = text[position:newline].rstrip("\r")
        if not line.strip():
            position, after_blank = newline + 1, True
            continue
        if after_blank and used and blank_break is None:
            blank_break = position
        after_blank = False
        opened = fence(line)
        if opened is not None:
            closed = _fence_close(text, newline + 1, limit, opened)
            if closed is None:
                return position  # a fence that does not close soon: the paste begins with it
            block = tokens.count_text(text[position:closed]) + 1
            if used + block > max_tokens:
                return position
            used += block
            position = min(closed + 1, len(text))
            line_break = line_break if line_break is not None else position
            continue
        if machine_line(line):
            return position
        used += _cost(line)
        if used > max_tokens:
            break
        position = newline + 1
        if line_break is None:
            line_break = position
        if colon_break is None and line.rstrip().endswith(":"):
            colon_break = position
    # The budget or the window ran out among lines that read as words: the paste reads as prose too.
    for candidate in (blank_break, colon_break, line_break):
        if candidate is not None:
            return candidate
    return 0


def _fence_close(text: str, position: int, limit: int, opened: tuple[str, int, str]) -> int | None:
    """The end of the line that closes the fence ``opened`` (its line break, or the text's end), looked for
    from ``position`` up to ``limit``; None when it does not close there."""
    char, length, _ = opened
    while position <= limit:
        newline = text.find("\n", position, limit)
        end = newline if newline >= 0 else limit
        if newline < 0 and limit < len(text):
            return None  # the line runs on past the window
        if _closes(text[position:end].rstrip("\r"), char, length):
            return end
        if newline < 0:
            return None
        position = newline + 1
    return None


def _trail_start(text: str, max_tokens: int, window: int) -> int:
    """Where the user's words at the end of ``text`` begin (``len(text)``: none): at the line break that ends
    the paste's last line, so that the words keep it."""
    low = max(0, len(text) - window)
    start = line_end = len(text)
    used = 0
    blank_break = line_break = None
    after_blank = False
    while True:
        newline = text.rfind("\n", low, line_end)
        if newline < 0:
            if low == 0 and line_end > 0:
                newline = -1  # the text's first line
            else:
                break
        line = text[newline + 1 : line_end].rstrip("\r")
        if not line.strip():
            if newline < 0:
                break
            start, line_end, after_blank = newline, newline, True
            continue
        if after_blank and used and blank_break is None:
            blank_break = start
        after_blank = False
        if newline < 0:
            break  # the whole text read as words: nothing left for a paste
        closing = fence(line)
        if closing is not None:
            opened_at = _fence_open(text, newline, low, closing) if not closing[2] else None
            if opened_at is None:
                return start  # the end of a fenced paste: the words begin after its closing line
            block = tokens.count_text(text[opened_at:line_end]) + 1
            if used + block > max_tokens or opened_at == 0:
                return start
            used += block
            start = line_end = opened_at - 1  # the line break before the block's opening line
            line_break = line_break if line_break is not None else start
            continue
        if machine_line(line):
            return start
        used += _cost(line)
        if used > max_tokens:
            break
        start = line_end = newline
        if line_break is None:
            line_break = start
    for candidate in (blank_break, line_break):
        if candidate is not None:
            return candidate
    return len(text)


def _fence_open(text: str, newline: int, low: int, closing: tuple[str, int, str]) -> int | None:
    """The start of the line that opens the fenced block whose closing line follows ``newline``, looked for
    back to ``low``: the nearest fence line of the same character and length (a pasted document's own inner
    fences are shorter than the ones around it); None when there is none."""
    char, length, _ = closing
    line_end = newline
    while line_end > low:
        previous = text.rfind("\n", low, line_end)
        if previous < 0 and low > 0:
            return None  # the line runs on before the window
        found = fence(text[previous + 1 : line_end].rstrip("\r"))
        if found is not None and found[0] == char and found[1] == length:
            return previous + 1
        if previous < 0:
            return None
        line_end = previous
    return None


def _unfenced(text: str, start: int, end: int) -> tuple[int, int, str]:
    """What of ``text[start:end]`` is stored: inside the fence when the span is one fenced block (from its
    opening line to its closing line), else all of it; and the opening fence's info string."""
    first_break = text.find("\n", start, end)
    last_break = text.rfind("\n", start, end)
    if first_break < 0 or last_break <= first_break:
        return start, end, ""
    opened = fence(text[start:first_break].rstrip("\r"))
    if opened is None or not _closes(text[last_break + 1 : end].rstrip("\r"), opened[0], opened[1]):
        return start, end, ""
    return first_break + 1, last_break, opened[2]
