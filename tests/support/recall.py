"""Recall tools on a scratch store: a compacted conversation with a pasted log and a planted secret word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.config.lcm import LcmSettings
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.recall.scope import Scope
from proxy.engine.recall.tools import RecallTools
from proxy.store.location import Location
from tests.support.engine import assistant, located, user

SETTINGS = LcmSettings(
    fresh_tail_count=4,
    leaf_chunk_tokens=400,
    leaf_target_tokens=60,
    leaf_min_fanout=3,
    condensed_min_fanout=2,
    large_file_token_threshold=1000,
    tool_result_token_threshold=100,
)


BIG = Budget(window=100_000, output_reserve=1000, tools=0)


DOCUMENT = "".join(f"line {i}: the quick brown fox {i * 7}\n" for i in range(1, 801))


class Summarizer:
    model = "s"

    def __init__(self) -> None:
        self.last_user = ""

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        self.last_user = user
        if "Question:" in user:
            return "The answer is in msg_1. [cites msg_1]"
        return "Summary of an earlier discussion."

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A list of numbered lines."


async def setup(where: Path | Location, tenant: str = "alice") -> tuple[ContextEngine, RecallTools, Scope, str, str]:
    store, files = located(where).stores()
    await store.open()
    engine = ContextEngine(store, files, SETTINGS)
    transcript: list[dict[str, Any]] = [
        user(f'Here is the log <file name="app.log">{DOCUMENT}</file>'),
        assistant("Got it."),
        user("The secret word is PERIWINKLE."),
        assistant("Noted."),
    ]
    for i in range(12):
        transcript += [user(f"Filler question {i} " * 10), assistant(f"Filler answer {i} " * 10)]
    prepared = await engine.prepare(tenant, transcript, BIG, Summarizer())
    conversation = prepared.conversation_id or ""
    await engine.compactor.sweep(conversation, Summarizer())
    file_id = prepared.messages[0]["content"].split("[LCM File: ")[1].split(" ")[0]
    tools = RecallTools(store, files)
    return engine, tools, await tools.scope(tenant, conversation), conversation, file_id
