"""Values written in words, read with maintained parsers rather than hand lists.

``digits``: number words as digits ("keep spend under five hundred dollars" reads "under 500 dollars", "twenty-five
minutes max" reads "25 minutes max"), by ``text2num`` (its English grammar: compounds, "and", hundreds and
thousands), so that a limit said in words and its update said in figures have values of one type and compare.
"One" stays a word ("no one", "a one-off", "one more thing", "the first step": its threshold of 2), "two" and up
become figures.
"""

from __future__ import annotations

import functools

from text_to_num import alpha2digit  # type: ignore[import-untyped]


@functools.lru_cache(maxsize=4096)
def digits(text: str) -> str:
    """``text`` with its English number words as digits (the rest unchanged)."""
    try:
        return str(alpha2digit(text, "en", threshold=2))
    except (ValueError, IndexError):  # a parser error on odd input must not lose the sentence
        return text
