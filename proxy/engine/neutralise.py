"""One neutraliser for every block the proxy wraps around untrusted content.

Summary blocks (``<summary … trust="untrusted">``), auto-recall excerpts (``<recalled_history>``), file and
tool-output stubs with their exploration summaries, what the recall tools wrap (child summaries, the
``<material>`` of ``lcm_expand_query``) and the ledger's items (``<standing_instructions>``) all pass their
content through ``neutralise``:

* **Forged markers made inert.** Anything a reader could take for one of the proxy's own tags
  (``TAG_NAMES``, opening or closing) has its ``<`` escaped (``&lt;``); anything it could take for an
  auto-recall excerpt label (``[msg_12 | user | …]``) or a transcript header (``[2024-05-01T10:00:00Z |
  user]``, ``[… to … | summary sum_…]``), anywhere in a line, has its ``[`` escaped (``&#91;``). The
  summary model's input (``render_message``, previous notes, child summaries) gets this part too: what it
  reads as a turn or a note must be one. Detection reads the text *folded*
  (``fold``, over every code point): zero-width characters, soft hyphens, bidi controls and every other
  format character (category Cf, above the BMP too) and combining mark (Mn, Me) ignored; full-width, small,
  mathematical and accented forms (the NFKD base), look-alike letters of any script (Unicode's confusables
  of ``a``–``z``, ``A``–``Z``: Cyrillic ``і``, Armenian ``ս``, Cherokee ``Ꮪ``, Greek ``ο``…) and look-alike
  angles and brackets (``‹›``, ``⟨⟩``, ``〈〉``, ``＜＞``) read as ASCII.
  The fold maps every character to exactly one, so a match's position is the original's.
* **Instruction overrides removed** (``remove_instruction_overrides``): sentences that try to take over
  their reader ("Ignore all previous instructions…") become ``REMOVED_MARKER``, the same filter model-written
  summaries get, read through the same fold.

Everything here is a deterministic function of its input (renderings stay byte-stable between compactions)
and linear in its size: one ``str.translate``, patterns without nested quantifiers whose gaps are separated
by fixed characters.
"""

from __future__ import annotations

import functools
import json
import re
import string
import unicodedata
from importlib import resources

# --- the fold ----------------------------------------------------------------------------------------------

IGNORED = "\x00"  # what an invisible character folds to; the patterns allow it anywhere inside a marker

# Letters that look like ASCII ones but NFKC keeps apart (Unicode's confusables, the common ones).
_LOOKALIKES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "һ": "h", "і": "i", "ї": "i", "ј": "j", "к": "k", "ӏ": "l",
    "м": "m", "н": "h", "о": "o", "р": "p", "ԛ": "q", "с": "c", "ѕ": "s", "т": "t", "у": "y", "ԝ": "w",
    "х": "x", "ԁ": "d", "ɡ": "g", "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O",
    "Р": "P", "С": "C", "Т": "T", "У": "Y", "Х": "X", "І": "I", "Ј": "J", "Ѕ": "S", "Ԁ": "D", "Ԛ": "Q",
    "Ԝ": "W", "Ү": "Y",
    # Greek
    "α": "a", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    # Latin
    "ı": "i", "ȷ": "j", "ɑ": "a", "ʀ": "r", "ꜱ": "s", "ᴀ": "a", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ᴍ": "m",
    "ᴏ": "o", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ᴢ": "z", "ℓ": "l",
    # angles, slashes, brackets, bars
    "‹": "<", "›": ">", "⟨": "<", "⟩": ">", "\u2329": "<", "\u232a": ">", "\u3008": "<", "\u3009": ">",
    "❮": "<", "❯": ">",
    "˂": "<", "˃": ">", "ᐸ": "<", "ᐳ": ">", "⧼": "<", "⧽": ">", "《": "<", "》": ">",
    "⁄": "/", "∕": "/", "⧸": "/", "╱": "/", "⟋": "/",
    "【": "[", "】": "]", "〔": "[", "〕": "]", "⟦": "[", "⟧": "]", "⁅": "[", "⁆": "]",
    "│": "|", "∣": "|", "ǀ": "|", "￨": "|", "⼁": "|",
}  # fmt: skip
# Invisible characters that are not format characters (category Cf covers zero-width spaces and joiners, the
# soft hyphen, bidi controls, the BOM and tag characters): fillers, variation selectors, the grapheme joiner.
_INVISIBLE = "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u3164\uffa0" + "".join(map(chr, range(0xFE00, 0xFE10)))
_ASCII_KEPT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789<>/[]|_-:. \t\n")


