"""The lexicon of standing instructions: words, values and the concepts users restate in many words.

``proxy.engine.standing.slots`` reads a sentence for what it sets; this module holds what that reading is made of:

* **Words**: ``content_words`` turns text into a slot key (stopwords, values and cue words removed, light
  stemming, a few synonyms merged, sorted), so word order and inflection do not make two slots of one topic.
* **Values**: money as digits or words ("$800", "five hundred dollars"), dates, comparisons with a quantity
  ("under 200 ms"), identifiers: the part of a sentence an update changes.
* **Concepts** (``CONCEPTS``): a budget, a deadline, a pinned version, units, the answer's language or length,
  indentation, how to address the user, the user's name, what a thing is called or where it lives, who owns
  what. Each maps many phrasings to one slot ("budget cap is $800" and "keep spend under five hundred dollars"
  are both ``budget``), plus the qualifier that keeps two of them apart ("budget travel", "budget market").

Every pattern runs on one sentence of at most ~300 characters; repetitions are bounded or separated by fixed
characters, so none backtracks more than polynomially on that short input.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Found = tuple[str, str, str]  # kind, slot, value

_STOPWORDS = """
a an the and or but if then so to of in on at by for with from into onto about as is are was were be been
being am do does did doing have has had this that these those it its it's we we're we'll us our i i'm i'll
me my you you're your they them their he she his her there here what which who whom when where why how all
any each every some no not nor only own same than too very can could will would shall should may might must
just also now again still ever anymore please let let's lets ok okay going want need needs make sure ensure
always never don't dont do not avoid stop from on update quick new actually instead keep stay stays remain
under below above over within most least more less max maximum min minimum up allowed free fine go ahead
one two three four five six seven eight nine ten hundred thousand million dollars bucks euros pounds usd
eur ms sec seconds minutes hours days weeks percent gb mb kb tb k words lines tokens time times cap capped
limit limited exceed exceeding no longer per i'd i've we've you'll that's there's won't can't isn't aren't
"""
STOPWORDS = frozenset(_STOPWORDS.split())
# Synonyms merged in slots (by stem): "touch", "edit", "modify" and "change" a module are one order.
_CANONICAL = {"respons": "answer", "reply": "answer", "repli": "answer", "repository": "repo", "attempt": "retry",
              "retri": "retry", "touch": "edit", "modifi": "edit", "modify": "edit", "chang": "edit",
              "alter": "edit"}  # fmt: skip
WORD = re.compile(r"[a-z][a-z0-9'_-]*")


def stem(word: str) -> str:
    word = word.removesuffix("'s").removesuffix("'")
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            break
    word = word.removesuffix("e") if len(word) > 3 else word
    return _CANONICAL.get(word, word)


def content_words(text: str, drop: str = "") -> str:
    """The words ``text`` is about, as a slot: stopwords and the words of ``drop`` (values, cues) removed,
    stemmed, deduplicated and sorted, so that word order and inflection do not change it."""
    dropped = {stem(w) for w in WORD.findall(drop.lower())}
    words = {stem(w) for w in WORD.findall(text.lower()) if w not in STOPWORDS}
    return " ".join(sorted(w for w in words - dropped if w and w not in STOPWORDS))


THINGS = frozenset(  # kinds of thing that get a name or an identifier, stemmed
    (
        "host", "hostnam", "server", "databas", "db", "branch", "ticket", "cluster", "bucket", "channel", "repo",
        "folder", "directory", "path", "queue", "tabl", "alias", "email", "domain", "url", "endpoint", "namespac",
        "region", "imag", "port", "modul",
    )
)  # fmt: skip
_GENERIC = """
budget spend spending cost fee allowance cap limit ceiling floor deadline date name thing stuff value number amount
total whole overall hard soft final new old current main big small quick good news record note update
month week day year quarter sprint today tomorrow time times hour minute morning afternoon evening night
customer client user team people peopl everyone anyone someone somebody nobody finance legal manager boss
company they them she he her him one two ways way bit lot kind sort part piece case point
get got give gave keep kept stay remain make made take took put set use using run runn go goe going went come
came want like need say said tell told ask know think see look work worked call let plan done do
well also really still just even either anymore instead now again after first last next rest same
simple separately actually probably basically definitely clear very pretty rather near far currently
due finish finished complete done codename codenamed called named mention give talk write show quote summarise
move moved slip slipped push pushed postpone shift change raise lower cut bump drop upgrade upgraded
requirement rule policy constraint goal task status decision prefer owner use wait block stuck settle
settled agree agreed decide decided fact facts fyi context background remember
"""
GENERIC = frozenset(stem(w) for w in _GENERIC.split()) | frozenset(_GENERIC.split())


def topic(text: str, value: str = "") -> str:
    """The topic words of ``text`` (without its ``value``): stemmed content words, generic ones left out, a kind
    of thing with the word before it (``host@stag``); deduplicated and sorted."""
    words = WORD.findall(text.replace(value, " ").lower() if value else text.lower())
    out: set[str] = set()
    for i, word in enumerate(words):
        stemmed = stem(word)
        if word in STOPWORDS or stemmed in GENERIC:
            continue
        if stemmed in THINGS:
            before = words[i - 1] if i else ""
            qualifier = "" if before in STOPWORDS or stem(before) in GENERIC else stem(before)
            first = stem(words[i - 2]) if i > 1 and words[i - 2] not in STOPWORDS else ""
            if qualifier and len(first) > 2 and first not in GENERIC and first not in THINGS:
                qualifier = f"{first}-{qualifier}"  # "primary deployment region" is not the backup one
            stemmed = f"{stemmed}@{qualifier}"
        out.add(stemmed)
    return " ".join(sorted(out))


def with_topic(key: str, text: str, value: str) -> str:
    """A concept's slot ``key`` with the topic words of ``text`` after " ~ " (``proxy.engine.standing.topics``)."""
    words = topic(text, value)
    return f"{key} ~ {words}" if words else key


