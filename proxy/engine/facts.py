"""Facts the user stated, kept verbatim next to a model-written summary.

A small summary model (0.5B parameters) paraphrases, loops and drops details: the name of the user's sister,
the version they pinned, the file they asked about. So the facts are not left to the model. Each message is
split into sentences, and a sentence is kept verbatim when it carries a signal a later turn may depend on:
numbers and dates, proper names, identifiers, paths, URLs and code, decisions, and the user's preferences,
identity and standing instructions. Pleasantries, acknowledgements and bare questions carry none and are left
out; sentences that try to override the reader's instructions (``injection.INSTRUCTION_OVERRIDE``) are dropped.

Scoring is a plain sum: each kind of signal found in a sentence adds its weight from ``KIND_WEIGHTS`` (once per
kind), the sum is multiplied by the speaker's ``ROLE_WEIGHTS`` (what the user said outranks an assistant
restating it, tool output ranks lowest) and halved for a question. ``select_facts`` keeps the highest scores
that fit a token budget, in their original order, and ``render_facts`` appends them to the summary as a block
that ``parse_facts`` reads back when summaries are condensed. Everything here is deterministic, and every
pattern runs in linear time (bounded or non-overlapping repetitions; sentences are capped before scoring).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from proxy import tokens
from proxy.engine.injection import SENTENCE, is_instruction_override

FACTS_HEADER = "Facts stated (verbatim):"
FALLBACK_HEADER = "User messages (first sentences, verbatim):"
MAX_FACT_CHARS = 300
MAX_LOOP_WORDS = 16  # longest phrase clean_generation looks for when cutting a loop
ROLE_WEIGHTS = {"user": 1.0, "system": 0.8, "developer": 0.8, "assistant": 0.5, "tool": 0.3}
DEFAULT_ROLE_WEIGHT = 0.4
KIND_WEIGHTS = {
    "identifier": 3.0,  # snake_case, CamelCase, ABC-1234, hex ids, versions
    "location": 3.0,  # paths, URLs, emails
    "number": 2.0,
    "date": 2.0,
    "name": 2.0,  # capitalised words past the start of the sentence, acronyms
    "code": 2.0,  # `backticks`, calls(), dotted.names
    "preference": 2.0,  # the user's preferences, identity and standing instructions
    "decision": 1.5,
    "intent": 1.0,  # a generic "will"
}
_APOS = "['’]"
_CAP = re.compile(r"\b[A-Z][\w'’-]*")
_NOT_NAMES = {"I", "I'm", "I’m", "I'll", "I’ll", "I've", "I’ve", "I'd", "I’d", "OK"}
_SIGNALS: dict[str, re.Pattern[str]] = {
    "identifier": re.compile(
        r"\b[A-Za-z0-9]+_\w|\b[A-Z][a-z]+[A-Z]|\b[a-z]+[A-Z]|\b[A-Z][A-Z0-9]+-\d|\b[A-Z]{2,}\d|\bv\d+\.\d"
        r"|\b(?=[a-fA-F]{0,64}\d)(?=\d{0,64}[a-fA-F])[0-9a-fA-F]{6,}\b"
    ),
    "location": re.compile(
        r"(?:^|(?<=[\s(\"'`]))(?:~|\.\.?)?/[\w.-]|\b[\w-]+/[\w-]+\.[A-Za-z]|\b[\w-]+/[\w-]+/|\b[A-Za-z]:\\\w"
        r"|\b(?:https?|ftp)://\w|\bwww\.\w|\w@[\w-]+\.[A-Za-z]"
    ),
    "number": re.compile(r"\d"),
    "date": re.compile(
        r"\b(?:(?:mon|tues|wednes|thurs|fri|satur|sun)days?|today|tomorrow|yesterday|tonight|next (?:week|month|year)"
        r"|january|february|march|april|june|july|august|september|october|november|december"
        r"|\d{4}-\d\d-\d\d|\d{1,2}:\d\d|\d{1,2} ?[ap]\.?m\.?|\d{1,2}(?:st|nd|rd|th))\b",
        re.I,
    ),
    "code": re.compile(
        r"`[^`\n]{1,200}`|\b[A-Za-z_]\w*\(|\b[A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]|\b[A-Za-z_]\w*\.[A-Za-z_]\w+"
    ),
    "preference": re.compile(
        rf"\b(?:I (?:really )?(?:prefer|like|love|hate|dislike|want|need|work|live)|prefers?|preference|allergic"
        rf"|I{_APOS}m (?:a|an|based|from|vegan|vegetarian)|I am (?:a|an|based|from|vegan|vegetarian)"
        rf"|my \w+(?: \w+)? (?:is|are|was)|my name|call me|always|never(?! mind)|from now on|instead of"
        rf"|(?:don{_APOS}t|do not) (?!know|think|care|worry|mind|understand)"
        rf"|please (?:use|avoid|answer|reply|write|keep))\b",
        re.I,
    ),
    "decision": re.compile(
        rf"\b(?:decided|decision|agreed|chose|chosen|settled on|go(?:ing)? with|we{_APOS}ll|we will|let{_APOS}s"
        rf"|let us|plan is|the plan|plan to|committed to|deadline)\b",
        re.I,
    ),
    "intent": re.compile(rf"\bwill\b|\w{_APOS}ll\b|\bgoing to\b", re.I),
}
_ACK = re.compile(
    r"(?:hi|hello|hey|thanks|thank you|thx|noted|sure|ok|okay|got it|great|cool|perfect|sounds good|understood"
    r"|alright|of course|no problem|absolutely|certainly|yes|yeah|yep|right|good (?:morning|afternoon|evening))"
    r"\b[\s,.!:;-]*",
    re.I,
)
_BULLET = re.compile(r"[ \t]*(?:[-*•>]|\d{1,3}[.)])[ \t]+")
_HEADING = re.compile(r"\s*#{1,6}\s|\s*\[[^\]\n|]{1,40}\|[^\]\n]{1,200}\]\s*$")
_FACT_LINE = re.compile(r"- ([A-Za-z][\w-]{0,31}): (\S.*)")
_ECHO = re.compile(r"\W{0,10}expand for details(?: about)?\W{0,10}(.*)", re.I)
_NOTHING = {"", "n/a", "none", "nothing", "naming what was left out", "what was left out", "topics", "..."}


@dataclass(frozen=True)
class Fact:
    text: str  # the verbatim sentence, whitespace collapsed, at most ~MAX_FACT_CHARS
    role: str  # "user" | "assistant" | "tool" ...
    score: float  # higher = more important
    position: int  # index of the message it came from (order of appearance)


def _clip(sentence: str) -> str:
    """Whitespace collapsed; a long sentence is cut at a word boundary and marked with "…"."""
    text = " ".join(sentence[: MAX_FACT_CHARS * 8].split())
    if len(text) <= MAX_FACT_CHARS:
        return text
    cut = text[: MAX_FACT_CHARS - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > MAX_FACT_CHARS // 2 else cut).rstrip() + "…"


def sentences(text: str) -> Iterator[str]:
    """Sentences of ``text``: split on lines, list bullets and ``injection.SENTENCE``; headings skipped."""
    for line in text.split("\n"):
        if not line.strip() or _HEADING.match(line):
            continue
        bullet = _BULLET.match(line)
        for match in SENTENCE.finditer(line[bullet.end() :] if bullet else line):
            sentence = _clip(match.group(0))
            if sentence:
                yield sentence


def score_sentence(text: str, role: str) -> float:
    """The weight of a sentence as a fact (see the module docstring); 0.0 when it states nothing."""
    ack = _ACK.match(text)
    rest = text[ack.end() :] if ack else text
    kinds = {kind for kind, pattern in _SIGNALS.items() if pattern.search(rest)}
    if any(m.start() > 0 and m.group(0) not in _NOT_NAMES for m in _CAP.finditer(rest)):
        kinds.add("name")
    total = sum(KIND_WEIGHTS[kind] for kind in kinds) * ROLE_WEIGHTS.get(role, DEFAULT_ROLE_WEIGHT)
    return total / 2 if text.endswith("?") else total


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def extract_facts(messages: Sequence[tuple[str, str]]) -> list[Fact]:
    """messages: (role, text) in conversation order. Returns fact-bearing sentences, deduplicated (case/space-
    insensitive), in order of appearance."""
    facts: list[Fact] = []
    seen: set[str] = set()
    for position, (role, text) in enumerate(messages):
        for sentence in sentences(text):
            key = _key(sentence)
            if key in seen or not any(c.isalpha() for c in sentence) or is_instruction_override(sentence):
                continue
            weight = score_sentence(sentence, role)
            if weight > 0:
                seen.add(key)
                facts.append(Fact(sentence, role, weight, position))
    return facts


def _line(fact: Fact) -> str:
    return f"- {fact.role}: {fact.text}"


def render_facts(facts: Sequence[Fact]) -> str:
    """'Facts stated (verbatim):\\n- user: <text>\\n- assistant: <text>' ...; '' when empty."""
    return "\n".join([FACTS_HEADER, *(_line(fact) for fact in facts)]) if facts else ""


def select_facts(facts: Sequence[Fact], max_tokens: int) -> list[Fact]:
    """Highest-scoring facts whose rendered block (header included) fits in max_tokens, in order of appearance."""
    budget = max_tokens - tokens.count_text(FACTS_HEADER)
    chosen: list[int] = []
    for index in sorted(range(len(facts)), key=lambda i: (-facts[i].score, i)):
        if budget < 4:  # no line fits in fewer tokens ("- user: x" plus the line break)
            break
        cost = tokens.count_text(_line(facts[index])) + 1
        if cost <= budget:
            chosen.append(index)
            budget -= cost
    kept = [facts[i] for i in sorted(chosen)]
    # Counting lines one by one can differ from counting the block by a token; drop the weakest until it fits.
    while kept and tokens.count_text(render_facts(kept)) > max_tokens:
        kept.remove(min(reversed(kept), key=lambda fact: fact.score))
    return kept


def _blocks(lines: Sequence[str]) -> list[tuple[int, int]]:
    """(first, end) line ranges of the fact blocks in ``lines``: the header and the fact lines that follow."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != FACTS_HEADER:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and _FACT_LINE.fullmatch(lines[end].rstrip()):
            end += 1
        spans.append((i, end))
        i = end
    return spans


