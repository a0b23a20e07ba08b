"""The shapes of terse chat: standing instructions said in a few words, often without a verb.

People who type fast set rules as fragments, and the sentence readers (``standing.slots``, ``standing.cues``)
look for verbs and cue words that a fragment does not have. Each shape here is a grammatical form, not a
topic, so it holds for whatever the fragment is about:

* **a refusal without a verb**: "no inline styles anywhere", "none at all in the changelog", "no 'we' in the
  abstract" (a determiner *no* opening the clause, not "no problem" or a bare "no, …" answer);
* **off limits**: "'synergy' is off limits too", "the billing module is not to be touched", "spot is a no-go";
* **an exclusive**: "us-east-2 only", "named exports only", "postgres only for persistence";
* **a quantity with a bound after it**: "two screenshots per ticket max", "12 slides tops", "90 dollars maximum";
* **a setting**: "Voice: dry and direct.", "Dates: ISO 8601 only", "screenshots: two per ticket max" (a short
  label and its value, never a mail header or a speaker's name);
* **an obligation of a named thing**: "Invoice numbers have to be zero-padded", "test functions should be snake_case
  everywhere", "every heading is sentence case wherever it appears";
* **a wish about what the speaker will not see**: "I don't want to see lorem ipsum anywhere";
* **the session's aim**: "today I want to get the onboarding flow merged", "goal for today: …";
* **who the speaker is**: "I'm Noor", "I am Tariq, …";
* **who does what**: "The approver for Acme is Lena Fischer", "the reviewer is Omar".

What a fragment refers to by "it" or "that" ("don't merge it", "make it shorter") is a one-off about the thing at
hand, never a standing rule (``one_off``). Every pattern runs on one clause of at most ~300 characters with
bounded repetitions.
"""

from __future__ import annotations

import re

from proxy.engine.standing.cues import typed_value
from proxy.engine.standing.lexicon import Found, content_words, stem, topic, with_topic

_LEAD = r"^(?:(?:and|but|also|so|plus|oh|ok(?:ay)?|then|btw|ps)\b[\s,]*)*"
_NO_BUT = (
    r"(?!(?:problem|problems|worries|worry|idea|way|need|rush|thanks|doubt|one|longer|more than|less than|later"
    r"|sooner|matter|clue|luck|change|changes|difference|errors?|issues?|news|reason|wonder|kidding|offen[cs]e"
    r"|pressure|biggie|big deal|stress|hurry|comment|response|reply|answer)\b)"
)
_REFUSAL = re.compile(
    _LEAD + r"(?:no|none)\b(?![,.!?:;\s]*$)(?!\s*[,.!?:;—–-])\s+" + _NO_BUT + r"(?P<what>[^.;!?]{2,90})$", re.I
)
_OFF_LIMITS = re.compile(
    r"^(?P<what>[^,;:]{2,60}?)\s+(?:is|are|stays?|remains?)\s+(?:also\s+|now\s+|still\s+)?(?:off[- ]limits"
    r"|forbidden|banned|prohibited|not allowed|not permitted|a no[- ]go|out of bounds|not an option|not to be"
    r" (?:touched|changed|edited|used)|untouchable|read[- ]only|frozen)\b",
    re.I,
)
_ONLY = re.compile(r"^(?P<what>[^,;:]{2,50}?)\s+only(?:\s+(?:for|in|on|from|with)\s+(?P<scope>[^,;.!?]{2,40}))?"
                   r"\s*(?:please|pls|plz)?\s*[.!]*$", re.I)  # fmt: skip