# --- values ------------------------------------------------------------------------------------------------

_NUMBER_WORD = (
    r"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|forty|fifty"
    r"|sixty|seventy|eighty|ninety|hundred|thousand|million|a|and)"
)
_NW = (
    r"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen"
    r"|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million)"
)
NUMBER = rf"(?:\d[\d,]*(?:\.\d+)?|{_NW}(?:[\s-]+(?:and[\s-]+)?{_NW}){{0,4}})"  # "5", "five hundred"
SIZE = re.compile(rf"\b{NUMBER}\s?(?:gb|mb|kb|tb|gib|mib|(?:giga|mega|kilo|tera)?bytes?)\b", re.I)
DURATION = re.compile(
    rf"\b{NUMBER}\s?(?:ms|milliseconds?|secs?|seconds?|mins?|minutes?|hrs?|hours?|days?|weeks?|months?)\b", re.I
)
COUNT_UNIT = re.compile(
    rf"\b{NUMBER}\s+(?:(?-i:[A-Z]{{2,}})\s+)?([a-z]{{2,}}s)\b", re.I
)  # "5 attempts", "10,000 API calls"
MONEY = re.compile(
    r"[$€£]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|m|bn|thousand|million)\b)?"
    r"|\b\d[\d,]*(?:\.\d+)?\s?(?:k|m)?\s?(?:dollars|usd|eur|euros?|gbp|pounds|bucks)\b"
    rf"|\b(?:{_NUMBER_WORD}[\s-]+){{1,8}}(?:dollars|euros?|pounds|bucks)\b",
    re.I,
)
_MONTH = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"  # noqa: E501
_ORDINAL = (
    r"(?:(?:twenty|thirty)[\s-]?)?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
    r"|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth)"
)
DATE = re.compile(
    rf"\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\b"
    r"|\b\d{4}-\d\d-\d\d\b|\b(?:next\s+)?(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|\bend of (?:the )?"
    r"(?:day|week|month|quarter|year|sprint|q[1-4])\b|\b(?:eod|eow|tomorrow|tonight)\b|\bnext (?:week|month)\b"
    r"|\bq[1-4]\b"
    rf"|\b(?:the\s+)?{_ORDINAL}\s+of\s+{_MONTH}\b|\b(?:end|start|beginning|middle) of {_MONTH}\b"
    r"|(?:(?<=until )|(?<=till )|(?<=by )|(?<=in )|(?<=before )|(?<=after ))(?:january|february|march|april|june"
    r"|july|august|september|october|november|december)\b",
    re.I,
)
_QUANTITY = (
    r"\d[\d,]*(?:\.\d+)?\s?(?:%|ms|milliseconds?|s|secs?|seconds?|mins?|minutes?|h|hours?|days?|weeks?|gb|mb|kb|tb|k|words"
    r"|lines|tokens|chars|characters|requests|rps|qps|retries|calls|items|files|users|percent)?\b"
)
COMPARISON = re.compile(
    r"\b(?:at most|at least|no more than|not more than|no less than|fewer than|less than|more than|under|below"
    r"|above|over|within|max(?:imum)?(?: of)?|min(?:imum)?(?: of)?|up to|capped at|cap of|limit(?:ed)? to"
    rf"|(?:not |never )?exceed(?:ing)?)\s+{_QUANTITY}"
    rf"|[<>]=?\s?{_QUANTITY}|\b(?:minimum|maximum)\b[^.!?\d]{{0,40}}?\b(?:is|of)\s+{_QUANTITY}",
    re.I,
)
_IDENT = r"`[^`]{1,80}`|\"[^\"]{1,80}\"|[\w./:@#-]*[\d._/:@#-][\w./:@#-]*[\w/]"


