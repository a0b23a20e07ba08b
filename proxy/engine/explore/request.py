"""The exploration of one request's payloads (``proxy.engine.ingest``): each payload once, an exploration stored
before reused, and summary-model calls within the request's budget (and the breaker's say)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from proxy.engine.explore.summary import ExplorationBudget, TextSummarizer, exploration_summary
from proxy.engine.intercept import Payload
from proxy.engine.summarize import Guard
from proxy.store.base import Reads


def request_explorer(
    q: Reads,
    guard: Guard | None,
    scope: str,
    summarizer: TextSummarizer | None,
    explorations: dict[str, str],
    max_tokens: int,
    calls: int,
    seconds: float,
) -> Callable[[Payload], Awaitable[str]]:
    """``explore(payload)``: its exploration summary, remembered in ``explorations`` (by file id); at most
    ``calls`` summary-model calls, none after ``seconds`` (each one also charged to ``guard``'s hourly cap)."""
    budget = ExplorationBudget(calls, seconds, guard, f"explore:{scope}")

    async def explore(payload: Payload) -> str:
        if payload.file_id in explorations:  # the same payload twice in one request
            return explorations[payload.file_id]
        known = await q.file(scope, payload.file_id)
        if known is not None and known.exploration:
            summary = known.exploration
        elif payload.text is None:
            summary = f"Kind: binary ({payload.mime}), {len(payload.data)} bytes."
        else:
            model = getattr(summarizer, "model", None)
            # A tool's output is described from its own lines (errors, head and tail), not by the summary
            # model: an agent's outputs come by the dozen, each one a call with the whole output as input,
            # while the agent can run the tool again and the recall tools read it back in full.
            usable = (
                summarizer is not None
                and payload.kind != "tool_output"
                and not (guard is not None and isinstance(model, str) and guard.breaker_open(model))
            )
            summary = await exploration_summary(
                payload.name,
                payload.mime,
                payload.text,
                summarizer if usable else None,
                max_tokens=max_tokens,
                budget=budget,
            )
        explorations[payload.file_id] = summary
        return summary

    return explore