_BOUND_AFTER = re.compile(
    r"(?P<value>\b\d[\d,.]*\s*(?:%|[a-z]{1,12})?(?:\s+(?:a|an|per|each|every)\s+[a-z]{2,12})?)\s+"
    r"(?:max(?:imum)?|tops|at most|or less|or fewer|at the most|min(?:imum)?|at least|or more)\b",
    re.I,
)
_SETTING = re.compile(
    r"^(?P<label>[A-Za-z][A-Za-z'/-]*(?:\s+(?!(?:is|are|was|were|be)\b)[A-Za-z'/-]+){0,2})\s*:\s+"
    r"(?!(?:please|pls|can|could|would|will|what|why|how|when|where|who|do|does|did|is|are)\b)(?P<value>[^:]{2,120})$"
)
_NOT_A_SETTING = re.compile(
    r"^(?:from|to|cc|bcc|subject|date|re|fwd|sent|reply-to|hi|hello|dear|note|update|edit|ps|p\.s|q|a|question"
    r"|answer|step \d+|example|e\.g|i\.e|error|warning|info|plan|output|result|status|edit \d+|http|https"
    # a label that names the kind of what follows ("USER PREFERENCE:", "HARD CONSTRAINT:", "FACT:"), not its topic:
    # the sentence after it is read on its own (``slots.classify``)
    r"|(?:[\w'-]+\s+){0,2}(?:rules?|constraints?|preferences?|facts?|goals?|state|decisions?|requirements?"
    r"|polic(?:y|ies)|notes?|reminders?|instructions?|guidelines?|conventions?|fyi|important|context|background))$",
    re.I,
)
_OBLIGED = re.compile(
    r"^(?:(?:every|each|all|any)\s+)?(?P<subject>(?!(?:it|this|that|there|he|she|they|we|i|you|which|what|who"
    r"|everything|something|anything|nothing)\b)[a-z][\w'-]*(?:\s+[\w'-]+){0,3}?)\s+"
    r"(?:has to|have to|must|should|needs? to|is to|are to|shall)\s+(?:always\s+)?(?:be|stay|remain)\s+"
    r"(?P<value>[^,;.!?]{2,60})",
    re.I,
)
_EVERYWHERE = re.compile(
    r"^(?:(?:every|each|all|any)\s+)(?P<subject>[\w'-]+(?:\s+[\w'-]+){0,2})\s+(?:is|are|gets?)\s+(?P<value>[\w'-]+)"
    r"\b[^.;!?]{0,40}\b(?:wherever|whenever|everywhere|always|throughout)\b",
    re.I,
)
_NOT_SEE = re.compile(
    r"^(?:and\s+)?i\s+(?:don't|do not|never)\s+want\s+(?:to\s+(?:see|read|hear|have)\s+)?(?P<what>(?!it\b|this\b"
    r"|that\b|them\b)[^.;!?]{2,80})$",
    re.I,
)
_AIM = re.compile(
    r"^(?:(?:so|ok(?:ay)?|and)[\s,]+)?(?:(?:today|tonight|this week|this session|for today|for now|right now)"
    r"[\s,]+(?:i|we)\s+(?:just\s+|really\s+)?(?:want|need|have|hope|plan|aim|would like|'d like)\s+to"
    r"|(?:i|we)\s+(?:just\s+|really\s+)?(?:want|need|hope|plan|aim)\s+to\s+(?P<verb>[a-z]+)\b[^.;!?]{2,100}?"
    r"\b(?:today|tonight|this week|this session|by (?:tonight|end of day|eod))"
    r"|(?:today's|todays|this week's|the session's)\s+(?:goal|aim|focus|task)"
    r"|(?:goal|aim|focus)\s+for\s+(?:today|this week|the session|now))\b[\s:,-]*(?:is\s+(?:to\s+)?)?"
    r"(?P<what>[^;!?]{3,120})",
    re.I,
)
_I_AM = re.compile(r"^(?:(?:hi|hello|hey|hiya|so|ok(?:ay)?|well|and)[\s,!]+)*(?:i'm|i am|this is|it's|my name's)\s+"
                   r"(?P<name>(?-i:[A-Z])[a-z'-]+)\s*(?:[,.!;]|$)", re.I)  # fmt: skip
