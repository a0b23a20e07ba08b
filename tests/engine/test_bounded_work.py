"""Bounded work per request, and payload files that tell a tenant nothing about other tenants (issue 12).

* Exploration: however many huge payloads one request carries, it makes at most a few summary-model calls,
  none after its exploration deadline, each charged to the hourly cap; the rest get deterministic summaries.
* A request with thousands of base64 parts does its CPU work and file writes off the event loop: ``/healthz``
  keeps answering within 100 ms while it is handled (measured here over a real socket).
* Files are published by the transaction that stores the rows naming them: a request that fails or is
  cancelled before that leaves no file behind, and a stored row never names a missing file.
* Content addressing is per tenant: storing a document another tenant already stored is a real write to a
  file of one's own, so neither the file system nor the timing reveals what others stored.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.config.lcm import LcmSettings
from proxy.engine.doctor import check_database
from proxy.engine.engine import ContextEngine
from proxy.engine.explore.summary import ExplorationBudget
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.engine.summarize import Guard
from proxy.store.files import PENDING, FileStore
from proxy.store.location import Location
from proxy.store.postgres.writes import PostgresWrites
from proxy.store.sqlite.store import SQLiteStore
from proxy.store.sqlite.writes import WriteTransaction
from proxy.wire.chat.limits import MAX_CONTENT_PARTS
from proxy.wire.http import PARSE_ON_LOOP_BYTES, parse_json_in_steps
from tests.support.engine import ScriptedSummarizer, open_engine, row_count, rows, run, user
from tests.support.fakes import FakeUpstream
from tests.support.proxies import make_config
from tests.support.servers import probe_healthz_while, serve_in_thread
from tests.support.transcripts import blocks

HEALTHZ_BOUND = 0.100  # seconds: the acceptance bound for /healthz under a 20,000-part request


def stored_files(data_dir: Path) -> set[str]:
    """Payload files on disk, as paths relative to the data dir (the pending folder excluded)."""
    root = data_dir / "files"
    if not root.exists():
        return set()
    return {
        p.relative_to(data_dir).as_posix()
        for p in root.rglob("*")
        if p.is_file() and PENDING not in p.relative_to(root).parts
    }


def pending_files(data_dir: Path) -> list[Path]:
    folder = data_dir / "files" / PENDING
    return [p for p in folder.iterdir()] if folder.exists() else []


async def file_rows(store: Any) -> list[tuple[str, str, str, str]]:
    return [
        (r[0], r[1], r[2], r[3]) for r in await rows(store, "SELECT id, tenant, sha256, path FROM files ORDER BY id")
    ]


async def stored_payloads(where: Location, store: Any) -> set[str]:
    """Paths of the published payloads: files on disk beside SQLite, rows of ``lcm.blobs`` in PostgreSQL."""
    if where.kind == "sqlite":
        return stored_files(where.data_dir)
    return {r[0] for r in await rows(store, "SELECT path FROM blobs")}


# --- A. exploration per request ------------------------------------------------------------------------


def test_three_hundred_file_blocks_make_at_most_a_few_summary_calls(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where, large=100) as (ingestor, store, _files):
            summarizer = ScriptedSummarizer("Minutes of a committee meeting.")
            result = await ingestor.ingest("t", [user(blocks(300))], summarizer=summarizer)
            assert summarizer.calls == 4
            assert Thresholds(0, 0).exploration_calls == 4
            forwarded = result.messages[0]["content"]
            assert forwarded.count("[LCM File: file_") == 300  # every block is still stubbed and stored
            assert forwarded.count("Kind: text (LLM summary)") == 4
            assert forwarded.count("Kind: text (excerpts)") == 296  # the rest: deterministic summaries
            assert "lcm-exploration" not in forwarded and "\x00" not in forwarded
            assert await row_count(store, "files") == 300

    run(scenario())


def test_exploration_calls_are_charged_to_the_hourly_cap(where: Location) -> None:
    async def scenario() -> None:
        settings = LcmSettings(
            large_file_token_threshold=100, tool_result_token_threshold=50, max_summarizer_calls_per_hour=3
        )
        store, files = where.stores()
        await store.open()
        try:
            engine = ContextEngine(store, files, settings)  # its ingestor charges the engine's guard
            summarizer = ScriptedSummarizer()
            await engine.ingestor.ingest("t", [user(blocks(10, "first"))], summarizer=summarizer)
            assert summarizer.calls == 3  # the hourly cap is below the per-request bound
            await engine.ingestor.ingest("t", [user(blocks(10, "second"))], summarizer=summarizer)
            assert summarizer.calls == 3  # the hour's budget is spent: deterministic summaries only
            # The cap is the tenant's: another tenant still gets its explorations.
            await engine.ingestor.ingest("u", [user(blocks(2, "third"))], summarizer=summarizer)
            assert summarizer.calls == 5
            assert await check_database(store, files) == []
        finally:
            await store.close()

    run(scenario())


class HangingSummarizer:
    """Never answers; tells the test when a call has started."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = asyncio.Event()

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        self.calls += 1
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_exploration_stops_at_the_request_deadline(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where, large=100) as (_, store, files):
            ingestor = Ingestor(store, files, Thresholds(100, 2000, exploration_seconds=0.5))
            summarizer = HangingSummarizer()
            # (wait_for: without a deadline the summarizer would hang this test for ever)
            result = await asyncio.wait_for(ingestor.ingest("t", [user(blocks(20))], summarizer=summarizer), 30)
            # The first call is cut off at the deadline; after it, no call is even started.
            assert summarizer.calls == 1
            assert result.messages[0]["content"].count("Kind: text (excerpts)") == 20

    run(scenario())


