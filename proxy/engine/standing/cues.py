"""Broad cues of a standing instruction, for phrasings no concept of the lexicon covers (``standing.slots``).

Users set rules, limits, preferences, task state and decisions in many sentence shapes; what marks them is
the shape, not the topic:

* **labels**: "Hard requirement, …", "Ground rule: …", "Final word on the demo: …", "Change of plan: …",
  "Next task: …", "What's left is …", "Plan for the refactor: …";
* **orders**: an imperative with a habit ("Run the linter before *every* commit") or a contrast ("show
  amounts in euros, *not* dollars"), "nobody pushes …", "nothing under vendor/ gets …", "no direct pushes …",
  an obligation of a generic subject ("commit messages should …", "*every* migration needs …"), a request
  without a verb ("Commit messages in English, please");
* **preferences**: "I like short bullet points" (a bare object, not "I'd like *the* report"), "when you
  mention times, use …", "tables work better for me";
* **decisions**: settled / decided / agreed, a date booked or moved ("slipped to 21 March"), something kept
  until a date, a product something will run on, "let's lower the retries: three attempts", "I've set …";
* **limits**: a quantity (size, duration, count, money) with a word of limit ("only have 4 GB", "the memory
  limit is eight gigabytes", "caps us at 10,000 calls").

A one-off request ("Run the tests again", "Show me the diff") has none of these marks and sets nothing. The
slot of what they find is its topic (``proxy.engine.standing.topics.topic``), so that an update in other words finds
it; the value is typed where it can be (a date, a product, a quantity), the polarity for an order.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from proxy.engine.standing.lexicon import (
    COUNT_UNIT,
    DATE,
    DURATION,
    MONEY,
    PAST,
    SIZE,
    STILL,
    STOPWORDS,
    Found,
    content_words,
    topic,
)

_PRESENTATION = re.compile(
    r"\b(?:answers?|repl(?:y|ies)|responses?|summar(?:y|ies)|reports?|estimates?|explanations?|dates?|times?"
    r"|amounts?|prices?|figures?|numbers?|units?|durations?|format|style|tone|spelling|language|lists?|tables?"
    r"|paragraphs?|prose|bullets?|me)\b",
    re.I,
)
_NEGATION = re.compile(r"\b(?:never|don't|do not|no|not|nobody|no one|nothing|mustn't|can't|cannot)\b", re.I)


def _polarity(text: str) -> str:
    return "never" if _NEGATION.search(text) else "always"


def _order(kind: str, text: str) -> Found:
    return kind, content_words(text, "please every each whenever"), _polarity(text)


# --- typed values ------------------------------------------------------------------------------------------

_IDENT = re.compile(r"(?<![\w/.-])(?=[\w./-]*[\d_/])[A-Za-z][\w.-]*(?:/[\w.-]+)+|\b[A-Za-z][\w-]*\d[\w.-]*\b")
_PROPER = re.compile(r"(?<=[\s,:;(])(?!I\b|I'|(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\b)"
                     r"[A-Z][\w.+#-]*[A-Za-z0-9](?:\s+[A-Z][a-z]+)?")  # fmt: skip


def typed_value(text: str, start: int = 0) -> str | None:
    """The first value in ``text`` from ``start`` that has a type an update can share: a date, money, a
    quantity, an identifier, a name written with a capital inside the sentence."""
    for pattern in (DATE, MONEY, SIZE, DURATION, COUNT_UNIT, _IDENT, _PROPER):
        if match := pattern.search(text, start):
            return match.group(0).strip()
    return None


def _typed(kind: str, concept: str, sentence: str, start: int = 0) -> Found | None:
    value = typed_value(sentence, start)
    return (kind, f"{concept} {topic(sentence, value)}".strip(), value) if value else None


# --- labels ------------------------------------------------------------------------------------------------

_LABEL = re.compile(
    r"^(?:(?:one|a|our|the|hard|ground|golden|house|firm|strict|new)\s+){0,3}"
    r"(?P<rule>rules?|requirements?|polic(?:y|ies)|constraints?)"
    r"(?:\s+(?:for|on|about|before)\s+[^:,]{1,40}?)?\s*(?:is that\s+|[:,-]\s*)(?P<rest>.{3,})"
    r"|^(?P<decision>final word|change of plans?|decision|decided|agreed|verdict)"
    r"(?:\s+(?:for|on|about)\s+[^:,]{1,40}?)?\s*[:,-]\s*(?P<drest>.{3,})"
    r"|^(?:(?:the|my|our|your)\s+)?(?:(?:current|next|new|main)\s+)?(?P<task>task|next up|next step)"
    r"(?:\s+for\s+(?:today|now|this week|the day))?\s*(?:is\s+|:\s*)(?P<trest>.{3,})"
    r"|^(?:what(?:'s| is) left|what remains|all that(?:'s| is) left)\s+(?:now\s+)?(?:is\s+|:\s*)(?P<lrest>.{3,})"
    r"|^(?:(?:the|our)\s+)?plan(?P<plan>\s+for\s+[^:,]{1,40}?)?\s*(?:is\s+to\s+|:\s*)(?P<prest>.{3,})"
    r"|^(?:fact|facts|fyi|for the record|context|background|keep in mind|remember|note|n\.b\.?)\s*[:-]\s*"
    r"(?P<frest>.{3,})",
    re.I,
)


def labelled(text: str, classify: Callable[[str], Found | None]) -> Found | None:
    """What a label announces: the rule, requirement, decision, task or plan after it."""
    label = _LABEL.match(text)
    if not label:
        return None
    if rest := label.group("rest"):
        found = classify(rest)
        return found if found and found[0] in ("rule", "constraint") else _order("rule", rest)
    if rest := label.group("drest"):
        found = _typed("decision", "decision", text, label.start("drest"))
        return found or ("decision", content_words(rest), rest.strip(" ."))
    if rest := label.group("trest") or label.group("lrest"):
        return "goal", "task", rest.strip(" .")
    if rest := label.group("frest"):  # "FACT: the primary region is eu-north-3": what holds, said as such
        found = classify(rest)
        # its topic words are the slot (no "fact ~" key: two facts replace each other only by ``same_topic``, so
        # the staging database's fact does not replace the production database's)
        value = typed_value(rest) or ""
        return found or ("name", f"fact {topic(rest, value)}".strip(), value or rest.strip(" ."))
    rest = label.group("prest")
    return "goal", f"plan {topic(label.group('plan') or '')}".strip(), rest.strip(" .")


# --- limits ------------------------------------------------------------------------------------------------

_LIMIT_WORD = re.compile(
    r"\b(?:only|upgraded to|raised to|lowered to|limit|limited|cap|caps|capped|allowance|allows?|max(?:imum)?"
    r"|minimum|at most|at least|must|has to|have to|needs? to|can't be|cannot be|no (?:more|bigger|larger|longer)"
    r" than|bigger than|larger than|within)\b",
    re.I,
)


def limit(text: str) -> Found | None:
    """A quantity with a word of limit: "only have 4 GB of memory", "the memory limit is eight gigabytes"."""
    quantity = SIZE.search(text) or DURATION.search(text) or COUNT_UNIT.search(text)
    if not quantity or not _LIMIT_WORD.search(text) or "default" in text.lower():
        return None
    if PAST.search(text) and not STILL.search(text):
        return None
    return "constraint", f"limit {topic(text, quantity.group(0))}".strip(), quantity.group(0)


# --- orders ------------------------------------------------------------------------------------------------

_HABIT = re.compile(  # "for every request that failed" is one set of things, "before every commit" a habit
    r"(?<!for )\b(?:every|each)\b(?!(?:\s+[\w-]+){1,2}\s+(?:that|which|you|we|i|they)\b)"
    r"|\b(?:always|whenever|at all times|from now on|going forward|in (?:the )?future|anymore)\b"
    r"|\b(?:throughout|everywhere|anywhere|at all times)\b"
    r"|\b(?:in|on|for|to) (?:anything|everything)\b|\b(?:before|when|after|to|on|in|from)\s+(?:\w+ing\s+)?any\b",
    re.I,
)
_CONTRAST = re.compile(r",\s*not\s+\w|\brather than\b|\binstead of\b", re.I)
_IMPERATIVE = re.compile(r"^(?:please\s+)?([a-z]{2,})\b(?!')", re.I)
_NOBODY = re.compile(
    r"(?:^|[,:;]\s*)(?:nobody|no one|no-one)\s+(?!knows|cares|thinks|said|asked|wants|likes|needs)[a-z]+s\b"
    r"|(?:^|[,:;]\s*)nothing\s+(?:(?:under|in|inside|from)\s+\S+\s+)?(?:gets|goes|ships|merges|lands|leaves"
    r"|may|must|should)\b",
    re.I,
)
_NO_NOUN = re.compile(r"(?:^|[:;]\s*)no\s+(?:new\s+|direct\s+|more\s+)?[a-z]{3,}s\b(?!\s+(?:is|are|was)\b)", re.I)
_GENERIC_SUBJECT = re.compile(
    r"^(?:(?:every|each|all|any)\s+[\w'/-]+(?:\s+[\w'/-]+){0,5}?\s+(?:needs?|requires?|gets?|goes|must|should"
    r"|has to)\b"
    r"|(?:you|everyone|everybody|(?:[\w'/-]+\s+){0,3}(?!this\b|its\b|his\b|is\b|was\b|us\b)[\w'/-]*[^\Ws]s)\s+"
    r"(?:should|has to|have to|needs? to)\s+(?!be\b|have\b|been\b)\w)",
    re.I,
)
_PLEASE = re.compile(r"^(?P<what>[^,]{3,80}?),?\s+please\b(?:[.!]*$|,)", re.I)
_DETERMINER = frozenset(
    ("the", "a", "an", "this", "that", "it", "them", "me", "my", "your", "our", "his", "her", "its", "these", "those")
)


def _imperative(text: str) -> bool:
    verb = _IMPERATIVE.match(text)
    if not verb:
        return False
    word = verb.group(1).lower()
    return (word not in STOPWORDS and not word.endswith(("s", "ed", "ing", "ly"))) or word.endswith("ss")


def order(text: str) -> Found | None:
    """An order that holds from now on, by its shape."""
    if _NOBODY.search(text) or _NO_NOUN.search(text):
        return "rule", content_words(text, "nobody one nothing gets goes"), "never"
    if _GENERIC_SUBJECT.match(text):
        return _order("rule", text)
    if (
        _imperative(text)
        and (_HABIT.search(text) or _CONTRAST.search(text))
        and not (PAST.search(text) and not STILL.search(text))
    ):
        return _order("preference" if _PRESENTATION.search(text) else "rule", text)
    if (please := _PLEASE.match(text)) and not _imperative_object(please.group("what")):
        what = please.group("what")
        if _PRESENTATION.search(what):
            return "preference", f"prefer {content_words(what)}", what
        return _order("rule", what)
    return None


def _imperative_object(what: str) -> bool:
    """ "Run the tests again": a verb and its object, a one-off request; "Commit messages in English": none."""
    words = what.lower().split()
    return len(words) < 2 or words[1] in _DETERMINER or words[-1] in ("again", "now", "too")


# --- preferences -------------------------------------------------------------------------------------------

_WHEN_YOU = re.compile(
    r"^when(?:ever)?\s+you\s+(?P<when>[^,]{3,60}?),?\s+(?P<then>(?:i|use|give|show|write|keep|put|make|say|quote)\b.{3,})",
    re.I,
)
_LIKE = re.compile(
    r"\bi(?:\s+(?:really\s+|much\s+)?(?:like|love|want|prefer|would like)|'d\s+(?:like|prefer|rather have))\s+"
    r"(?!(?:the|a|an|to|your|my|this|that|it|them|him|her|us|our|their|you|me|some|more|his|its|if|when|how)\b)"
    r"(?P<what>[a-z][^.;!?]{2,80})",
    re.I,
)
_BETTER_FOR_ME = re.compile(
    r"^(?P<what>[^,]{3,40}?)\s+(?:works?|is|are)\s+(?:much\s+|a lot\s+)?(?:better|easier|nicer)\s+for me\b", re.I
)


def preference(text: str) -> Found | None:
    if when := _WHEN_YOU.match(text):
        return "preference", f"prefer {content_words(when.group('when'))}".strip(), when.group("then").strip(" .")
    if like := _LIKE.search(text):
        return "preference", f"prefer {topic(text, like.group('what'))}".strip(), like.group("what").strip()
    if better := _BETTER_FOR_ME.match(text):
        return "preference", f"prefer {topic(text)}", better.group("what")
    return None


# --- decisions ---------------------------------------------------------------------------------------------

_SETTLED = re.compile(
    r"(?:^|\b(?:we|they|i|everyone|the team)\s+(?!(?:never|not|haven't|didn't|hadn't)\b)(?:[a-z']+\s+)?)"
    r"(?:settled|decided|agreed)\b"
    r"|\bit(?:'s| is| has been)\s+(?:settled|decided|agreed)\b",
    re.I,
)
_MOVED = re.compile(
    r"\b(?:slipped|moved|pushed(?: back| out)?|postponed|rescheduled|delayed|brought forward|shifted)\b"
    r"|\b(?:booked|scheduled|planned)\s+(?:\w+\s+){0,3}?(?:to|for|on|until)\b",
    re.I,
)
_PAST_TIME = re.compile(r"\b(?:yesterday|last (?:week|time|month|year|night|run|sprint)|ago|back then)\b", re.I)
_UNTIL = re.compile(r"\b(?:keep|keeps|stay|stays|remain|remains|run|runs|alive|around)\b[^.;]{0,60}?\buntil\s", re.I)
_RUNS_ON = re.compile(
    r"\b(?:will|'ll|is going to|are going to)\s+(?:use|run on|be built (?:with|on)|be hosted on|move to|switch to"
    r"|go with|be)\s+|\b(?:moves|switches|migrates|goes)\s+to\s+",
    re.I,
)
_LETS = re.compile(r"^let(?:'s| us)\s+\w+|\bi(?:'ve| have)\s+(?:set|configured|changed|lowered|raised)\b", re.I)


def decision(text: str) -> Found | None:
    """A choice made: settled, booked, moved, kept until, run on; the value it set, typed."""
    if settled := _SETTLED.search(text):
        rest = text[settled.end() :]
        return _typed("decision", "decision", text, settled.end()) or (
            "decision",
            content_words(rest),
            rest.strip(" ,."),
        )
    if _PAST_TIME.search(text):
        return None  # "the build moved to GitHub Actions last year": history, not a choice in force
    if (moved := _MOVED.search(text)) and (found := _typed("decision", "decision", text, moved.end())):
        return found
    if PAST.search(text) and not STILL.search(text):
        return None
    for cue in (_UNTIL, _RUNS_ON, _LETS):
        if match := cue.search(text):
            found = _typed("decision", "decision", text, match.end() if cue is not _LETS else 0)
            if found:
                return found
    return None


BROAD: tuple[Callable[[str], Found | None], ...] = (order, preference, decision)