def parse_facts(text: str) -> list[Fact]:
    """The facts of every fact block in ``text`` (a summary, or several concatenated), deduplicated, rescored,
    numbered by order of appearance. [] when there is no block."""
    lines = text.split("\n")
    facts: list[Fact] = []
    seen: set[str] = set()
    for first, end in _blocks(lines):
        for line in lines[first + 1 : end]:
            match = _FACT_LINE.fullmatch(line[: MAX_FACT_CHARS * 2].rstrip())
            if not match:
                continue
            role, fact = match.group(1), _clip(" ".join(match.group(2).split()))
            if _key(fact) in seen or is_instruction_override(fact):
                continue  # a block is data too: what reads as an order is dropped here as anywhere else
            seen.add(_key(fact))
            facts.append(Fact(fact, role, score_sentence(fact, role), len(facts)))
    return facts


def split_summary(text: str) -> tuple[str, str]:
    """(prose, fact_block) of a summary produced as prose + '\\n\\n' + render_facts(...); the last block counts."""
    lines = text.split("\n")
    spans = _blocks(lines)
    if not spans:
        return text.strip(), ""
    first, end = spans[-1]
    prose = "\n".join(lines[:first]).strip() + "\n\n" + "\n".join(lines[end:]).strip()
    return prose.strip(), "\n".join(line.rstrip() for line in lines[first:end])


