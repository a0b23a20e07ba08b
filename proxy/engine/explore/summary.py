"""The entry point of exploration: the summary placed in a file stub, from the explorer its kind calls for.

Structured data and code never reach the LLM; free text does while the request's ``ExplorationBudget``
allows, and gets the deterministic excerpts whenever the LLM fails or babbles. The parsing runs in worker
threads: megabytes of it must not stall the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Protocol

from proxy.engine.explore.code import explore_code
from proxy.engine.explore.excerpts import explore_text_fallback
from proxy.engine.explore.kinds import classify
from proxy.engine.explore.output import finish
from proxy.engine.explore.structured import explore_structured
from proxy.engine.injection import remove_instruction_overrides

log = logging.getLogger("lcm_proxy.explore")


class TextSummarizer(Protocol):
    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str: ...


_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)


def _strip_thinking(text: str) -> str:
    text = _THINK.sub("", text)
    # Some templates emit only the closing tag; the reasoning is everything before it.
    return text.rsplit("</think>", 1)[-1].strip()


class CallCap(Protocol):
    """The hourly cap on summary-model calls (``proxy.engine.summarize.Guard``)."""

    def take_call(self, conversation_id: str) -> bool: ...


class ExplorationBudget:
    """What one request may spend on LLM exploration: at most ``calls`` summary-model calls, none after
    ``seconds`` from the budget's creation (a call started earlier is cut off then), and each one charged to
    ``cap`` under ``key``. Past the budget, free text gets the deterministic summary."""

    def __init__(
        self,
        calls: int,
        seconds: float,
        cap: CallCap | None = None,
        key: str = "explore",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.calls_left = calls
        self.deadline = clock() + seconds
        self.cap = cap
        self.key = key
        self.clock = clock

    def take(self) -> float | None:
        """Spend one call: the seconds it may take, or None when no call may be made."""
        remaining = self.deadline - self.clock()
        if self.calls_left <= 0 or remaining <= 0:
            return None
        if self.cap is not None and not self.cap.take_call(self.key):
            return None
        self.calls_left -= 1
        return remaining


CLASSIFY_OFF_LOOP = 64 << 10  # characters: classifying may parse up to SNIFF_LIMIT of JSON


async def exploration_summary(
    name: str,
    mime: str | None,
    content: str,
    summarizer: TextSummarizer | None,
    *,
    max_tokens: int = 400,
    budget: ExplorationBudget | None = None,
) -> str:
    """The summary placed in a file stub. Structured data and code never reach the LLM; free text does while
    ``budget`` (when given) allows."""
    # Parsing megabytes is CPU work: keep it off the event loop.
    if len(content) > CLASSIFY_OFF_LOOP:
        kind = await asyncio.to_thread(classify, name, mime, content)
    else:
        kind = classify(name, mime, content)
    if kind == "code":
        return await asyncio.to_thread(explore_code, name, content)
    if kind != "text":
        return await asyncio.to_thread(explore_structured, kind, content)
    timeout = budget.take() if summarizer is not None and budget is not None else None
    if summarizer is not None and (budget is None or timeout is not None):
        try:
            call = summarizer.summarize_text(content, name=name, max_tokens=max_tokens)
            raw = await (call if timeout is None else asyncio.wait_for(call, timeout))
            summary = _strip_thinking(raw) if isinstance(raw, str) else ""
            # Far over budget means the model ignored the instructions (or echoed the document).
            if summary and len(summary) <= 16 * max_tokens:
                # A model-written description of untrusted text goes into every forwarded stub of the file.
                lines = ["Kind: text (LLM summary)", remove_instruction_overrides(summary)]
                return finish(lines, 16 * max_tokens + 64)
        except Exception as error:  # a timeout or an upstream error: the excerpts below stand in
            log.warning(
                "exploration summary of a %d-character document failed (%s); using excerpts",
                len(content),
                type(error).__name__,
            )
    return await asyncio.to_thread(explore_text_fallback, content)