# Where Unicode assigns characters other than private-use ones: planes 0-3 and plane 14 (tags, variation
# selectors). Planes 4-13 hold no assigned code point and 15-16 only private use (test_hostile_content.py
# checks this against the running unicodedata), so the fold covers the whole range 0..0x10FFFF.
_ASSIGNED_PLANES = (range(0x80, 0x40000), range(0xE0000, 0xF0000))


def _confusable_letters() -> dict[str, str]:
    """Each character Unicode's confusables (TR39 ``confusables.txt``, as the ``confusable_homoglyphs`` package
    ships it) lists as a look-alike of an ASCII letter, mapped to that letter. Single characters only: a
    look-alike of a sequence ("rn" for "m") cannot keep the fold one-to-one."""
    data = json.loads(resources.files("confusable_homoglyphs").joinpath("confusables.json").read_bytes())
    letters: dict[str, str] = {}
    for letter in sorted(string.ascii_letters):  # a fixed order: the mapping is the same on every start
        for entry in data.get(letter, ()):
            char = entry["c"]
            if len(char) == 1 and not char.isascii():
                letters.setdefault(char, letter)
    return letters


@functools.cache
def _table() -> dict[int, str]:
    """The fold as a ``str.translate`` table, over every code point (built on first use, once: about 0.2 s
    on a 2-core machine, 4,300 entries; ``warm_up`` builds it off the request path)."""
    table: dict[int, str] = {}
    confusable = _confusable_letters()
    for plane in _ASSIGNED_PLANES:
        for code in plane:
            char = chr(code)
            category = unicodedata.category(char)
            if category in ("Cn", "Co", "Cs"):
                continue
            if category in ("Cf", "Mn", "Me"):  # format characters and combining marks: invisible in a name
                table[code] = IGNORED
                continue
            if category == "Zs":
                table[code] = " "
                continue
            # The compatibility decomposition's base: full-width, small, mathematical and accented forms.
            decomposed = unicodedata.normalize("NFKD", char) if unicodedata.decomposition(char) else char
            base = "".join(c for c in decomposed if not unicodedata.combining(c))
            if len(base) == 1 and base in _ASCII_KEPT:
                table[code] = base
            elif char in confusable:
                table[code] = confusable[char]
    for char in _INVISIBLE:
        table[ord(char)] = IGNORED
    for char, ascii_char in _LOOKALIKES.items():
        table[ord(char)] = ascii_char
    return table


def warm_up() -> None:
    """Build the fold's table now (at startup, in a worker thread) rather than on the first non-ASCII text."""
    _table()


def fold(text: str) -> str:
    """``text`` as read for detection: one character for each of ``text``'s (so positions carry over),
    invisible ones as ``IGNORED``, look-alikes as the ASCII character they pass for."""
    return text if text.isascii() else text.translate(_table())


def fold_words(text: str) -> str:
    """``fold`` without the invisible characters: what a sentence says, for a pattern over words."""
    return fold(text).replace(IGNORED, "")


# --- forged markers ----------------------------------------------------------------------------------------

# The proxy's own tags: the wrappers the chat model sees, and those the summary model's input is framed in.
TAG_NAMES = (
    "summary",
    "recalled_history",
    "material",
    "document",
    "previous_notes",
    "conversation",
    "notes",
    "standing_instructions",
)
_GAP = rf"[\s{IGNORED}]*"


def _spelled(name: str) -> str:
    """``name`` as a pattern that allows invisible characters between its letters, and any run of spaces,
    ``_`` or ``-`` where it has a ``_``. No two adjacent parts can match the same character (nor can the
    last letter's surroundings), which keeps every use linear."""
    parts: list[str] = []
    for index, char in enumerate(name):
        if char == "_":
            parts.append(rf"[\s{IGNORED}_-]*")
            continue
        parts.append(re.escape(char))
        if index + 1 < len(name) and name[index + 1] != "_":
            parts.append(f"{IGNORED}*")
    return "".join(parts)


