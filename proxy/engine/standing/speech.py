"""Whose words a sentence is, and which way it points: what the deterministic reader checks before and after
it reads a sentence for a standing instruction (``proxy.engine.standing.ledger.extract``).

* ``normalise``: typographic apostrophes and quotes (what phones and chat apps type) read as ASCII ones;
* ``own_prose``: a message with its material removed: code (fenced with backticks or tildes, closed or not,
  or indented), quoted lines, pasted documents and files, the proxy's own stubs, a client's reminders, and what
  follows a line that announces a paste ("Here's what the ops bot posted:", "Customer writes:");
* ``not_own``: a sentence that is not the speaker's own standing word: reported speech ("my brother-in-law
  says: …"), a hypothetical ("if we moved to Azure, we must …"), a hedge ("I think the deadline is Friday but
  I'm not sure"), an error or log line ("ConfigError: pool_size must stay below 64");
* ``negated``: whether a sentence forbids or refuses what it names ("Don't answer in French" points the other
  way from "Please answer in French"): the one negation reader, whose answer every repeat and supersession
  test compares.

Every pattern runs on text the reader already bounded (a message's first ~20,000 characters, sentences of
~300); repetitions are bounded or separated by fixed characters.
"""

from __future__ import annotations

import functools
import re

_TYPOGRAPHIC = str.maketrans(
    {"’": "'", "‘": "'", "ʼ": "'", "`": "`", "“": '"', "”": '"', "„": '"', "«": '"', "»": '"', "\u00a0": " "}
)


def normalise(text: str) -> str:
    """``text`` with typographic apostrophes and quotes as ASCII ones, and no-break spaces as spaces."""
    return text.translate(_TYPOGRAPHIC)


# --- material in a message that is not the speaker's own words -------------------------------------------------

_FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)[^\n]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.S | re.M)
_INLINE_FENCE = re.compile(r"```[^`]*(?:`(?!``)[^`]*)*(?:```|\Z)")
_BLOCK_TAGS = (
    r"document|documents|file|pasted|paste|email|mail|quote|blockquote|attachment|source|context|log|logs|output"
    r"|system-reminder|reminder|transcript|article|page|excerpt|snippet|data|text|content|message"
)
_TAGGED = re.compile(rf"<({_BLOCK_TAGS})\b[^>]{{0,500}}>.*?(?:</\1\s*>|\Z)", re.S | re.I)
_STUB = re.compile(
    r"\[LCM (?:File|Tool Output): [^\]\n]{0,400}\].*?(?:\(Stored out of line by lcm-proxy\.[^)\n]{0,300}\)|\Z)", re.S
)
_QUOTED = re.compile(r"^[ \t]{0,3}>[^\n]*", re.M)
_INDENTED = re.compile(r"(?:^(?:    |\t)[^\n]*\n?)+", re.M)
# A line that announces material: what follows it, up to a blank line, is someone else's text.
_SPEAKER = (
    r"(?:he|she|they|it|someone|somebody|customer|client|user|bot|manager|boss|team|legal|ops|support|vendor"
    r"|colleague|reviewer)"
)
_ANNOUNCE = re.compile(
    r"^[^\n]{0,120}?\b(?:here(?:'s| is| are)|below is|pasted|pasting|copied|forwarding|forwarded|attached|quote"
    rf"|quoting|excerpt|{_SPEAKER}\s+(?:says|said|writes|wrote|posted|sent|replied|commented|asked|told me|told us))"
    r"\b[^\n]{0,80}:[ \t]*\n.*?(?=\n[ \t]*\n|\Z)",
    re.S | re.M | re.I,
)


# "Customer writes: Hi, my box never arrived …": the rest of that paragraph is the customer's.
_SAID_INLINE = re.compile(
    rf"^[ \t]{{0,3}}(?:the\s+|my\s+|our\s+|a\s+)?{_SPEAKER}\s+(?:says|said|writes|wrote|posted|replied)\s*:"
    r"[^\n]*(?:\n(?![ \t]*\n)[^\n]*){0,200}",
    re.M | re.I,
)