def test_budget_counts_calls_time_and_cap() -> None:
    now = [100.0]
    guard = Guard(max_calls_per_hour=3)
    budget = ExplorationBudget(2, 30.0, guard, "explore:t", clock=lambda: now[0])
    assert budget.take() == 30.0
    now[0] += 10
    assert budget.take() == 20.0
    assert budget.take() is None  # two calls per request
    assert ExplorationBudget(5, 30.0, guard, "explore:t").take() is not None  # the cap's third call
    assert ExplorationBudget(5, 30.0, guard, "explore:t").take() is None  # cap reached
    late = ExplorationBudget(5, 1.0, None, clock=lambda: now[0])
    now[0] += 1.0
    assert late.take() is None  # past the deadline


# --- A. nothing stored for a request that fails before storing -------------------------------------------


def image_part(i: int) -> dict[str, Any]:
    data = i.to_bytes(4, "big") + bytes(800)
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def test_a_cancelled_request_leaves_no_file(where: Location) -> None:
    on_disk = where.kind == "sqlite"  # PostgreSQL's payloads wait in memory, not in a pending folder

    async def scenario() -> None:
        async with open_engine(where, large=100) as (ingestor, store, _):
            summarizer = HangingSummarizer()
            transcript: list[dict[str, Any]] = [
                {"role": "user", "content": [{"type": "text", "text": "pictures"}, *map(image_part, range(30))]},
                {"role": "assistant", "content": "Seen."},
                user(blocks(1)),  # its exploration hangs: the request is cancelled meanwhile
            ]
            task = asyncio.create_task(ingestor.ingest("t", transcript, summarizer=summarizer))
            await summarizer.started.wait()
            assert await stored_payloads(where, store) == set()  # nothing published before the transaction
            if on_disk:
                assert len(pending_files(where.data_dir)) == 30  # but written, durably, where nobody refers to them
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pending_files(where.data_dir) == [] and await stored_payloads(where, store) == set()
            assert await row_count(store, "messages") == 0 and await row_count(store, "files") == 0

    run(scenario())