def _cut_loops(line: str) -> str:
    """``line`` with each phrase of 3..MAX_LOOP_WORDS words said 3+ times in a row kept once."""
    words = line.split()
    keys = [word.strip(".,;:!?\"'").casefold() for word in words]
    out: list[str] = []
    i = 0
    while i < len(words):
        for n in range(3, min(MAX_LOOP_WORDS, (len(words) - i) // 3) + 1):
            if keys[i + n] != keys[i] or keys[i + 2 * n] != keys[i]:
                continue
            phrase, repeats = keys[i : i + n], 1
            while keys[i + repeats * n] == keys[i] and keys[i + repeats * n : i + (repeats + 1) * n] == phrase:
                repeats += 1
                if i + (repeats + 1) * n > len(words):
                    break
            if repeats >= 3:
                out.extend([*words[i : i + n - 1], words[i + repeats * n - 1]])  # the last one's punctuation
                i += repeats * n
                break
        else:
            out.append(words[i])
            i += 1
    return " ".join(out) if len(out) < len(words) else line


def _is_echo(line: str) -> bool:
    match = _ECHO.match(line.strip())
    return match is not None and match.group(1).strip(" .…*_'\"`:-[]<>()").casefold() in _NOTHING


def clean_generation(text: str) -> str:
    """What a small model wrote, with repeated lines dropped (the first kept; case and spacing ignored), phrase
    loops cut, runs of blank lines collapsed and a trailing instruction echo that names nothing dropped."""
    lines: list[str] = []
    seen: set[str] = set()
    for raw in text.split("\n"):
        line = _cut_loops(raw.rstrip())
        key = _key(line)
        if key in seen or (not key and (not lines or not lines[-1])):
            continue
        if key:
            seen.add(key)
        lines.append(line if key else "")
    while lines and (not lines[-1] or _is_echo(lines[-1])):
        lines.pop()
    return "\n".join(lines).strip()


def _first_sentence(text: str) -> str:
    for sentence in sentences(text):
        ack = _ACK.match(sentence)
        if any(c.isalnum() for c in sentence[ack.end() if ack else 0 :]) and not is_instruction_override(sentence):
            return sentence
    return ""


def fallback_from(messages: Sequence[tuple[str, str]], max_tokens: int, inherited: Sequence[Fact] = ()) -> str:
    """A deterministic summary when no model can write one: the facts of ``inherited`` (child summaries'
    blocks) and the fact-bearing sentences of the (role, text) ``messages`` within max_tokens, rendered with
    render_facts; if there are none, the first sentence of each user message. Never a truncation of the text,
    never headers or acknowledgements. The messages are structured pairs, not a rendering to re-parse, so
    content can forge neither a role nor a fact block."""
    seen = {_key(fact.text) for fact in inherited}
    found = [fact for fact in extract_facts(messages) if _key(fact.text) not in seen]
    facts = list(inherited) + [Fact(f.text, f.role, f.score, f.position + len(inherited)) for f in found]
    if chosen := select_facts(facts, max_tokens):
        return render_facts(chosen)
    out = FALLBACK_HEADER
    for role, body in messages:
        line = f"\n- {_first_sentence(body)}" if role in ("user", "text") else ""
        if len(line) > 3 and tokens.count_text(out + line) <= max_tokens:
            out += line
    return out if out != FALLBACK_HEADER else ""
