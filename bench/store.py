"""Store cost per request, PostgreSQL vs SQLite, as the transcript grows.

The hot path of every request through the store is the engine's ingest of the re-sent transcript plus one
new message: hash the transcript, find the stored conversation by the longest stored prefix (a binary search
of indexed lookups), then one write transaction (the identity and conversation locks on PostgreSQL) that
appends the new message. On SQLite that is a local file behind one serialised writer; on PostgreSQL every
lookup is a round trip to a server process (here on loopback, on the same two cores), which is the price of
several replicas sharing one database. Both backends run the same ingest code, in the same run, one after the
other for each size, on conversations of 10, 100, 1,000 and 5,000 messages built beforehand (the cold ingest
of the whole conversation, shown for reference). ``python -m bench store [--database URL]``: without a URL,
on a throwaway cluster (tests/support/pg_cluster.py); with one, in a database created on that server for the run
and dropped afterwards (the role needs CREATEDB).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.ingest import SIZES, ms, transcript
from bench.load import fresh_database
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.store.location import Location
from proxy.tokens import count_text


async def measure(location: Location, n: int, repeats: int) -> dict[str, float]:
    """Cold ingest of ``n`` messages, then the median of ``repeats`` requests that each re-send the
    transcript with one new message."""
    store, files = location.stores()
    await store.open()
    try:
        ingestor = Ingestor(store, files, Thresholds(25000, 2000))
        tenant = f"bench-{n}"  # one conversation per size, even in one database
        messages = transcript(n)
        start = time.perf_counter()
        first = await ingestor.ingest(tenant, messages)
        cold = time.perf_counter() - start
        times = []
        for r in range(repeats):
            role = "user" if len(messages) % 2 else "assistant"
            messages = [*messages, {"role": role, "content": f"new message {r}: a short one"}]
            start = time.perf_counter()
            result = await ingestor.ingest(tenant, messages)
            times.append(time.perf_counter() - start)
            if (result.action, result.appended, result.conversation_id) != ("append", 1, first.conversation_id):
                raise RuntimeError(f"expected one message appended to {first.conversation_id}, got {result}")
    finally:
        await store.close()
    return {"cold": cold, "continue": statistics.median(times), "p95": sorted(times)[int(len(times) * 0.95)]}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench store", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database",
        metavar="URL",
        help="a PostgreSQL server on which the run creates and drops a database of its own (the role needs"
        " CREATEDB); default: a throwaway cluster (tests/support/pg_cluster.py)",
    )
    return parser.parse_args(argv)


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    args = parse_args(argv or [])
    repeats = 5 if quick else 41
    count_text("warm up the tokenizer outside the measurements")
    rows: list[tuple[int, dict[str, float], dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp, fresh_database(args.database) as url:
        for n in SIZES:
            sqlite = asyncio.run(measure(Location(Path(tmp) / f"s{n}"), n, repeats))
            postgres = asyncio.run(measure(Location(Path(tmp) / f"p{n}", url), n, repeats))
            rows.append((n, sqlite, postgres))
    print(
        f"\n## store: ingest of a re-sent transcript + one new message, PostgreSQL vs SQLite (median of {repeats}"
        " requests; PostgreSQL on loopback, same machine)\n"
    )
    print(
        "| messages | SQLite ms | PostgreSQL ms | PostgreSQL / SQLite | SQLite p95 ms | PostgreSQL p95 ms"
        " | cold ingest SQLite ms | cold ingest PostgreSQL ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, s, p in rows:
        print(
            f"| {n} | {ms(s['continue'])} | {ms(p['continue'])} | {p['continue'] / s['continue']:.2f} |"
            f" {ms(s['p95'])} | {ms(p['p95'])} | {ms(s['cold'])} | {ms(p['cold'])} |"
        )