def test_a_failed_write_leaves_no_file_and_a_stored_row_always_has_its_file(
    where: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = WriteTransaction if where.kind == "sqlite" else PostgresWrites

    async def scenario() -> None:
        async with open_engine(where, large=100) as (ingestor, store, files):
            transcript = [{"role": "user", "content": [{"type": "text", "text": "a"}, *map(image_part, range(20))]}]

            async def failing(*args: Any, **kwargs: Any) -> None:
                raise OSError("disk full")

            monkeypatch.setattr(writes, "append_messages", failing)
            with pytest.raises(OSError, match="disk full"):
                await ingestor.ingest("t", transcript)
            assert await stored_payloads(where, store) == set() and pending_files(where.data_dir) == []
            assert await row_count(store, "files") == 0

            monkeypatch.undo()
            await ingestor.ingest("t", transcript)
            stored = await file_rows(store)
            assert len(stored) == 20 and await stored_payloads(where, store) == {path for *_, path in stored}
            assert pending_files(where.data_dir) == []
            for _, _, sha, path in stored:
                assert hashlib.sha256(await files.load(path)).hexdigest() == sha

    run(scenario())


# --- A. a 20,000-part request does not stall the event loop --------------------------------------------


def test_healthz_answers_within_100ms_while_a_20000_part_request_is_handled(
    upstream_url: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # 20,979 image parts: as many per message as validation allows (MAX_CONTENT_PARTS, one of them text), so
    # the request is accepted and every part goes through interception, hashing and storage.
    per_message = MAX_CONTENT_PARTS - 1
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"Batch {m}"},
                *(image_part(m * per_message + i) for i in range(per_message)),
            ],
        }
        for m in range(21)
    ]
    parts = 21 * per_message
    # Serialised up front: encoding 20 MB of JSON in the client would hold the GIL this process shares with
    # the server, and it is the server's loop that is under test.
    body = orjson.dumps({"model": "test-model", "messages": messages})
    assert len(body) > 2 * PARSE_ON_LOOP_BYTES  # parsed off the event loop
    del messages

    data_dir = tmp_path / "data"
    # Served as ``lcm-proxy serve`` serves it: LiteLLM warmed up and the startup heap frozen, so what is
    # measured is this request, not the first request's lazy imports.
    app = create_app(make_config(upstream_url, data_dir), serving=True)
    with serve_in_thread(app) as url:
        warm = httpx.post(f"{url}/v1/chat/completions", json={"model": "test-model", "messages": [user("hi")]})
        assert warm.status_code == 200  # the tokenizer is loaded too: a first request's cost, not this one's

        ingestor = app.state.lcm.engine.ingestor
        prepare = ingestor.prepare_message
        ingesting = threading.Event()  # the server is preparing the big message (parsing and validation are done)

        async def observed_prepare(*args: Any, **kwargs: Any) -> Any:
            ingesting.set()
            return await prepare(*args, **kwargs)

        ingestor.prepare_message = observed_prepare

        def send() -> dict[str, Any]:
            with httpx.Client(timeout=300) as client:
                response = client.post(
                    f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
                )
                return {"status": response.status_code, "body": response.json()}

        probes, outcome = probe_healthz_while(url, send, counting=ingesting.is_set)
        latencies, during_ingest = probes.latencies, probes.counted

    assert len(latencies) >= 10, "the probes must overlap the handling of the request"
    if ingesting.is_set():  # (a request refused by validation never gets there)
        assert during_ingest >= 10, "the probes must overlap the preparation of the message"
    slow = [round(s, 3) for s in latencies if s > HEALTHZ_BOUND]
    assert not slow, f"/healthz took {slow} s (of {len(latencies)} probes) while the big request was handled"

    on_disk = stored_files(data_dir)
    assert pending_files(data_dir) == []

    async def recorded_rows() -> list[tuple[str, str, str, str]]:
        store = SQLiteStore(data_dir)
        await store.open()
        try:
            return await file_rows(store)
        finally:
            await store.close()

    assert "status" in outcome, "the big request got no answer"
    recorded = {path for *_, path in asyncio.run(recorded_rows())}
    if outcome["status"] == 200 or recorded:
        # Stored (accepted, or refused after storing, as a context_length_exceeded is): every part has its
        # file and every file its row.
        assert len(recorded) == parts and on_disk == recorded
    else:
        assert outcome["status"] == 400, outcome
        assert on_disk == set()  # refused before storing: nothing written for it
    assert asyncio.run(run_doctor(data_dir)) == []


# --- B. content addressing per tenant --------------------------------------------------------------------


