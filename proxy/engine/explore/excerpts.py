"""The deterministic summary of free text: counts, section headers and labelled head and tail excerpts.

It stands in whenever no LLM summary is usable (no summary model, the budget spent, a failed or babbling
call) and for structured data or code that would not parse, so it must not fail itself.
"""

from __future__ import annotations

import itertools
import logging
import re

from proxy.engine.explore.kinds import SNIFF_LIMIT
from proxy.engine.explore.output import clip, error_name, finish, redacted_prefix, redacted_suffix

log = logging.getLogger("lcm_proxy.explore")


def line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _sections(text: str) -> list[str]:
    found: list[str] = []
    previous = ""
    for line in itertools.islice(text.splitlines(), 50_000):
        stripped = line.strip()
        if re.match(r"#{1,6}\s+\S", stripped):
            found.append(stripped)
        elif re.fullmatch(r"(=+|-+)", stripped) and len(stripped) >= 3 and previous and len(previous) <= 80:
            found.append(previous)
        elif 3 <= len(stripped) <= 60 and stripped[0].isalnum() and stripped.isupper():
            found.append(stripped)
        previous = stripped
        if len(found) >= 20:
            break
    return found


def _head(text: str, n: int) -> str:
    window = redacted_prefix(text, n)
    if len(window) <= n:
        return window
    cut = max(window.rfind("\n", n // 2, n), window.rfind(" ", n // 2, n))
    return window[: cut if cut > 0 else n]


def explore_text_fallback(content: str, max_chars: int = 1600, *, note: str = "") -> str:
    """Counts, section headers and labelled head/tail excerpts: the summary when no LLM summary is usable."""
    try:
        lines = ["Kind: text (excerpts)"] + ([f"Note: {note}"] if note else [])
        lines.append(f"Size: {len(content)} chars, {line_count(content)} lines, {len(content.split())} words")
        head_text = content[:SNIFF_LIMIT]
        sections = [clip(s, 80) for s in _sections(head_text)]
        budget = max_chars // 3
        while sections and sum(len(s) + 3 for s in sections) > budget:
            sections.pop()
        if sections:
            lines += ["Sections:"] + [f"  {s}" for s in sections]
        used = sum(len(line) + 1 for line in lines) + 40
        size = max(0, min(500, (max_chars - used) // 2))
        if len(content) <= 2 * size:
            lines += ["Full text:", content]
        elif size:
            lines += ["Beginning:", _head(content, size), "…", "End:", redacted_suffix(content, size)]
        return finish(lines, max_chars)
    except Exception as error:  # the last fallback must not fail: a bug, or input it never met
        log.warning("the excerpts of %d characters failed (%s); size only", len(content), error_name(error))
        return f"Kind: text (excerpts)\nSize: {len(content)} chars"[:max_chars]
