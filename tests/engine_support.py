"""Helpers for engine-level tests: a real SQLite store in the test's own data directory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from proxy.doctor import check_database
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.store.files import FileStore
from proxy.store.sqlite import SQLiteStore


class ScriptedSummarizer:
    """Counts calls; answers with a fixed, recognisable summary."""

    def __init__(self, answer: str = "A document about testing.") -> None:
        self.answer = answer
        self.calls = 0

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        self.calls += 1
        return self.answer


@contextlib.asynccontextmanager
async def open_engine(
    data_dir: Path, large: int = 25000, tool: int = 2000
) -> AsyncIterator[tuple[Ingestor, SQLiteStore, FileStore]]:
    store = SQLiteStore(data_dir)
    await store.open()
    files = FileStore(data_dir)
    try:
        yield Ingestor(store, files, Thresholds(large, tool)), store, files
        # Every database a test creates must pass doctor.
        problems = await check_database(store, files)
        assert problems == [], f"doctor found problems: {problems}"
    finally:
        await store.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def row_count(store: SQLiteStore, table: str, where: str = "", args: tuple[Any, ...] = ()) -> int:
    async with store.search_conn.execute(f"SELECT count(*) FROM {table} {where}", args) as cursor:
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}