# --- the lexicon -------------------------------------------------------------------------------------------

_NOT_QUALIFIER = """
whole entire total overall project everything this month year budget spend spending spent cost costs cap
deadline hard final set raise lower increase cut reduce change changed moved move is
main primary current overall end new updated
"""
NOT_QUALIFIER = STOPWORDS | frozenset(_NOT_QUALIFIER.split())
_BUDGET_WORD = re.compile(r"\b(budget|spend|spending|cost|costs|expenses?|cap|allowance|ceiling|bill|fees?)\b", re.I)
NORMATIVE = re.compile(
    r"\b(?:budget|cap|capped|limit|allowance|ceiling|under|below|within|max(?:imum)?|at most|no more than"
    r"|keep|stay|must|should|not exceed|up to|can spend)\b",
    re.I,
)
# Said of the past ("the budget was $500 last year"), unless it still holds.
PAST = re.compile(
    r"\b(?:was|were|had|did|got|went|ran|spent|yesterday|last (?:week|time|month|year|night|run))\b", re.I
)
STILL = re.compile(  # said of the past, but holding now: "the runners were upgraded to 8 GB"
    r"\b(?:now|from now on|going forward|still|must|should|keep|stay)\b"
    r"|\b(?:upgraded|raised|lowered|increased|reduced|bumped|cut|changed|moved)\s+(?:\w+\s+){0,3}?to\b",
    re.I,
)
_QUALIFIED_BY = re.compile(r"\s+(?:for|on)\s+(?:the\s+|our\s+|all\s+)?([a-z][\w-]*)", re.I)


def _qualifier(text: str, noun: re.Match[str]) -> str:
    """The word that says *which* one: right before the concept's noun ("travel budget"), or after "for/on"."""
    before = WORD.findall(text[: noun.start()].lower())[-2:]
    if before[-1:] in (["is"], ["are"]):
        before = before[:-1]  # "the report is due"
    after = _QUALIFIED_BY.match(text, noun.end())
    words = [*before[-1:], *([after.group(1).lower()] if after else [])]
    return " ".join(stem(w) for w in words if w not in NOT_QUALIFIER and not w.isdigit())


def slot(concept: str, qualifier: str) -> str:
    return f"{concept} {qualifier}".strip()


def _budget(text: str) -> Found | None:
    money, noun = MONEY.search(text), _BUDGET_WORD.search(text)
    if not money or not noun or not NORMATIVE.search(text) or (PAST.search(text) and not STILL.search(text)):
        return None
    value = money.group(0).strip()
    return "constraint", with_topic(slot("budget", _qualifier(text, noun)), text, value), value