_ROLE_PERSON = re.compile(
    r"(?:^|\b(?:the|our|their|my)\s+)(?P<role>signatory|approver|contact|point of contact|owner|lead|reviewer"
    r"|editor|supervisor|account manager|on-?call|dri|assignee|decision[- ]maker)\b(?:\s+(?:for|of|at|on)\s+"
    r"(?:the\s+)?(?P<which>[\w&-]+))?[^.;]{0,30}?\s(?:is|will be)\s+"
    r"(?:(?:their|our|the)\s+[\w-]+,\s+)?(?P<name>(?-i:[A-Z])[\w'-]+(?:\s+(?-i:[A-Z])[\w'-]+){0,2})"
    r"|^(?P<whose>(?-i:[A-Z])[\w&-]+)'s\s+(?P<role2>signatory|approver|contact|owner|lead|reviewer)\s+is\s+"
    r"(?:(?:their|our|the)\s+[\w-]+,\s+)?(?P<name2>(?-i:[A-Z])[\w'-]+(?:\s+(?-i:[A-Z])[\w'-]+){0,2})",
    re.I,
)
# "it", "that", "this one", "them": the thing at hand; with no habit word, an order about it is a one-off.
_DEICTIC = re.compile(
    r"^(?:(?:and|but|also|so|ok(?:ay)?|just|please|pls)\b[\s,]*)*(?:(?:don't|do not|never|no need to)\s+)?[a-z]+"
    r"\s+(?:it|that|this|them|these|those|this one|that one|anything|everything)\b(?:\s+(?:yet|now|for now|again"
    r"|please|pls|too|either))?(?:$|[,.!;]|\s+(?:yet|now|until|till|for|in|on|to|from|so|because|since|unless"
    r"|i|we|it|that)\b)",
    re.I,
)
_HABIT = re.compile(r"\b(?:always|never|ever|every|each|whenever|from now on|going forward|anymore|any more"
                    r"|at all times|in future|by default)\b", re.I)  # fmt: skip
_ONE_OFF = re.compile(
    r"\b(?:just this once|for this run|this time|just for this|for this one|just curious|thinking out loud"
    r"|that's all for today|for today only|this once|just to see|i just want to see|one-off"
    r"|(?:in|for) this (?:pr|commit|run|ticket|branch|draft|version|email|reply|one|issue|chapter))\b",
    re.I,
)


# "USER PREFERENCE: …", "Hard constraint: …", "FACT: …", "Goal state: …": the speaker says what kind it is.
_KIND_LABEL = re.compile(
    r"^(?:(?:[\w'-]+\s+){0,2})(?P<kind>rules?|constraints?|preferences?|facts?|goal(?:\s+state)?|goals|task"
    r"|decisions?|requirements?|polic(?:y|ies)|conventions?|guidelines?)\s*:\s*(?P<rest>\S.{2,300})$",
    re.I,
)
_LABEL_KIND = {"rule": "rule", "requirement": "rule", "policy": "rule", "policie": "rule", "convention": "rule",
               "guideline": "rule", "constraint": "constraint", "preference": "preference", "fact": "name",
               "goal": "goal", "goal state": "goal", "task": "goal", "decision": "decision"}  # fmt: skip


def labelled_kind(text: str) -> Found | None:
    """A sentence its speaker labelled with its kind, whatever its shape: the kind named, its topic words (the
    value of a type left out: "the user's contact code is XKX-8683" and its update share "contact code")."""
    label = _KIND_LABEL.match(text.strip())
    if not label:
        return None
    name = " ".join(label.group("kind").lower().split()).removesuffix("s")
    kind = _LABEL_KIND.get(name, _LABEL_KIND.get(name + "s", "rule"))
    rest = label.group("rest").strip(" .")
    value = typed_value(rest) or rest
    # the slot is the topic words themselves (no concept key before " ~ "): two labelled items replace each
    # other only with a value of one type and a topic word in common (``topics.same_topic``)
    return kind, f"{kind} {topic(rest, value if value != rest else '')}".strip(), value


def one_off(text: str) -> bool:
    """An order about the thing at hand ("don't merge it", "don't change anything yet") or said for one time
    only ("just for this run"): it sets nothing that holds."""
    return bool(_ONE_OFF.search(text) or (_DEICTIC.match(text) and not _HABIT.search(text)))


def _words(text: str, drop: str = "") -> str:
    return content_words(text, drop + " off limits only max tops none anywhere everywhere")


_SHORT_LEAD = re.compile(r"^(?:[\w'-]+\s+){0,3}[\w'-]+[,!]\s+(?=\S)")


def terse(text: str) -> Found | None:
    """What a fragment sets, by its shape (see the module's list); None for most clauses. A short lead-in
    before a comma ("sure, good call, 'synergy' is off limits") is read past."""
    found = _terse(text.strip(" .!"))
    if found is None and (lead := _SHORT_LEAD.match(text)):
        found = _terse(text[lead.end() :].strip(" .!"))
    return found


