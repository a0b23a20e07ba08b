"""What one sentence sets for the rest of a conversation: its kind, its slot and its value (``standing.ledger``).

A standing instruction is kept as (kind, slot, value): the slot says what it is about, so that a later sentence
about the same thing replaces it even in other words (``proxy.engine.standing.topics``), and the value is the part such
an update changes. Three routes lead to a slot, tried in this order:

* **The lexicon** (``lexicon.CONCEPTS``): things users restate in many words (a budget, a deadline,
  units, the answer's language, length or format, a pinned version, the user's name, what a thing is called,
  who the contact is, who owns what) map to one concept, plus the qualifier that keeps two of them apart ("the
  travel budget" is not "the marketing budget") and the topic words an update in other words can share.
* **The cues** (``_CUES``): sentences that set a limit with a quantity (constraint), say *always/never/must*
  or lift such an order (rule), state a goal or the task's state, a preference or a decision. Their slot is
  their content words (``lexicon.content_words``: stopwords, values and cue words removed, stemmed, sorted), so
  that restating the same thing with another value ("you may push to main now") lands on the same slot.
* **The shapes** (``proxy.engine.standing.cues``): labels, imperatives with a habit, obligations of a generic subject,
  bare preferences, decisions booked, moved or kept until a date: the many phrasings no concept names.

Most sentences match nothing: questions, thanks, discussion, one-off requests and numbers in passing are no
instructions, and each item costs room in every request. Everything here runs on one sentence of at most ~300
characters, with patterns whose repetitions are bounded or separated by fixed characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from proxy.engine.standing.cues import BROAD, labelled, limit
from proxy.engine.standing.lexicon import (
    COMPARISON,
    CONCEPTS,
    NORMATIVE,
    NOT_QUALIFIER,
    PAST,
    Found,
    content_words,
    slot,
    stem,
    topic,
    with_topic,
)
from proxy.engine.standing.terse import labelled_kind, terse
from proxy.engine.standing.values import digits
from proxy.store.records import LEDGER_KINDS

# What may come before the sentence proper: fillers ("ok, so"), and labels that announce it ("quick update:").
_LEAD = re.compile(
    r"(?:(?:ok(?:ay)?|so|and|but|also|actually|please|btw|fyi|ps|heads up|one more thing|just so you know"
    r"|for the record|good news|by the way|oh|before i forget|separately|in other news|[\w-]+-wise)\b[\s,!.-]*"
    r"|(?:(?:quick|small|one more|another|an?)\s+)?(?:update|note|reminder|correction|important|change of plan)"
    r"\s*[:!-]+\s*)*",
    re.I,
)

# --- the cues ----------------------------------------------------------------------------------------------

_CLAUSE = r"^(?:[^,:;]{0,40}[,:;]\s*)?(?:(?:you|we|everyone|the team)\s+)?"  # "When you commit, always …"
_NOT_AN_ORDER = (
    r"(?!(?:worry|mind|bother|hesitate|know|think|care|understand|the|a|an|this|that|so|such|been|got|had|did|if|when|once|because|after|again|one|\d"
    r"|was|were|saw|said|went|made|heard|knew|thought|found|came|seen|done|gone|known|taken|given"
    r"|(?!\w+eed\b)\w+ed)\b)"  # a past tense, not "exceed", "proceed", "need"
)
_RULE = re.compile(
    _CLAUSE
    + r"(?:(?P<pos>always|must(?! not| never)(?!\s+(?:be|have)\b)|make sure(?: to| that)?|ensure(?: that)?|be sure to"
    r"|(?:don't|do not) forget to|remember to|should always|need to always)"
    r"|only|(?P<neg>never|don't|do not|must not|must never|mustn't|may not|are not allowed to|should never|avoid"
    r"|stop))"
    rf"\s+{_NOT_AN_ORDER}[`'\"*]?\w"
    r"|^(?:[\w'-]+\s+){1,4}?(?:(?P<pos2>must(?! not| never)(?!\s+(?:be|have)\b)|should always|is always|are always)"
    r"|(?P<neg2>must not|must never|mustn't|should never|may never|can never|is never|are never))"
    rf"\s+{_NOT_AN_ORDER}[`'\"*]?\w"
    r"|\bfrom now on\b|\bgoing forward\b|\bunder no circumstances\b"
    # a habit stated as what holds: "I never book red-eye flights", "it always gets a changelog line"
    r"|^(?:[\w'-]+\s+){1,4}?(?:(?P<pos3>always)|(?P<neg3>never))\s+(?!(?:works?|worked|fails?|failed|breaks?|broke"
    r"|crash(?:es|ed)?|happens?|happened|seems?|seemed|knows?|knew|remembers?|learn|got|went|had|did|was|were|saw"
    r"|said|made|thought|came|took|gave|found|told|heard|left|felt|\w+ed)\b)[a-z]{3,}",
    re.I,
)
_NEGATIVE = re.compile(r"\b(?:never|don't|do not|must not|mustn't|may not|not allowed|avoid|stop|under no)\b", re.I)
_PERMIT = re.compile(
    _CLAUSE + r"(?:(?:may|can)\s+(?:now\s+)?(?!(?:want|need|have|find|be|see|notice|also|check|try|ask)\b)"
    r"(?=[^.!?]*\b(?:now|again|from now on|anymore|after all|going forward)\b)"
    r"|(?:are|'re)\s+(?:now\s+)?(?:allowed|free|permitted)\s+to\s|feel free to\s|go ahead and\s"
    r"|it(?:'s| is)\s+(?:now\s+)?(?:ok|okay|fine|allowed)\s+to\s)"
    r"|^\w+ing\b[^.!?]{0,60}?\s(?:is|are)\s+(?:now\s+)?(?:fine|ok|okay|allowed|permitted)\b",
    re.I,
)
_RELEASED = re.compile(
    _CLAUSE + r"(?:no longer (?:need|have) to|don't need to|do not need to|there's no need to)\s", re.I
)
_GOAL = re.compile(
    r"\b(?:the|our|my|main|primary|current|overall|end|final)\s+(?:([\w-]+)\s+)?(?:goal|aim|objective|mission"
    r"|priority|task|focus)\s+(?:for\s+[^,:.]{1,40}?\s+)?(?:right now\s+|for now\s+)?(?:is|remains)\s+(?:to\s+)?"
    r"([^.!?]{3,120})",
    re.I,
)
_GOAL_LABEL = re.compile(
    r"(?:(?:new|updated|current|main)\s+)?(?:(\w+)\s+)??(?:goal|objective|aim)\s*:\s*(.{3,120})", re.I
)
_STATUS = re.compile(
    r"\b(?:blocked on|blocked by|blocked until|waiting on|waiting for|stuck on|on hold until|paused until)\s+"
    r"([^.!?;,]{2,80})"
    r"|\b(no longer blocked|unblocked)\b",
    re.I,
)
_TASK = re.compile(
    r"\b(?:we(?:'re| are)|i(?:'m| am))\s+(?:currently\s+|now\s+|still\s+)?(?:trying to|working on|working towards"
    r"|aiming to|in the middle of)\s+([^.!?;,]{3,120})"
    r"|\b(?:we(?:'re| are)|i(?:'m| am))\s+(?:currently\s+|now\s+|still\s+)?((?:migrating|moving|porting|rewriting"
    r"|refactoring|upgrading|switching)\s[^.!?;,]{3,120})",
    re.I,
)
_LIMIT_CONTEXT = re.compile(
    r"\b(?:must|should|need to|needs to|has to|have to|keep|stay|stays|remain|cap|capped|limit|limited|at most"
    r"|no more than|not exceed|never exceed|sla|slo|required|requirement|target|allowed|p\d\d|latency|uptime"
    r"|error rate|the (?:minimum|maximum)|never (?:more|less|over|under|above|below|exceed))\b"
    r"|^(?:max|maximum|min|minimum|at most|at least|no more than|up to)\b",
    re.I,
)
_PREFER = re.compile(
    r"\b(?:i(?:'d| would)?\s+(?:really\s+)?(?:prefer|rather(?!\s+(?:be|not|we|you|i|have|do|go|get|stay|keep)\b))"
    r"|i (?:like|love|hate) it when|my preference is)\s+"
    r"(?:to\s+|that\s+)?([^.!?;,]{2,80})",
    re.I,
)
_DECIDE = re.compile(
    r"\b(?:(?:we|i)(?:'ve| have)?\s+decided|it(?:'s| is| has been)\s+decided|decision(?:\s+is)?\s*:|decided\s*:"
    r"|agreed\s*:|we(?:'ve| have)?\s+agreed|let(?:'s| us)\s+(?=go with|use|stick with|switch to|adopt)"
    r"|we(?:'ll| will)\s+(?=go with|use|stick with|switch to|adopt)|we(?:'re| are)\s+(?=going with|going to use"
    r"|switching to)|settled on|we (?:chose|picked|opted for|selected))\s*(?:to\s+|on\s+|that\s+)?",
    re.I,
)
_CHOICE = re.compile(
    r"(?:use|using|go with|going with|going to use|stick with|switch to|switching to|adopt|chose|picked|opted for"
    r"|selected|settled on)\s+",
    re.I,
)
_REASON = re.compile(r"\s+(?:instead|because|since|rather|from now on|going forward|now)\b.*|[,;.!?].*", re.I)
_PURPOSE = re.compile(r"\s+(?:for|as)\s+(?:the\s+|our\s+)?", re.I)
_CADENCE = re.compile(
    r"\b(?:daily|weekly|bi-?weekly|fortnightly|monthly|quarterly|nightly|every (?:\w+ )?(?:days?|weeks?|months?"
    r"|sprints?))\b",
    re.I,
)
_DECISION_WORDS = "decided decision agreed chose picked opted selected settled go with use using stick switch adopt"


def _rule(text: str) -> Found | None:
    if (permit := _PERMIT.search(text)) or _RELEASED.search(text):
        value = "allowed" if permit else "not required"
        return "rule", content_words(text, "may can allowed free permitted feel go ahead fine need"), value
    if match := _RULE.search(text):
        positive = match.group("pos") or match.group("pos2") or match.group("pos3")
        negative = match.group("neg") or match.group("neg2") or match.group("neg3")
        negative = negative or (not positive and _NEGATIVE.search(text))
        value = "never" if negative else "always"
        return "rule", content_words(text, "forget remember sure going forward circumstances"), value
    return None


def _goal(text: str) -> Found | None:
    if status := _STATUS.search(text):
        value = (status.group(1) or "unblocked").strip()
        return "goal", with_topic("status", text, value), value
    if goal := _GOAL.search(text) or _GOAL_LABEL.match(text):
        qualifier = (goal.group(1) or "").lower()
        which = "" if qualifier in NOT_QUALIFIER else stem(qualifier)
        return "goal", slot("goal", which), goal.group(2).strip(" .!")
    if task := _TASK.search(text):
        doing = (task.group(1) or task.group(2)).strip()
        return "goal", "task " + content_words(doing), doing
    return None


def _limit(text: str) -> Found | None:
    comparison = COMPARISON.search(text)
    if not comparison or not _LIMIT_CONTEXT.search(text) or (PAST.search(text) and not NORMATIVE.search(text)):
        return None
    value = comparison.group(0).strip()  # its unit stays in the slot: "at most 5 retries" limits retries
    # "limit databas@stag": the staging database's limit is not the legacy database's (``topics.same_topic``)
    return "constraint", slot("limit", topic(text.replace(value, " "), "")), value


def _preference(text: str) -> Found | None:
    if prefer := _PREFER.search(text):
        topic = content_words(text, "prefer rather like love hate preference")
        return "preference", slot("prefer", topic), prefer.group(1).strip()
    return None


def _decision(text: str) -> Found | None:
    decide = _DECIDE.search(text)
    if not decide:
        return None
    rest = text[decide.end() :]
    if cadence := _CADENCE.search(rest):
        topic = content_words(rest, cadence.group(0) + " " + _DECISION_WORDS)
        return "decision", slot("decision", topic), cadence.group(0)
    choice = _CHOICE.match(rest)
    what = _REASON.sub("", rest[choice.end() :] if choice else rest).strip()
    if not what:
        return None
    purpose = _PURPOSE.search(what)
    if purpose:
        return "decision", slot("use", content_words(what[purpose.end() :])), what[: purpose.start()]
    return "decision", slot("use" if choice else "decision", content_words(what, _DECISION_WORDS)), what


_EMPHASIS = re.compile(r"\*\*|__|(?<!\w)[*_](?=\w)|(?<=\w)[*_](?!\w)")
_CUES: tuple[Callable[[str], Found | None], ...] = (_limit, _rule, _goal, _preference, _decision)
_QUESTION = re.compile(
    r"^(?:(?:what|why|how|when|where|who|which|whose)\s+(?:is|are|do|does|did|should|can|could|would|will|was"
    r"|were|has|have|about)|can you|could you|would you|will you|do you|does|did|is it|are you|should we|shall we"
    r"|should i|can we|could we)\b",
    re.I,
)


def classify(sentence: str, kinds: Collection[str] = LEDGER_KINDS) -> Found | None:
    """(kind, slot, value) of what ``sentence`` sets for the rest of the conversation, of one of ``kinds`` (who
    said it decides what it may set); None for most sentences (questions, thanks, discussion, numbers in
    passing), and for those whose slot came out empty. A sentence after a lead-in ("Legal was very clear
    with us: customer data must stay …") is read again without it."""
    sentence = digits(_EMPHASIS.sub("", sentence))  # "**Never** commit secrets", "five hundred" as "500"
    lead = _LEAD.match(sentence)
    body = sentence[lead.end() if lead else 0 :].strip()
    if len(body) < 6 or body.endswith("?") or _QUESTION.match(body):
        return None
    found = _detect(body, kinds)
    if found is None and (colon := _LEAD_IN.match(body)):
        found = _detect(body[colon.end() :], kinds)
    return found


_LEAD_IN = re.compile(r"^[^:;]{3,60}[:;]\s+(?=\S)")


def _detect(body: str, kinds: Collection[str]) -> Found | None:
    def label(text: str) -> Found | None:
        return labelled(text, lambda rest: _detect(rest, kinds))

    for detect in (*CONCEPTS, _limit, limit, _rule, _goal, _preference, _decision, label, terse, *BROAD, labelled_kind):
        found = detect(body)
        if found and found[0] in kinds:
            return found if found[1].strip() and found[2].strip() else None
    return None