_FUTURE = re.compile(r"\b(?:needs?|must|should|has to|have to|will|wants?|going to|expects?|plans?|got to)\b", re.I)
_BY = re.compile(r"\b(?:by|before|no later than)\s+(?:the\s+)?$", re.I)  # "… the report by Monday"
_DEADLINE_WORD = re.compile(
    r"\b(deadline|due|ship(?:s|ping)?|launch(?:es|ing)?|release date|go[- ]live|deliver(?:ed)?|cutoff"
    r"|done|finished|no later than)\b",
    re.I,
)


def _deadline(text: str) -> Found | None:
    date = DATE.search(text)
    if not date:
        return None
    if (noun := _DEADLINE_WORD.search(text)) and noun.start() <= date.start():
        return "constraint", with_topic(slot("deadline", _qualifier(text, noun)), text, date.group(0)), date.group(0)
    if _FUTURE.search(text) and _BY.search(text, 0, date.start()):  # "the customer wants the report by Monday"
        what = content_words(text[: date.start()], "need want must should will going expect plan got before")
        return "constraint", with_topic(slot("deadline", what), text, date.group(0)), date.group(0)
    return None


_VERSION = r"v?(\d+(?:\.\d+){0,3}(?:\.x)?)\b"
_TOOL = r"([A-Za-z][\w.+#-]*)"
_PIN = re.compile(
    rf"\b(?:stay|stick|remain|keep)\s+(?:on|with|at)\s+{_TOOL}\s+{_VERSION}"
    rf"|\bpin\s+{_TOOL}\s+(?:to|at)\s+{_VERSION}"
    rf"|\b(?:upgrade|move|switch|migrate|bump|downgrade)\s+(?:\w+\s+)?to\s+{_TOOL}\s+{_VERSION}"
    rf"|^(?:only\s+)?(?:use|target|require)\s+{_TOOL}\s+{_VERSION}"
    rf"|\b{_TOOL}\s+(?:version\s+)?(?:must|has to|needs to)\s+(?:be|stay)\s+(?:at\s+|on\s+)?{_VERSION}"
    rf"|\b(?:floor|minimum|baseline)\s+(?:is|stays|remains)\s+{_TOOL}\s+{_VERSION}"
    rf"|\b{_TOOL}\s+{_VERSION}\s+(?:is|as)\s+(?:the\s+|our\s+)?(?:new\s+)?(?:minimum|floor|baseline)"
    r"|\b(?:must|has to|have to|needs? to|should|keep|still|only)\s+(?:\w+\s+)?(?:run|running|work|working|support"
    rf"|supporting)\s+(?:on\s+)?{_TOOL}\s+{_VERSION}",
    re.I,
)


def _pinned_version(text: str) -> Found | None:
    match = _PIN.search(text)
    if not match:
        return None
    groups = [g for g in match.groups() if g]
    tool, version = groups[0], groups[1]
    if "." not in version and tool.islower():
        return None  # "use port 8080": a number, not a version
    return "constraint", f"version {tool.lower()}", version


