"""A compaction engine on a scratch store, and the summarizers and turns its tests drive it with."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from proxy.config.lcm import LcmSettings
from proxy.engine.engine import Budget, ContextEngine
from proxy.errors import UpstreamError
from proxy.store.location import Location
from tests.support.engine import assistant, located, user

SETTINGS = LcmSettings(
    fresh_tail_count=4,
    leaf_chunk_tokens=400,
    leaf_target_tokens=60,
    condensed_target_tokens=80,
    leaf_min_fanout=3,
    condensed_min_fanout=2,
    tool_result_token_threshold=100,
    large_file_token_threshold=2000,
    fallback_max_tokens=60,
    summary_timeout=0.5,
)


class Scripted:
    """A summarizer whose behaviour each test chooses."""

    model = "summary-model"

    def __init__(self, behaviour: str = "ok") -> None:
        self.behaviour = behaviour
        self.calls = 0

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        self.calls += 1
        match self.behaviour:
            case "ok":
                return "Short summary of the discussion."
            case "timeout":
                await asyncio.sleep(5)
            case "401":
                raise UpstreamError("Incorrect API key provided", status=401)
            case "500":
                raise UpstreamError("The server had an error", status=500)
            case "empty":
                return ""
            case "longer":
                return user + " and even more words " * 50
            case "reasoning":
                return "<think>I should summarise this carefully, the user talked about many things.</think>"
        raise AssertionError(self.behaviour)

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A document."


def long_turns(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append(user(f"Question {i}: " + "please consider the following details carefully. " * 6))
        out.append(assistant(f"Answer {i}: " + "here is a thorough response with several points. " * 6))
    return out


async def open_context_engine(
    where: Path | Location, settings: LcmSettings = SETTINGS
) -> tuple[ContextEngine, Any, Any]:
    """An engine on a fresh store (a data directory: SQLite there); (engine, store, payload store). The stores
    are typed ``Any``: tests reach into either backend."""
    store, files = located(where).stores()
    await store.open()
    return ContextEngine(store, files, settings), store, files


BIG = Budget(window=100_000, output_reserve=1000, tools=0)


class Held(Scripted):
    """A summarizer whose calls wait until the test lets them go (a slow local model)."""

    def __init__(self) -> None:
        super().__init__("ok")
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        self.waiting.set()
        await self.release.wait()
        return await super().complete(system=system, user=user, max_tokens=max_tokens, temperature=temperature)


HARD = Budget(window=2500, output_reserve=300, tools=0)  # long_turns(30) is over it: inline compaction