# "<", then an optional "/", then a tag name that is not the start of a longer name (<summary_table>).
_TAG = re.compile(rf"<(?={_GAP}(?:/{_GAP})?(?:{'|'.join(_spelled(n) for n in TAG_NAMES)})(?!{IGNORED}*[\w.:-]))", re.I)
# "[msg_12 |" (an auto-recall excerpt's label), "[2024-05-01T10:00:00Z |" (a transcript header) and
# "[2024-05-01T10:00:00Z to 2024-05-02T09:00:00Z |" (a child summary's, in a condensed pass's input).
_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
_LABEL = re.compile(
    rf"\[(?={_GAP}(?:{_spelled('msg_')}\d+(?:{IGNORED}+\d+)*{_GAP}\|"
    rf"|{_TIME}(?:[ \t]+to[ \t]+{_TIME})?{_GAP}\|))",
    re.I,
)
TAG_ESCAPE = "&lt;"
LABEL_ESCAPE = "&#91;"


def defang_markers(text: str) -> str:
    """``text`` with every forged tag of the proxy's and every forged excerpt label or transcript header
    made inert, however it is disguised (see ``fold``)."""
    folded = fold(text)
    found = [(m.start(), TAG_ESCAPE) for m in _TAG.finditer(folded)]
    found += [(m.start(), LABEL_ESCAPE) for m in _LABEL.finditer(folded)]
    if not found:
        return text
    out: list[str] = []
    position = 0
    for start, escape in sorted(found):
        out += [text[position:start], escape]
        position = start + 1
    out.append(text[position:])
    return "".join(out)


# --- instruction overrides ---------------------------------------------------------------------------------

# A summary must keep what the user asked for ("From now on answer in French", "You must use metric units",
# "act as a reviewer"): those are facts the next turns depend on, so the fallback's orders-in-general
# pattern would delete exactly what a summary is for. What is removed here is text that tries to take over
# whoever reads it, as a prompt injection in the transcript might get the summary model to copy or write:
# overriding earlier instructions, a new identity, announced new instructions or system prompt, role play.
# Mentions that give no order ("we designed the system prompt of the support bot") are kept.
INSTRUCTION_OVERRIDE = re.compile(
    r"\b(ignore|disregard|forget|override)\b[^.!?\n]{0,40}?\b(previous|prior|above|earlier|preceding|original|your)\b"
    r"[^.!?\n]{0,40}?\b(instructions?|prompts?|rules|guidelines|directions)\b"
    r"|\b(ignore|disregard|forget|override)\s+(all|any)\s+(instructions|prompts|rules|guidelines)\b"
    r"|\b(ignore|disregard|forget)\s+(the|everything|anything|all)(\s+of\s+the)?\s+above\b"
    r"|\byou are now\b"
    r"|\bnew instructions\s*:"
    r"|\bsystem prompt\s*:"
    r"|\b(new|updated|real|actual|true|reveal|print|repeat|replace|override|ignore)\b[^.!?\n]{0,20}?\bsystem prompt"
    r"|\bpretend (to be|you are|that you)\b",
    re.I,
)
REMOVED_MARKER = "[instruction-like text removed]"
# A sentence: up to a ".", "!" or "?" followed by whitespace, a line break, or the end. One character of
# look-ahead and a lazy scan keep this linear on hostile input (long runs of "!!!" or no punctuation at all).
SENTENCE = re.compile(r"[^\n]*?(?:[.!?](?=\s)|\n|\Z)")
LIST_PREFIX = re.compile(r"[ \t]*(?:[-*\u2022][ \t]+)?")


def is_instruction_override(sentence: str) -> bool:
    """Whether ``sentence`` tries to override its reader's instructions, however its letters are disguised."""
    return INSTRUCTION_OVERRIDE.search(fold_words(sentence)) is not None


def remove_instruction_overrides(text: str) -> str:
    """``text`` with each sentence that tries to override the reader's instructions replaced by a marker,
    the rest (line breaks and list bullets included) as it was."""

    def scrub(match: re.Match[str]) -> str:
        sentence = match.group(0)
        if not is_instruction_override(sentence):
            return sentence
        prefix = LIST_PREFIX.match(sentence)
        lead = prefix.group(0) if prefix else ""
        return lead + REMOVED_MARKER + ("\n" if sentence.endswith("\n") else "")

    return SENTENCE.sub(scrub, text)


# --- the neutraliser ---------------------------------------------------------------------------------------


def neutralise(text: str) -> str:
    """``text`` made fit to sit inside a block the proxy wraps around untrusted content: instruction overrides
    removed, forged tags and labels made inert."""
    return defang_markers(remove_instruction_overrides(text))


@functools.lru_cache(maxsize=1024)
def neutralise_cached(text: str) -> str:
    """``neutralise`` for texts rendered again on every request (stored summaries)."""
    return neutralise(text)
