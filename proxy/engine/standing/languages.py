"""Which languages the readers of standing instructions read, and telling the operator where one does not apply.

The deterministic reader (``proxy.engine.standing.ledger.extract``: its cues, lexicon and slots) reads English
only (``READ``). The summary model's proposals (``proxy.engine.standing.proposals``) read any language the model
reads. A user or system message in another language sets nothing through the deterministic reader, so the
operator is told, per conversation:

* in the log, once per (conversation, language) per process (``notice``), with no message content;
* in the admin view of the conversation's ledger (``tally``: its user and system messages by language the
  deterministic reader does not read, counted on demand from the stored messages).

``detect`` names a text's language (ISO 639-1) with lingua (``lingua-language-detector``): built once, lazily
(or at a server's startup: ``warm_up``), from a restricted set of languages (``LANGUAGES``) in its low-accuracy
mode (trigram models only: 0.3-0.7 s and about 30 MB on 2 cores, against 6 s and 400 MB with every n-gram
model, and as sure on sentences of the length read here; about 0.1 ms a sentence). It reads only the speaker's
own prose (``speech.own_prose``), at most ``MAX_PROSE`` characters of it, and answers None for a text with fewer
than ``MIN_LETTERS`` letters or when lingua is not sure (``MIN_CONFIDENCE``): a short "ok danke" or a sentence
half in one language and half in another names none. CPU work: it runs where extraction runs, in a worker
thread (``flow.said_all``), only on a message the deterministic reader took nothing from; the admin view's
count runs in one too.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from proxy.engine.standing.speech import own_prose

if TYPE_CHECKING:
    from lingua import LanguageDetector

log = logging.getLogger("lcm_proxy.standing")

READ = frozenset({"en"})  # what the deterministic reader reads (ISO 639-1)
# Whose messages are read for the user's standing word (``ledger.SETTERS`` less the assistant: its turns set
# only its own plan and decisions, and are never the user's instructions).
SPEAKERS = frozenset({"user", "system", "developer"})
# The languages ``detect`` tells apart: those people most often write to a model in. A language outside the set
# is named as the nearest one in it (still not English, which is what the operator is told about); a smaller
# set builds faster and confuses less.
LANGUAGES = (
    "ENGLISH", "GERMAN", "FRENCH", "SPANISH", "ITALIAN", "PORTUGUESE", "DUTCH", "POLISH", "CZECH", "RUSSIAN",
    "UKRAINIAN", "TURKISH", "SWEDISH", "DANISH", "BOKMAL", "FINNISH", "JAPANESE", "CHINESE", "KOREAN", "ARABIC",
    "HINDI", "VIETNAMESE", "INDONESIAN",
)  # fmt: skip
MAX_INPUT = 8_000  # characters of a message whose own prose is looked at
MAX_PROSE = 1_000  # characters of own prose detected on: lingua is as sure on a paragraph as on a page
MIN_LETTERS = 20  # fewer and the text is a greeting, a name, a command: no language to speak of
MIN_CONFIDENCE = 0.95  # lingua's confidence in its first choice, below which ``detect`` says None
MAX_NOTICED = 10_000  # (conversation, language) pairs remembered for ``notice``; the oldest are forgotten

_build_lock = threading.Lock()
_detector: LanguageDetector | None = None
_noticed: OrderedDict[tuple[str, str], None] = OrderedDict()
_noticed_lock = threading.Lock()


def detector() -> LanguageDetector:
    """The one detector of the process, built on first use (in whichever thread asks first)."""
    global _detector
    if _detector is None:
        with _build_lock:
            if _detector is None:
                from lingua import Language, LanguageDetectorBuilder

                builder = LanguageDetectorBuilder.from_languages(*(getattr(Language, name) for name in LANGUAGES))
                # Every model loaded now, in this call, rather than each on the first text that needs it.
                _detector = builder.with_low_accuracy_mode().with_preloaded_language_models().build()
    return _detector


def warm_up() -> None:
    """Build the detector and load simplemma's English dictionary, running each once (~0.6-1 s on 2 cores): a
    server does it at startup, in a worker thread, so that no request waits for them."""
    detect("Antworte bitte ab jetzt immer auf Deutsch.")
    english_share("never push to main")


def _letters(text: str) -> int:
    """Letters in ``text``, an ideograph, kana or hangul syllable counting for two (each is about a word)."""
    return sum((2 if ord(ch) >= 0x2E80 else 1) for ch in text if ch.isalpha())


def detect(text: str) -> str | None:
    """The language of ``text`` (ISO 639-1, lower case), or None: too few letters, or lingua not sure."""
    sample = " ".join(text[:MAX_PROSE].split())
    if _letters(sample) < MIN_LETTERS:
        return None
    values = detector().compute_language_confidence_values(sample)
    if not values or values[0].value < MIN_CONFIDENCE:
        return None
    return str(values[0].language.iso_code_639_1.name).lower()


ENGLISH_SHARE = 0.5  # a sentence fewer of whose words are English than this is not read
ENGLISH_SHARE_IN_FOREIGN = 0.8  # nor, in a message in another language, one less English than this
_WORD = re.compile(r"[^\W\d_]{2,}")


def foreign(sentence: str, message_language: str | Callable[[], str | None] | None = None) -> bool:
    """Whether the deterministic reader must leave ``sentence`` alone: few of its words are English words
    (simplemma's English dictionary, sure on a few words where lingua's character statistics are not: in its
    fast mode lingua named "The database password must never be logged." Italian), or its message is in
    another language (``message_language``, by ``detect`` on the whole message) and it is not plainly English.
    "Eine Regel: Pusht niemals direkt auf main." is left alone; "no emojis pls", "Use tabs." and fragments of
    one or two words are read. The dictionary knows many loanwords ("Il budget è di 4200 euro." passes), so a
    short Romance sentence in an English conversation may still be read."""
    words = _WORD.findall(sentence[:MAX_PROSE])
    # Names say nothing of the language ("Brightline's signatory is Omar Haddad"): capitalised words after the
    # first are left out (German nouns with them, which leaves German's own small words to tell).
    plain = words[:1] + [w for w in words[1:] if not w[0].isupper()]
    if len(words) < 3 or len(plain) < 2:
        return False
    share = english_share(" ".join(plain))
    if share < ENGLISH_SHARE:
        return True
    if share >= ENGLISH_SHARE_IN_FOREIGN:
        return False  # plainly English, whatever the message's language: the language need not be known
    return unread(message_language() if callable(message_language) else message_language)


def english_share(text: str) -> float:
    """The share of ``text``'s words that are English words or inflections of them (simplemma's dictionary;
    lower-cased, since it passes over capitalised words as names)."""
    from simplemma import in_target_language

    return float(in_target_language(text.lower(), lang="en"))


def spoken(role: str, text: str) -> str | None:
    """The language of a message's own prose (not its code, quotes or pasted material) when ``role`` is one
    whose standing word the ledger reads, else None."""
    if role not in SPEAKERS or not text:
        return None
    prose = own_prose(text[:MAX_INPUT])
    sample = " ".join(prose[:MAX_PROSE].split())
    if _letters(sample) >= MIN_LETTERS and english_share(sample) >= ENGLISH_SHARE_IN_FOREIGN:
        return (
            "en"  # plainly English (the dictionary is sure where lingua's fast mode may not be), at a tenth of the cost
        )
    return detect(prose)


def unread(language: str | None) -> bool:
    """Whether ``language`` is one the deterministic reader does not read."""
    return language is not None and language not in READ


def tally(messages: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Of ``messages`` (role, text), those whose standing word the deterministic reader does not read, by
    language, most first (then by name)."""
    counts: Counter[str] = Counter()
    for role, text in messages:
        language = spoken(role, text) if role in SPEAKERS else None
        if language is not None and unread(language):
            counts[language] += 1
    return {language: n for language, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def notice(conversation_id: str, languages: Iterable[str | None]) -> None:
    """Log, once per (conversation, language) in this process, that the conversation has messages in a
    language the deterministic reader does not read. Ids and language codes only, never content."""
    for language in dict.fromkeys(language for language in languages if language is not None):
        if not unread(language):
            continue
        key = (conversation_id, language)
        with _noticed_lock:
            if key in _noticed:
                continue
            _noticed[key] = None
            if len(_noticed) > MAX_NOTICED:
                _noticed.popitem(last=False)
        log.info(
            "messages in %s are not read by the deterministic reader; only the summary model's proposals can set"
            " standing instructions from them (conversation=%s)",
            language,
            conversation_id,
        )
