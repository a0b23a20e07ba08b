"""What a model reads in a text: look-alike letters as the letters they pass for, invisible characters gone."""

from __future__ import annotations

_INVISIBLE = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u202e", "\u202d", "\u2066", "\u2069"}


_READS_AS = str.maketrans(
    {"\u0456": "i", "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0441": "c", "\u0440": "p",
     "\u2039": "<", "\u203a": ">", "\u27e8": "<", "\u27e9": ">", "\u2329": "<", "\u232a": ">", "\u3008": "<",
     "\u3009": ">", "\uff3b": "[", "\u0455": "s", "\u057d": "u",
     "\u13da": "S", "\u1d1c": "u", "\u043c": "m", "\u0251": "a", "\u0433": "r"}
)  # fmt: skip


def as_read(text: str) -> str:
    """What a model reads in ``text``: look-alikes as the letters they pass for, invisible characters gone."""
    import unicodedata

    kept = "".join(c for c in text if c not in _INVISIBLE and unicodedata.category(c) not in ("Cf", "Mn", "Me"))
    decomposed = unicodedata.normalize("NFKD", kept)  # accents and combining strokes split off, then dropped
    return "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Me")).translate(_READS_AS)
