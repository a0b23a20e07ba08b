"""Ingest cost per request as the transcript grows.

Every request re-sends the whole transcript. The proxy must only hash the unchanged prefix (one canonical
serialisation + SHA-256 per message, and a binary search of indexed lookups), never re-insert it. The
baseline in the same run is the cold ingest of the whole transcript (every message inserted), and the
pure hashing cost alone; the ratio columns show what a warm request costs relative to them.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.engine.canonical import chain_hashes
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.store.files import FileStore
from proxy.store.sqlite.store import SQLiteStore
from proxy.tokens import count_text

SIZES = (10, 100, 1000, 5000)


def transcript(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": f"Message {i}: " + "some ordinary conversational text " * (4 + i % 9)})
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


async def measure(n: int, repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp))
        await store.open()
        ingestor = Ingestor(store, FileStore(Path(tmp)), Thresholds(25000, 2000))
        messages = transcript(n)
        start = time.perf_counter()
        await ingestor.ingest("bench", messages)
        cold = time.perf_counter() - start

        resend, cont, hashing = [], [], []
        for r in range(repeats):
            start = time.perf_counter()
            await ingestor.ingest("bench", messages)
            resend.append(time.perf_counter() - start)
            messages = [
                *messages,
                {"role": "assistant", "content": f"reply {r}"},
                {"role": "user", "content": f"next {r}"},
            ]
            start = time.perf_counter()
            await ingestor.ingest("bench", messages)
            cont.append(time.perf_counter() - start)
            start = time.perf_counter()
            chain_hashes("bench", messages[1:])
            hashing.append(time.perf_counter() - start)
        await store.close()
    return {
        "cold": cold,
        "resend": statistics.median(resend),
        "continue": statistics.median(cont),
        "hashing": statistics.median(hashing),
    }


def main(quick: bool = False) -> None:
    repeats = 5 if quick else 21
    count_text("warm up the tokenizer outside the measurements")
    print("\n## ingest: cost per request vs transcript length (median of", repeats, "requests)\n")
    print("| messages | cold ingest ms (baseline) | re-send ms | continue +2 ms | hashing alone ms | continue / cold |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in SIZES:
        r = asyncio.run(measure(n, repeats))
        print(
            f"| {n} | {ms(r['cold'])} | {ms(r['resend'])} | {ms(r['continue'])} | {ms(r['hashing'])} |"
            f" {r['continue'] / r['cold']:.2f} |"
        )