_QUANTITY_VALUE = (
    r"(?P<value>[$€£]?\s?\d[\d,.]*(?:\s?(?:k|m))?(?:\s?[–-]\s?[$€£]?\d[\d,.]*)?\s?(?:%|[a-z]{1,12}\b)?"
    r"(?:\s+(?:a|an|per|each|every)\s+[a-z]{2,12})?)"
)
# "the upload size cap is 25 MB now, not 10", "standups are 15 mins each", "the timeout is 30s now"
_IS_QUANTITY = re.compile(
    r"^(?:so\s+|and\s+|ok\s+)?(?:the\s+|our\s+|my\s+|your\s+)?(?P<what>(?!(?:it|this|that|there|he|she|they|we|i|you"
    r"|which|what|who)\b)[a-z][\w' /-]{1,50}?)\s+(?:is|are|'s|stays?|remains?)\s+(?:now\s+|still\s+)?"
    + _QUANTITY_VALUE
    + r"(?:\s+(?:now|each|max|tops|at most|from now on))?\s*(?:,\s*not\s+[^,;.]{1,20})?[.!]*$",
    re.I,
)
# "bump the retry budget to 7", "Make the total 4 000", "cap it at 300", "batch size, make it 64"
_SET_TO = re.compile(
    r"^(?:(?:so|and|ok(?:ay)?|then|also|let's|lets|please|pls)[\s,]+)*(?:make|set|bump|raise|lower|cap|move|change"
    r"|increase|reduce|drop)\s+(?:the\s+|our\s+|my\s+)?(?P<what>[\w' /-]{1,40}?)\s+(?:to\s+|at\s+)?"
    + _QUANTITY_VALUE
    + r"[.!]*$",
    re.I,
)


def _terse(text: str) -> Found | None:
    if refusal := _REFUSAL.match(text):
        words = _words(refusal.group("what"))
        return ("rule", f"no {words}".strip(), "never") if words else None
    if off := _OFF_LIMITS.match(text):
        words = _words(off.group("what"))
        return ("rule", f"no {words}".strip(), "never") if words else None
    if (only := _ONLY.match(text)) and len(only.group("what").split()) <= 6:
        value = only.group("what").strip()
        return "constraint", with_topic("only", text, value), value
    if bound := _BOUND_AFTER.search(text):
        value = bound.group(0).strip()
        number = bound.group("value").split()[0]  # the unit stays a topic word: "hashtags"
        return "constraint", f"limit {_words(text, number)}".strip(), value
    if obliged := _OBLIGED.match(text) or _EVERYWHERE.match(text):
        subject, value = obliged.group("subject"), obliged.group("value").strip()
        return "rule", f"be {_words(subject)}".strip(), value
    if not_see := _NOT_SEE.match(text):
        return "rule", f"no {_words(not_see.group('what'))}".strip(), "never"
    if amount := _IS_QUANTITY.match(text) or _SET_TO.match(text):
        what = amount.group("what")
        words = topic(what)
        bare = amount.re is _IS_QUANTITY and re.fullmatch(r"[\d,.]+", amount.group("value").strip()) is not None
        if bare and not re.search(r"\bnow\b", text, re.I):
            return None  # "my son is 9": a number with no unit, said as no change, is a fact about something
        if words and what.lower() not in ("it", "that", "this", "them"):  # "make it 8": the change reader's
            return "constraint", f"limit {words}", amount.group("value").strip()
    if aim := _AIM.match(text):
        return "goal", "task", aim.group("what").strip(" .")
    if i_am := _I_AM.match(text):
        return "name", "user name", i_am.group("name")
    if person := _ROLE_PERSON.search(text):
        role = (person.group("role") or person.group("role2")).lower().replace(" ", "-")
        name = person.group("name") or person.group("name2")
        which = (person.group("which") or person.group("whose") or "").lower()
        # "signatory@acme": the signatory of one party is not the other's (``topics.same_topic``)
        slot = f"{role} {stem(which)} ~ {role}@{stem(which)}" if which else f"{role} ~ {topic(text, name)}"
        return "name", slot, name
    if (setting := _SETTING.match(text)) and not _NOT_A_SETTING.match(setting.group("label").strip()):
        label, value = setting.group("label"), setting.group("value").strip()
        if len(value.split()) <= 12:
            return "preference", f"setting {_words(label)}".strip(), value
    return None
