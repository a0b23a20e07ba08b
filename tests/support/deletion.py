"""Deleting conversations: an engine and a deleter on a scratch store, turns that carry planted markers, and
the raw bytes where a marker may linger."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from proxy.config.lcm import LcmSettings
from proxy.engine.deletion import Deleter
from proxy.engine.engine import Budget, ContextEngine
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
    large_file_token_threshold=1000,
)


BIG = Budget(window=100_000, output_reserve=1000, tools=0)


MARKER = re.compile(r"Zq\w+Wombat\d+")  # unique strings planted in what one conversation stores


class Echo:
    """A summarizer whose summaries repeat every marker of their sources: a planted marker reaches them."""

    model = "summary-model"

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        found = sorted(set(MARKER.findall(user)))
        return "Summary of the discussion" + (f", which mentions {', '.join(found)}." if found else ".")

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A document."


def turns(n: int, tag: str, marker: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        note = f" Remember {marker}." if marker and i == 1 else ""
        out.append(user(f"{tag} question {i}:{note} " + "please weigh the following details with care. " * 6))
        out.append(assistant(f"{tag} answer {i}: " + "here is a considered reply covering several points. " * 6))
    return out


async def open_engine(where: Path | Location) -> tuple[ContextEngine, Any, Any, Deleter]:
    store, files = located(where).stores()
    await store.open()
    return ContextEngine(store, files, SETTINGS), store, files, Deleter(store, files)


async def prepare(engine: ContextEngine, tenant: str, messages: list[dict[str, Any]]) -> str:
    prepared = await engine.prepare(tenant, messages, BIG, Echo())
    assert prepared.conversation_id is not None
    return prepared.conversation_id


def raw_bytes(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in data_dir.rglob("*") if p.is_file()}


def holding(data_dir: Path, marker: str) -> list[str]:
    """Files under ``data_dir`` whose bytes contain ``marker`` (as written, or folded as an index stores it)."""
    needles = {marker.encode(), marker.lower().encode(), marker.lower()[3:].encode()}
    return sorted(name for name, data in raw_bytes(data_dir).items() if any(n in data for n in needles))