def test_tenants_never_share_a_file_and_a_second_tenant_really_writes(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where, large=100) as (ingestor, store, files):
            document = [user(blocks(1, "contract"))]
            await ingestor.ingest("alice", document)
            alice_files = await stored_payloads(where, store)
            assert len(alice_files) == 1

            await ingestor.ingest("bob", document)
            after_bob = await stored_payloads(where, store)
            assert len(after_bob) == 2  # Bob's copy is a new file: a real write, not a hit on Alice's
            (bob_file,) = after_bob - alice_files

            by_tenant = {tenant: (sha, path) for _, tenant, sha, path in await file_rows(store)}
            assert by_tenant["alice"][0] == by_tenant["bob"][0]  # the same content hash (doctor checks with it)
            assert by_tenant["alice"][1] != by_tenant["bob"][1] and by_tenant["bob"][1] == bob_file
            (alice_file,) = alice_files
            assert by_tenant["alice"][1] == alice_file
            if where.kind == "sqlite":  # two files on disk, not two links to one
                assert (where.data_dir / alice_file).stat().st_ino != (where.data_dir / bob_file).stat().st_ino
            assert await files.load(alice_file) == await files.load(bob_file)

            # A tenant does deduplicate against itself: the same document in a new conversation is no new file.
            await ingestor.ingest("bob", [user("another conversation"), *document])
            assert await stored_payloads(where, store) == after_bob

    run(scenario())


def test_file_store_paths_are_per_tenant(tmp_path: Path) -> None:
    files = FileStore(tmp_path)
    sha_a, path_a = files.put("alice", b"the same bytes")
    sha_b, path_b = files.put("bob", b"the same bytes")
    assert sha_a == sha_b == files.digest(b"the same bytes")
    assert path_a != path_b and sha_a not in path_a and sha_a not in path_b  # nothing in a path is shared
    assert files.put("alice", b"the same bytes") == (sha_a, path_a)
    assert stored_files(tmp_path) == {path_a, path_b}


# --- the parser for large bodies -------------------------------------------------------------------------

JSON_CASES = [
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
    b"[1, 2.5, -0, 1e2, 1E+2, 100000000000000000000, 1e-400, 0.1]",
    b'  {"a" : [ true , false , null ], "": ""}  ',
    b'{"a": 1, "a": 2}',
    b'["\\u00e9\xc3\xa9", "\\ud83d\\ude00", "\\/", "a\\tb"]',
    b"NaN",
    b'{"a": NaN}',
    b"[Infinity]",
    b"[-Infinity]",
    b"[1e999]",
    b'"\\ud800"',
    b'{"\\udc00": 1}',
    b"\xef\xbb\xbf{}",
    b'{"a": "\xff"}',
    b'"a\tb"',
    b'{"a": 1} x',
    b"[1,]",
    b'{"a": 1,}',
    b"01",
    b"1.",
    b"-",
    b'"\\x"',
    b"[" * 300 + b"]" * 300,
    b"[" * 2000 + b"]" * 2000,
]


@pytest.mark.parametrize("raw", JSON_CASES)
def test_large_body_parser_agrees_with_orjson(raw: bytes) -> None:
    try:
        expected: Any = ("value", orjson.loads(raw))
    except orjson.JSONDecodeError:
        expected = ("refused",)
    try:
        got: Any = ("value", parse_json_in_steps(raw))
    except Exception as error:
        assert getattr(error, "code", None) == "invalid_json", error
        got = ("refused",)
    assert repr(got) == repr(expected)


def test_large_body_parser_reads_a_big_request_like_orjson() -> None:
    content = [{"type": "text", "text": "x" * 10}] + [image_part(i) for i in range(2000)]
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0.5})
    assert parse_json_in_steps(raw) == orjson.loads(raw)


def test_pending_files_are_swept_after_a_crash(tmp_path: Path) -> None:
    files = FileStore(tmp_path)
    batch = files.batch("t")
    batch.add(b"left behind by a process that died")
    batch.write()  # never published nor discarded: the process "died" here
    (leftover,) = pending_files(tmp_path)
    old = time.time() - 2 * 3600
    os.utime(leftover, (old, old))
    assert FileStore(tmp_path).sweep_pending() == 1
    assert pending_files(tmp_path) == []
