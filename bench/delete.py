"""What a deletion costs, SQLite and PostgreSQL, as the store grows.

A deletion (``proxy.engine.deletion.Deleter``) is one write transaction that removes a conversation's rows,
then a *scrub* so that what was deleted does not linger: on SQLite each full-text index is merged whole (FTS5
``optimize``) and the write-ahead log is checkpointed and truncated; on PostgreSQL the tables a deletion
touches are ``VACUUM``ed. Both scrubs take time in proportion to what the store holds, not to what was
deleted, so the benchmark builds stores of growing size (many conversations of 50 messages each, ingested
with the real ``Ingestor``) and measures, on each: one conversation deleted as ``lcm-proxy delete`` does
(with its scrub), the same without the scrub, the scrub alone (after a deletion without one), and a
retention purge of a tenth of the conversations (one transaction each, one scrub at the end), and what one
tenant deleting does to another: the latency of a second tenant's ingests while a few conversations are
deleted one after another as ``DELETE /lcm/conversations/{id}`` does (the server's ``Deleter``, with its
background ``Scrubber`` where there is one), until their scrub is done. The baseline,
on the same store in the same run, is what a request through the store costs: the ingest of a re-sent
transcript plus one new message (as ``bench/store.py`` measures it). ``python -m bench delete [--database
URL]``: without a URL, on a throwaway cluster (tests/support/pg_cluster.py); with one, in databases created on that
server for the run and dropped afterwards (the role needs CREATEDB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.ingest import ms
from bench.load import fresh_database
from proxy.engine.deletion import Deleter

try:
    from proxy.engine.deletion import Scrubber
except ImportError:  # before the background scrub: the API's deletions scrubbed inline (a baseline run)
    Scrubber = None  # type: ignore[assignment,misc]
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.store.base import Store
from proxy.store.location import Location
from proxy.store.postgres.store import PostgresStore
from proxy.store.sqlite.store import SQLiteStore
from proxy.tokens import count_text

SIZES = (2000, 20000, 100000)  # messages in the store
QUICK_SIZES = (500, 2000)
LENGTH = 50  # messages per conversation
TENANTS = 10
DAY = 86400.0
SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "qui", "bel", "dor", "fen", "gar", "hin", "jus", "ple", "sto")
VOCABULARY = [a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES]


def conversation(c: int) -> list[dict[str, Any]]:
    """Conversation ``c``: its own opening (so identity matching never continues another one) and words drawn
    from a few thousand, common ones more often, so the full-text indexes hold many distinct terms."""
    rng = random.Random(c)
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(LENGTH):
        words = [VOCABULARY[int(len(VOCABULARY) * rng.random() ** 3)] for _ in range(rng.randint(8, 60))]
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": f"Conversation {c}, turn {i}: {' '.join(words)}."})
    return out


async def age(store: Store, ids: Sequence[str], seconds: float) -> None:
    """Move the last activity of ``ids`` back by ``seconds``: the bench's own UPDATE, on the store's own
    connection, behind the engine's back (there is no clock to wait for)."""
    if isinstance(store, SQLiteStore):
        await store.search_conn.executemany(
            "UPDATE conversations SET updated_at = updated_at - ? WHERE id = ?", [(seconds, cid) for cid in ids]
        )
        await store.search_conn.commit()
    elif isinstance(store, PostgresStore):
        async with store.pool.connection() as conn:
            await conn.execute(
                "UPDATE lcm.conversations SET updated_at = updated_at - %s WHERE id = ANY(%s)", (seconds, list(ids))
            )
    else:
        raise TypeError(f"no ageing for {type(store).__name__}")