_UNITS = re.compile(r"\b(?:metric|imperial|us customary)(?:\s+(?:units|system))?\b|\bsi units\b", re.I)
_TEMPERATURE = re.compile(r"\b(celsius|fahrenheit|kelvin)\b", re.I)
_UNITS_CONTEXT = re.compile(r"\b(?:units?|answer|reply|respond|use|give|show|convert|measure|prefer|always|in)\b", re.I)
_LANGUAGE = re.compile(
    r"\b(?:answer|reply|respond|write|speak|talk|communicate|responses?|answers?|replies|switch)\b[^.!?]{0,30}?"
    r"\b(?:in|to)\s+(english|french|german|spanish|italian|portuguese|dutch|japanese|chinese|mandarin|korean"
    r"|russian|polish|swedish|norwegian|danish|finnish|hindi|arabic|turkish|ukrainian|greek|czech|hebrew)\b",
    re.I,
)
_LENGTH = re.compile(
    r"\b(?:keep|make)\s+(?:your\s+|the\s+|all\s+)?(?:[a-z]+\s+)?(answers?|responses?|replies|explanations?|reports?"
    r"|summar(?:y|ies)|updates|messages|it|them)\s+"
    r"((?:short|brief|concise|terse|detailed|long|thorough|shorter|longer)\b|under \d+ words)"
    r"|\bbe\s+(?:more\s+|very\s+)?(concise|brief|terse|detailed|verbose|thorough)\b"
    r"|^(short|brief|concise|detailed|longer|shorter)\s+(?:answers|responses|replies)\b",
    re.I,
)
_FORMAT = re.compile(
    r"\b(?:(?:short|plain|simple|long|numbered|nested|flat)\s+)?(?:bullet points|bullet lists?|bullets|numbered lists"
    r"|lists|tables|paragraphs|prose|plain text|headings)\b",
    re.I,
)
_FORMAT_CONTEXT = re.compile(r"\b(?:prefer|like|want|use|write|drop|give|instead|better|easier|format|style)\b", re.I)
_REFUSED = re.compile(r"\b(?:drop|no|without|not|avoid|stop|skip)\s+(?:the\s+|using\s+|with\s+)?$", re.I)


def _format(text: str) -> str | None:
    """The answer format asked for: the one preferred over another ("tables work better than lists"), else
    the last one not refused ("drop the lists, write plain paragraphs instead")."""
    forms = [m for m in _FORMAT.finditer(text) if not _REFUSED.search(text, 0, m.start())]
    if not forms:
        return None
    preferred = [m for m in forms if re.match(r"[^.;]{0,30}?\bthan\b", text[m.end() :])]
    return (preferred or forms)[0 if preferred else -1].group(0)


_INDENT = re.compile(r"\b(tabs|\d+[- ]space(?:s)?(?: indent(?:ation)?)?|spaces)\b", re.I)
_INDENT_CONTEXT = re.compile(r"\b(?:prefer|use|indent(?:ation)?|always|format)\b", re.I)
_ADDRESS = re.compile(r"\b(?i:call me|address me as|i go by)\s+([A-Z][\w'-]*)")
_USER_NAME = re.compile(r"\bmy name(?: is|['’]s)\s+([A-Z][\w'-]*)", re.I)
_CALLED = re.compile(
    r"\b(?:the|our|this|my)\s+((?:[\w-]+\s+){0,2}?[\w-]+)\s+(?:is|will be)\s+(?:called|named|codenamed)\s+"
    rf"({_IDENT}|[A-Z][\w-]*)"
    r"|\bwe\s+(?:call|named?|refer to)\s+((?:the|our|this)\s+(?:[\w-]+\s+){0,2}?[\w-]+)\s+"
    rf"({_IDENT}|(?-i:[A-Z])[\w-]*)"
    r"|\bcodenamed?[,:]?\s+(?:is\s+)?()((?-i:[A-Z])[\w-]*)"
    r"|\b(?:i(?:'ll| will)|we(?:'ll| will)|let's)\s+(?:name|call)\s+(?:the\s+|it\s+|this\s+)?([\w\s-]{0,30}?)\s*"
    rf"({_IDENT})",
    re.I,
)
_ASSIGNED = re.compile(
    r"(?:^|[,:;]\s*)(?:the|our|my|your)\s+((?:[\w-]+\s+){0,3}?(?:host|hostname|server|url|endpoint|database|db"
    r"|bucket|branch|repo|repository|cluster|region|namespace|account|channel|email|domain|port|path|directory"
    r"|folder|table|queue|topic|ip|address|id|username|env|environment|instance|image|tag|profile|project key"
    r"|dataset|ticket|alias))(?:\s+(?:for|of|at|on)\s+[^,.;]{1,30}?)?\s+"
    rf"(?:is|will be|should be|=|:)\s+({_IDENT})",
    re.I,
)
_PERSON = r"([A-Z][a-z'-]+(?:\s+[A-Z][a-z'-]+)?)"
_CONTACT = re.compile(
    rf"\bcontact\b[^.;]{{0,40}}?\bis\s+{_PERSON}"
    r"|\b(?:deal with|talk to|work with|go through|report to)\s+([A-Z][a-z'-]+\s+[A-Z][a-z'-]+)"
)
_THING_ID = re.compile(
    r"\b(?:the\s+)?(?:branch|ticket|host|bucket|cluster|channel|queue|repo|folder|directory|namespace)\s+"
    r"([\w./:@#-]*[\d_/][\w./:@#-]*[\w/])",
    re.I,
)
_USE_ID = re.compile(
    r"\b(?:use|reference|cite|track (?:it|this) (?:in|under)|file (?:it|this) under|log (?:it|this) (?:in|under))"
    r"\s+(?:the\s+)?((?:[\w-]+\s+)??(?:ticket|issue|jira|branch|channel|label|epic|account|bucket|namespace|queue"
    r"|profile|region))"
    r"\s+([\w./:@#-]*\d(?:[\w./:@#-]*[\w/])?|`[^`]{1,80}`)",
    re.I,
)
_OWNER = re.compile(
    r"^(?:(?i:from now on|going forward|now)[,\s]+)?([A-Z][a-z]+)\s+(reviews|owns|handles|approves|maintains"
    r"|is responsible for|is in charge of|is on call for|takes care of|will review|will handle|should review)"
    r"\s+([^.,;!?]{3,80})"
)


