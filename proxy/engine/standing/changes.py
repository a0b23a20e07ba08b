"""Sentences that change what holds without stating a new instruction the reader recognises.

Never worse than silence: a value the user replaced or lifted must not be shown as current. Two readings
here make sure of it when the sentence reader (``proxy.engine.standing.slots``) finds no instruction of its own:

* ``lifted``: a revocation ("forget what I said about tabs", "the APAC rule no longer applies", "no need to
  pin digests anymore"; "you can use npm again" the sentence reader reads as a permission): what it is about,
  so that the items about it stop being in force;
* ``changes``: a sentence that says something changed ("actually, the demo moved to Thursday", "switch the
  report to weekly instead"): kept beside the items it is about, after them, under a header that says later
  lines override earlier ones, when the reader cannot tell what exactly it replaces.

Both run on one sentence (~300 characters) with bounded repetitions.
"""

from __future__ import annotations

import re

_WHAT = r"(?P<topic>[^.;!?]{2,80}?)"
_LIFT = (
    re.compile(
        r"\b(?:forget|ignore|disregard|scrap|scratch|drop|cancel|lift|remove|undo|revoke|retract|withdraw|skip)\s+"
        r"(?:about\s+|what i (?:said|wrote|told you) (?:about|regarding|on)\s+|everything (?:i said )?about\s+"
        r"|(?:the|that|my|our)\s+(?:earlier\s+|previous\s+|old\s+|last\s+)?(?:bit|part|thing|rule|note|instruction"
        r"|request|requirement|constraint|restriction|limit|preference|ban|policy)s?\s+(?:about|on|regarding|for"
        r"|against)\s+)" + _WHAT + r"\s*(?:[.;!?,]|$)",
        re.I,
    ),
    re.compile(
        r"^(?:the\s+|that\s+|my\s+|our\s+)?" + _WHAT + r"\s+(?:rule|thing|requirement|restriction|constraint|limit|ban"
        r"|policy)?\s*(?:no longer applies|doesn't apply any ?more|does not apply any ?more|is no longer (?:a rule"
        r"|required|needed|necessary|in force|a thing|a requirement|mandatory|frozen|off[- ]limits|banned|forbidden"
        r"|prohibited|restricted|locked|blocked|an issue|a problem|a concern|relevant|applicable|in place)"
        r"|is off the table|is lifted"
        r"|(?:is|has been) (?:cancell?ed|dropped|scrapped|lifted|removed|revoked)|is gone|is history)\b",
        re.I,
    ),
    # "'per my last email' is fine again", "the payments API isn't frozen anymore", "diagrams are not
    # necessary anymore", "the summary doesn't have to be in the first line any more", "X can be lifted"
    re.compile(
        r"^(?:(?:ok(?:ay)?|so|and|also|oh|actually)[\s,]+)*(?:the\s+|that\s+|our\s+|my\s+)?"
        + _WHAT
        + r"\s+(?:(?:is|are|'s)\s+(?:fine|ok|okay|acceptable|welcome|back)\s+again"
        r"|(?:isn't|is not|aren't|are not)\s+(?:\w+\s+)?(?:any ?more|any longer)"
        r"|(?:doesn't|does not|don't|do not)\s+(?:have|need) to\s+[^.;!?]{0,60}?\s+any ?(?:more|longer)"
        r"|can be (?:lifted|dropped|removed|ignored))\b",
        re.I,
    ),
    re.compile(
        r"\b(?:no need to|you (?:don't|do not) (?:have|need) to|stop)\s+"
        + _WHAT
        + r"\s+(?:any ?more|any longer|from now on)\b",
        re.I,
    ),
    re.compile(r"^(?:ok(?:ay)?,?\s+)?never mind (?:about\s+|the\s+)?" + _WHAT + r"\s*(?:[.;!]|$)", re.I),
    # "forget the semicolon rule", "scratch the two-screenshot limit on tickets", "no more the rule for weekends"
    re.compile(
        r"\b(?:forget|ignore|disregard|scrap|scratch|drop|cancel|lift|remove|undo|revoke|retract|withdraw|ditch"
        r"|no more)\s+(?:the|that|my|our|this)\s+" + _WHAT + r"\s+(?:rule|thing|bit|limit|cap|ceiling|requirement"
        r"|restriction|constraint|ban|policy|business|preference|instruction)s?\b",
        re.I,
    ),
    re.compile(
        r"\bno more\s+(?:the\s+)?(?:rule|limit|ban|restriction)s?\s+(?:for|on|about|against)\s+"
        + _WHAT
        + r"\s*(?:[.;!?,]|$)",
        re.I,
    ),
    # "scratch the friday deploys, …", "forget the blue theme": the thing itself, when it is not "it" or "that"
    re.compile(
        r"^(?:(?:ok(?:ay)?|so|and|oh|also|actually)[\s,]+)*(?:forget|scratch|scrap|disregard|ignore)\s+"
        r"(?!(?:it|that|this|them|those|everything|all|about|what)\b)" + _WHAT + r"\s*(?:[.;!?,]|$)",
        re.I,
    ),
)
_CHANGE = re.compile(
    r"\b(?:instead(?! of)|any ?more|any longer|no longer|from now on|going forward|correction|scratch that"
    r"|chang(?:ed|ing) (?:it |that |this |the \w+ )?to|change (?:it|that|this|the \w+) to|switch(?:ed|ing)? (?:\w+ )?to"
    r"|mov(?:ed|ing) (?:it |that |this |the \w+ )?to|move (?:it|that|this|the \w+) to"
    r"|^\W*(?:(?:ok(?:ay)?|so|oh|wait|hmm)[,\s]+)?actually|update:|updated|revised|bump(?:ed)? (?:it )?to"
    r"|rais(?:e|ed) (?:it )?to|lower(?:ed)? (?:it )?to|increas(?:e|ed) (?:it )?to|reduc(?:e|ed) (?:it )?to"
    r"|cut (?:it )?to|push(?:ed)? (?:it )?(?:back )?to|postpon(?:e|ed) (?:it )?to|is now|are now"
    r"|now (?:is|are|it's|at|on|in)|not \w+ but|rather than|replac(?:e|ed|es) (?:it |that )?(?:with|by)"
    r"|(?<!come )(?<!get )(?<!go )back to (?=\d|the (?:old|original|previous)|[\w-]+ \d)"
    r"|(?:got|was|has been|been) (?:bumped|raised|lowered|cut|moved|changed|increased|reduced|pushed)"
    r"|can (?:now )?go (?:up )?to|\bmake (?:it|that|this|them) (?:\w+ )?\d|(?:raise|lower|increase|reduce|cut|bump)"
    r" (?:it |that |this |the [\w-]+ )?by \d"
    r"|^(?:\w+\s+){0,2}(?:make|set|bump|raise|lower) (?:the )?[\w-]+(?: [\w-]+)? (?:to )?\d)\b"
    r"|\bnow\s*[.!]*$",
    re.I,
)


def lifted(sentence: str) -> str | None:
    """What a revocation lifts ("tabs", "the APAC region"), or None when ``sentence`` revokes nothing."""
    for pattern in _LIFT:
        if match := pattern.search(sentence):
            return match.group("topic").strip()
    return None


_HISTORY = re.compile(
    r"\b(?:yesterday|last (?:week|month|year|time|night|sprint|quarter)|ago|back then|used to)\b", re.I
)


def changes(sentence: str) -> bool:
    """Whether ``sentence`` says that something changed (an update the reader may not recognise); what
    changed in the past ("moved to GitHub Actions last year") is history, not a change of what holds."""
    if sentence.rstrip().endswith("?") or _HISTORY.search(sentence):
        return False
    return _CHANGE.search(sentence) is not None