class Warnings(logging.Handler):
    """Warnings of the deletion logger: a scrub that failed is logged, not raised, and would look cheap."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def no_warnings() -> Iterator[None]:
    handler = Warnings()
    logger = logging.getLogger("lcm_proxy.deletion")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.messages:
        raise RuntimeError(f"the deletions logged warnings: {handler.messages}")


@dataclass
class Costs:
    """Seconds, per operation."""

    build: float = 0.0
    ingest: list[float] = field(default_factory=list)
    delete: list[float] = field(default_factory=list)  # with its scrub
    bare: list[float] = field(default_factory=list)  # without
    scrub: list[float] = field(default_factory=list)
    purge: float = 0.0
    purged: int = 0
    during: list[float] = field(default_factory=list)  # another tenant's ingests while one deletes
    victims: int = 0


async def timed(coroutine: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await coroutine
    return time.perf_counter() - start, result


async def measure(location: Location, n: int, repeats: int, ingests: int) -> Costs:
    """Build a store of ``n`` messages, then measure on it (see the module docstring). Conversations
    ``[0, n/10)`` are purged at the end, the next ``2 * repeats`` deleted one by one, the rest continued."""
    costs = Costs()
    count = n // LENGTH
    purged = max(1, count // 10)
    if count < purged + 2 * repeats + 3:
        raise ValueError(f"{n} messages make too few conversations for {repeats} repetitions")
    victims = min(10, (count - purged - 2 * repeats) // 2)  # deleted while another tenant ingests
    store, files = location.stores()
    await store.open()
    try:
        ingestor = Ingestor(store, files, Thresholds(25000, 2000))
        deleter = Deleter(store, files)
        transcripts: dict[int, list[dict[str, Any]]] = {}
        ids: list[str] = []
        start = time.perf_counter()
        for c in range(count):
            transcripts[c] = conversation(c)
            result = await ingestor.ingest(f"bench-{c % TENANTS}", transcripts[c])
            if result.action != "new" or result.conversation_id is None:
                raise RuntimeError(f"conversation {c} was not stored as a new one: {result}")
            ids.append(result.conversation_id)
        costs.build = time.perf_counter() - start
        print(f"delete: {n} messages built on {location.kind} in {costs.build:.0f} s", file=sys.stderr, flush=True)

        continued = list(range(purged + 2 * repeats, count - victims))
        for r in range(ingests):
            c = continued[r % len(continued)]
            messages = transcripts[c]
            role = "user" if len(messages) % 2 else "assistant"
            messages.append({"role": role, "content": f"new message {r}: a short one"})
            took, result = await timed(ingestor.ingest(f"bench-{c % TENANTS}", messages))
            costs.ingest.append(took)
            if (result.action, result.appended, result.conversation_id) != ("append", 1, ids[c]):
                raise RuntimeError(f"expected one message appended to {ids[c]}, got {result}")

        with no_warnings():
            for r in range(repeats):
                one, other = ids[purged + 2 * r], ids[purged + 2 * r + 1]
                took, deleted = await timed(deleter.delete(None, one, via="cli"))
                costs.delete.append(took)
                took, bare = await timed(deleter.delete(None, other, via="cli", scrub=False))
                costs.bare.append(took)
                if deleted.messages != LENGTH or bare.messages != LENGTH:
                    raise RuntimeError(f"expected {LENGTH} messages deleted, got {deleted} and {bare}")
                took, _ = await timed(deleter.scrub())
                costs.scrub.append(took)

            costs.victims = victims
            costs.during = await while_deleting(store, files, ingestor, ids[count - victims :])

            await age(store, ids[:purged], 400 * DAY)
            costs.purge, done = await timed(deleter.purge(None, time.time() - 365 * DAY, via="retention"))
            costs.purged = len(done)
            if sorted(d.id for d in done) != sorted(ids[:purged]):
                raise RuntimeError(f"the purge deleted {len(done)} conversations, expected the {purged} aged ones")
    finally:
        await store.close()
    return costs


async def while_deleting(store: Store, files: Any, ingestor: Ingestor, victims: Sequence[str]) -> list[float]:
    """Seconds each ingest of tenant ``bench-other`` took while ``victims`` were deleted one after another, as
    the server's ``DELETE`` does, and scrubbed."""
    scrubber = Scrubber(store) if Scrubber is not None else None
    deleter = Deleter(store, files, scrubber) if scrubber is not None else Deleter(store, files)
    finished = asyncio.Event()

    async def deleting() -> None:
        ticket = 0
        for victim in victims:
            ticket = getattr(await deleter.delete(None, victim, via="api"), "ticket", 0)
        if scrubber is not None:
            await scrubber.wait(ticket)
            await scrubber.stop()
        finished.set()

    transcript = conversation(10**6)
    first = await ingestor.ingest("bench-other", transcript)
    if first.conversation_id is None:
        raise RuntimeError("the other tenant's conversation was not stored")
    took: list[float] = []
    task = asyncio.create_task(deleting())
    r = 0
    while not finished.is_set():
        role = "user" if len(transcript) % 2 else "assistant"
        transcript.append({"role": role, "content": f"other tenant's message {r}"})
        seconds, result = await timed(ingestor.ingest("bench-other", transcript))
        if result.appended != 1:
            raise RuntimeError(f"expected one message appended, got {result}")
        took.append(seconds)
        r += 1
    await task
    return took


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench delete", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database",
        metavar="URL",
        help="a PostgreSQL server on which the run creates and drops databases of its own (the role needs"
        " CREATEDB); default: a throwaway cluster (tests/support/pg_cluster.py)",
    )
    parser.add_argument("--sizes", help="messages in the store, comma-separated (default: 2000,20000,100000)")
    parser.add_argument("--sqlite-only", action="store_true", help="measure SQLite only")
    return parser.parse_args(argv)


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    args = parse_args(argv or [])
    sizes, repeats, ingests = (QUICK_SIZES, 3, 3) if quick else (SIZES, 7, 21)
    if args.sizes:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    count_text("warm up the tokenizer outside the measurements")
    rows: list[tuple[int, str, Costs]] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        server = args.database
        if server is None and not args.sqlite_only:
            from tests.support.pg_cluster import Cluster  # plain psycopg and the server binaries: no pytest

            server = stack.enter_context(Cluster()).dsn("postgres")
        for n in sizes:
            rows.append((n, "SQLite", asyncio.run(measure(Location(Path(tmp) / f"s{n}"), n, repeats, ingests))))
            if server is None:
                continue
            with fresh_database(server) as url:  # one database per size: the store holds n messages, no more
                postgres = asyncio.run(measure(Location(Path(tmp) / f"p{n}", url), n, repeats, ingests))
            rows.append((n, "PostgreSQL", postgres))
    print(
        f"\n## delete: cost of deleting vs one ingest, as the store grows (conversations of {LENGTH} messages;"
        f" median of {repeats} deletions and {ingests} ingests; PostgreSQL on loopback, same machine)\n"
    )
    print(
        "| messages | conversations | store | ingest of one message ms | delete one + scrub ms | × ingest"
        " | delete one, no scrub ms | × ingest | scrub alone ms | × ingest | purge of 10% ms | × ingest |"
    )
    print("|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, kind, costs in rows:
        base = statistics.median(costs.ingest)
        cells = [n, n // LENGTH, kind, ms(base)]
        for seconds in (
            statistics.median(costs.delete),
            statistics.median(costs.bare),
            statistics.median(costs.scrub),
            costs.purge,
        ):
            cells += [ms(seconds), f"{seconds / base:.1f}"]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")
    print(
        "\nThe purge deletes the oldest tenth of the conversations (aged beforehand), one transaction each, and"
        " scrubs once at the end."
    )
    print(
        "\n### another tenant's ingests while one tenant deletes (as DELETE /lcm/conversations/{id} does, until"
        " the deletions are scrubbed)\n"
    )
    print("| messages | store | deleted | ingests | ingest alone p50 ms | during p50 ms | × | during max ms | × |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|")
    for n, kind, costs in rows:
        base = statistics.median(costs.ingest)
        p50, worst = statistics.median(costs.during), max(costs.during)
        print(
            f"| {n} | {kind} | {costs.victims} | {len(costs.during)} | {ms(base)} | {ms(p50)} | {p50 / base:.1f}"
            f" | {ms(worst)} | {worst / base:.1f} |"
        )