def _lexicon_preference(text: str) -> Found | None:
    if (units := _UNITS.search(text)) and _UNITS_CONTEXT.search(text):
        return "preference", "units", units.group(0)
    if (temperature := _TEMPERATURE.search(text)) and _UNITS_CONTEXT.search(text):
        return "preference", "units temperature", temperature.group(1)
    if language := _LANGUAGE.search(text):
        return "preference", "language", language.group(1)
    if length := _LENGTH.search(text):
        what, value = (length.group(1) or "answer").lower(), next(g for g in length.groups()[1:] if g)
        answer = what.startswith(("answer", "respons", "repl", "it", "them"))
        return "preference", "answer length" if answer else f"length {stem(what)}", value
    if (form := _format(text)) and _FORMAT_CONTEXT.search(text):
        return "preference", "format", form
    if (indent := _INDENT.search(text)) and _INDENT_CONTEXT.search(text):
        return "preference", "indentation", indent.group(1)
    if address := _ADDRESS.search(text):
        return "preference", "address", address.group(1)
    return None


def _named(text: str, value: str) -> str:
    return f"name {topic(text, value)}".strip()


def _lexicon_name(text: str) -> Found | None:
    if user := _USER_NAME.search(text):
        return "name", "user name", user.group(1)
    if called := _CALLED.search(text):
        what, name = [g for g in called.groups() if g is not None][:2]
        return "name", f"name {topic(what or text, name)}".strip(), name
    if assigned := _ASSIGNED.search(text):
        return "name", _named(text, assigned.group(2)), assigned.group(2)
    if contact := _CONTACT.search(text):
        person = contact.group(1) or contact.group(2)
        return "name", f"contact {topic(text, person)}".strip(), person
    if used := _USE_ID.search(text):
        return "name", _named(text, used.group(2)), used.group(2)
    if (thing := _THING_ID.search(text)) and not (PAST.search(text) and not STILL.search(text)):
        return "name", _named(text, thing.group(1)), thing.group(1)
    if (owner := _OWNER.search(text)) and owner.group(1).lower() not in STOPWORDS:
        return "decision", f"owner {_owned(owner.group(3))}", owner.group(1)
    return None


def _owned(what: str) -> str:
    """What is owned, its last word tagged with the one before ("backend PRs": ``pr@backend``)."""
    words = [stem(w) for w in WORD.findall(what.lower()) if w not in STOPWORDS]
    return f"{words[-1]}@{words[-2] if len(words) > 1 else ''}" if words else ""


CONCEPTS: tuple[Callable[[str], Found | None], ...] = (
    _budget,
    _deadline,
    _pinned_version,
    _lexicon_preference,
    _lexicon_name,
)