# A passage between two rules ("---" lines, as a pasted email or page is often framed), a long quotation in
# double quotes (a review, a letter: six words or more), a bot's post (":rotating_light: [PagerBot] …"), and
# what follows a line that ends with a colon and a blank line, when that line names material ("the caterer
# sent this:", "runbook section so you know the drill:"): someone else's words, up to the next blank line.
_RULED = re.compile(r"^[ \t]{0,3}(-{3,}|_{3,}|\*{3,}|={3,})[ \t]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.S | re.M)
# A mail or memo pasted with its headers ("From: …", "Subject: …"), up to its sign-off or the next blank line; a
# whole line or paragraph in single quotes ('Dear neighbours, …').
_SIGN_OFF = r"(?i:regards|best|thanks|thank you|cheers|sincerely|kind regards|best wishes|warm regards|yours)\b"
_MAIL = re.compile(
    r"^[ \t]*(?:from|to|subject|re|cc|sent|date):[^\n]*\n(?:[^\n]*\n){0,80}?"
    rf"(?:[ \t]*{_SIGN_OFF}[^\n]{{0,60}}(?:\n[^\n]{{0,40}}(?=\n|\Z))?|[^\n]*(?=\n[ \t]*\n|\Z))",
    re.M | re.I,
)
_SINGLE_QUOTED = re.compile(r"^[ \t]*'[^\n]{20,3000}'[ \t]*$", re.M)
_QUOTE_PAIR = re.compile(r'"[^"\n]{0,2000}"')  # left to right: each match is one opening and its closing quote
_BOT_POST = re.compile(
    r"^[ \t]*(?::[\w+-]{1,30}:\s*)*\[[\w .-]{0,30}(?:bot|Bot|BOT|alert|Alert)\][^\n]*(?:\n(?![ \t]*\n)[^\n]*){0,60}",
    re.M,
)
_MATERIAL = (
    r"this|these|here|below|following|from|sent|send|says|said|wrote|writes|letter|letterbox|e-?mail|mail|message"
    r"|review|runbook|handbook|post|posted|thread|slack|doc|document|page|notice|reply|policy|ticket|log|output"
    r"|excerpt|clause|bot|snippet|memo|comment|feedback|fwd|forwarded|copied|pasted|pasting"
)
# "please note the following house rules:", "my rules for this chat:": the speaker's own list, announced.
_OWN_LIST = (
    r"(?![^\n]{0,160}\b(?:(?:my|our)\s+(?:[\w-]+\s+)?(?:rules|conventions|guidelines|preferences)"
    r"|(?:please\s+)?(?:note|remember|follow|keep to)\s+(?:the following|these)))"
)
_ANNOUNCED_BLOCK = re.compile(
    rf"^{_OWN_LIST}[^\n]{{0,160}}?\b(?:{_MATERIAL})\b[^\n]{{0,80}}:[ \t]*\n(?:[ \t]*\n)+"
    rf"(?:[^\n]*\n(?:[^\n]*\n){{0,60}}?[ \t]*{_SIGN_OFF}[^\n]{{0,60}}(?:\n[^\n]{{0,40}}(?=\n|\Z))?"
    r"|.*?(?=\n[ \t]*\n|\Z))",
    re.S | re.M | re.I,
)


def own_prose(text: str) -> str:
    """``text`` with everything that is material rather than the speaker's own words blanked out (each part
    replaced by a line break, so sentences on either side stay apart)."""
    prose = normalise(text)
    # The announced block first, on the text as written: once a stub or a fence is taken out, the speaker's own
    # words after it would follow the announcing line and a blank line, and pass for the material.
    for pattern in (_ANNOUNCED_BLOCK, _FENCE, _INLINE_FENCE, _TAGGED, _STUB, _RULED, _BOT_POST, _ANNOUNCE,
                    _SAID_INLINE, _MAIL, _SINGLE_QUOTED, _QUOTED, _INDENTED):  # fmt: skip
        prose = pattern.sub("\n", prose)
    return _QUOTE_PAIR.sub(_quotation, prose)


def _quotation(pair: re.Match[str]) -> str:
    """A quotation of six words or more is someone else's sentence; a quoted term ("Notice") stays."""
    return "\n" if len(pair.group(0).split()) >= 6 else pair.group(0)


# --- sentences that are not the speaker's own standing word -----------------------------------------------------

_REPORTED = re.compile(
    r"^(?:(?:my|our|the|his|her|their|a|an|one|some|this|that)\s+)?(?:[\w'-]+\s+){0,3}?"
    r"(?:says?|said|writes?|wrote|posted|replied|insists?|insisted|claims?|claimed|told (?:me|us)|asked (?:me|us)?"
    r"|thinks?|thought|mentioned|suggests?|suggested|recommends?|recommended|reckons?|swears?|always says)\b"
    r"\s*(?:that\s+)?[:,\"']"
    r"|^(?:(?:my|our|the|a|one)\s+)?(?:customer|client|brother|sister|mother|father|mom|dad|friend|cousin|wife"
    r"|husband|uncle|aunt|neighbour|neighbor|bot|ops bot|vendor|ticket|reviewer|commenter|caller|guest)"
    r"[\w'-]*(?:\s+[\w'-]+){0,2}\s+(?:says?|said|writes?|wrote|posted|told|asked|insists?)\b"
    r"|\baccording to (?:my|our|the|his|her|their)\b"
    r"|^[\"'][^\"']{3,300}[\"']\s*[-—–]"
    r"|^(?!i\b)(?:[\w'-]+\s+){0,4}?(?:says?|said|thinks?|reckons?|insists?|swears?|claims?|believes?)\s+(?:that\s+)?"
    r"(?:we|you|they|everyone|it|the|a|an|all|every|[\w-]+s)\s+(?:should|must|need|have|has|ought|always|never|can't"
    r"|cannot|don't|do not)\b",
    re.I,
)
_HYPOTHETICAL = re.compile(
    r"^(?:and\s+|but\s+|so\s+)?(?:suppose|supposing|imagine|hypothetically|what if|say we|let's say|were we to"
    r"|should we ever|in theory|theoretically|in a world where)\b"
    r"|^(?:and\s+|but\s+|so\s+)?(?:if|assuming|once|when)\s+(?:we|i|they|the company|the team|the client"
    r"|management)\s+(?:ever\s+|someday\s+|one day\s+)?(?:\w+ed|were|had|ever|went|got|did|decide|switch|move)\b"
    r"|\bif\b[^.;]{0,120}\bwould\b|\bwould\b[^.;]{0,120}\bif\b"
    r"|\b(?:would|could|might) (?:have to|need to|must)\b",
    re.I,
)
_HEDGE = re.compile(
    r"\b(?:not sure|i'm not certain|not certain|i (?:think|guess|believe|suppose)\b[^.;]{0,120}\bbut\b"
    r"|maybe|perhaps|probably|i wonder|no idea|don't know|do not know|dunno|might be|could be|iirc|afaik"
    r"|if i remember|i'm guessing|possibly|not decided|undecided|tbd|to be decided|still deciding)\b",
    re.I,
)
_LOG_LINE = re.compile(
    r"^\s*(?:[\w.]*(?:Error|Exception|Warning|Fault|Failure|Panic)\b\s*[:(]|Traceback\b|File \"|at [\w.$]+\(|E\s{2,}"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\[?\d\d:\d\d:\d\d|\[?(?:ERROR|WARN|WARNING|INFO|DEBUG|FATAL|CRITICAL)\]?\b"
    r"|npm ERR!|error(?:\[\w+\])?:|warning:|fatal:|panic:|raise |assert |\$ |>>> |#\s*\d+\s)",
)
_CODE_LINE = re.compile(
    r"[{};]\s*$|^\s*(?:def|class|import|from|const|let|var|function|return|if \(|for \(|while \(|#include)\b"
    r"|\w+\([^)]{0,80}\)\s*(?:=>|\{|;)|\s(?:===?|!==?|&&|\|\||->|=>|::)\s"
)


# The same three in the other languages the summariser's proposals arrive in (German, French, Spanish, Italian,
# Portuguese, Dutch): the marks of someone else's word, a condition not met, a doubt; and a bot's post.
_ELSEWHERE = re.compile(
    r"^[^,;:]{0,60}\b(?:sagt|sagte|meint|schreibt|dit que|a dit|a écrit|dice que|dijo que|escribe|dice che"
    r"|ha detto|scrive|diz que|zegt dat)\b"
    r"|^(?:falls|angenommen|wenn wir (?:irgendwann|jemals|mal)|si (?:un jour|jamais|jamás|algún día|alguna vez)"
    r"|supposons|imaginons|supongamos|imagina|se (?:per caso|mai|un giorno)|supponiamo|caso (?:um dia|algum dia))\b"
    r"|\b(?:müssten|bräuchten|würden|faudrait|devrions|deberíamos|tendríamos que|haría falta|dovremmo|bisognerebbe"
    r"|teríamos de|zouden)\b"
    r"|\b(?:ich glaube|ich denke|bin mir (?:\w+ )?nicht sicher|vielleicht|wahrscheinlich|je crois|je pense|pas sûr"
    r"|peut-être|probablement|creo que|no (?:lo )?sé|quizás?|tal vez|probablemente|penso che|credo che"
    r"|non ne sono sicur[oa]|forse|probabilmente|acho que|talvez|misschien)\b"
    r"|^\[[\w -]{0,30}bot\]|^¿",
    re.I,
)


def not_own(sentence: str) -> bool:
    """Whether ``sentence`` is someone else's rule, a hypothetical, a hedge, or a line of code or of a log:
    words that set nothing for the speaker."""
    text = normalise(sentence).strip()
    return bool(
        text.endswith("?")
        or _ELSEWHERE.search(text)
        or _REPORTED.search(text)
        or _HYPOTHETICAL.search(text)
        or _HEDGE.search(text)
        or _LOG_LINE.match(text)
        or _CODE_LINE.search(text)
    )


# --- polarity ----------------------------------------------------------------------------------------------

_NEGATION = re.compile(
    r"\b(?:never|don't|do not|dont|doesn't|does not|didn't|mustn't|must not|shouldn't|should not|can't|cannot"
    r"|can not|won't|will not|may not|no|not|nobody|no one|nothing|none|without|avoid|avoiding|stop|stopped"
    r"|quit|refrain|skip|drop|forbidden|prohibited|banned|ban|disallowed|off-limits|no longer|no more)\b",
    re.I,
)
# Negations that do not refuse what the sentence names: "not only", "no later than", "never mind", "not too".
_NOT_REFUSING = re.compile(
    r"\b(?:not only|no later than|no earlier than|no more than|no less than|not more than|not less than"
    r"|not exceed|never exceed|not go (?:over|above|beyond)|no matter|never mind|not too|if not|whether or not"
    r"|or not|no problem|no worries|not a problem|no need to worry|don't worry|don't hesitate|do not hesitate"
    r"|don't forget|do not forget|no doubt|not just)\b",
    re.I,
)
_DOUBLE = re.compile(r"\b(?:no longer|not anymore|not any more)\b[^.;]{0,80}\b(?:not|never|don't|avoid)\b", re.I)


@functools.lru_cache(maxsize=8192)
def negated(sentence: str) -> bool:
    """Whether ``sentence`` forbids, refuses or drops what it names ("Don't answer in French", "Never use
    tabs", "Avoid metric units", "no emojis"); a limit's own words ("no more than", "never exceed") and idioms
    ("never mind", "don't forget to") do not count. A double negative ("no longer avoid") points forward."""
    text = _NOT_REFUSING.sub(" ", normalise(sentence))
    count = len(_NEGATION.findall(text))
    if _DOUBLE.search(text):
        return False
    return count % 2 == 1 if count <= 3 else True
