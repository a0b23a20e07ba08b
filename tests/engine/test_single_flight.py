"""Compaction is single-flight per conversation: inline, background, admin and CLI sweeps, in one process or
several on one database file (``serve --workers N``, ``lcm-proxy compact`` beside a server), never summarise
the same conversation side by side. A second sweep waits for the running one and starts from its result.

Two engines on two stores over one database (a SQLite file, or a PostgreSQL database: every test runs on both)
stand for two processes: they share nothing but the database.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from proxy.cli.operator import Operator
from proxy.engine.admin import AdminViews
from proxy.engine.doctor import check_database
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.recall.tools import RecallTools
from proxy.store.location import Location
from tests.support.compaction import HARD, SETTINGS, Held, Scripted, long_turns, open_context_engine
from tests.support.engine import elsewhere, row_count, run
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import make_config
from tests.support.sim import ScriptedModel, is_summary_request


class Counting(Scripted):
    """Answers at once; ``called`` is set by its first call, and it records how many calls overlapped."""

    def __init__(self, called: threading.Event | None = None) -> None:
        super().__init__("ok")
        self.called = called or threading.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        self.called.set()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await super().complete(system=system, user=user, max_tokens=max_tokens, temperature=temperature)
        finally:
            self.in_flight -= 1


class HeldCounting(Held):
    """Holds every call until released; sets ``overlapped`` when a second call arrives while one is held."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.overlapped = threading.Event()

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.in_flight > 1:
            self.overlapped.set()
        try:
            return await super().complete(system=system, user=user, max_tokens=max_tokens, temperature=temperature)
        finally:
            self.in_flight -= 1


@contextmanager
def on_log(fragment: str, event: threading.Event) -> Iterator[None]:
    """Set ``event`` when the engine logs a line containing ``fragment`` (the engine saying it waits)."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if fragment in record.getMessage():
                event.set()

    logger = logging.getLogger("lcm_proxy.engine")
    handler, level = Handler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 30), "neither waited nor summarised"


async def calls_of_one_sweep(where: Location) -> int:
    engine, store, _ = await open_context_engine(where)
    summarizer = Scripted("ok")
    assert (await engine.prepare("t", long_turns(30), HARD, summarizer)).compaction == "inline"
    await store.close()
    return summarizer.calls


def test_a_second_process_waits_for_the_running_sweep_instead_of_summarising_again(
    where: Location, request: pytest.FixtureRequest
) -> None:
    """Two workers answering requests of one conversation over the hard budget each ran a full inline sweep:
    twice the summarizer calls, the loser's discarded. The second now waits for the first and reuses it."""

    async def scenario() -> None:
        alone = await calls_of_one_sweep(elsewhere(where, request))
        first, store1, files = await open_context_engine(where)
        second, store2, _ = await open_context_engine(where)
        held = Held()
        reached = threading.Event()  # the second worker waits for the lease (or, before the fix, summarises)
        other = Counting(reached)
        with on_log("waits up to", reached):
            one = asyncio.create_task(first.prepare("t", long_turns(30), HARD, held))
            await held.waiting.wait()  # the first worker's sweep runs, its summary held
            two = asyncio.create_task(second.prepare("t", long_turns(30), HARD, other))
            await until(reached)
            held.release.set()
            answered = await asyncio.gather(one, two)
        assert other.calls == 0, "the second worker summarised the conversation again"
        assert held.calls == alone
        assert [a.compaction for a in answered] == ["inline", "inline"]
        assert answered[1].sent.summaries == answered[0].sent.summaries  # the first worker's summaries
        assert await row_count(store1, "compaction_leases") == 0  # released
        assert await check_database(store1, files) == []
        await store2.close()
        await store1.close()

    run(scenario())


def test_the_admin_compact_waits_for_the_running_inline_sweep(where: Location) -> None:
    """POST /lcm/conversations/{id}/compact swept beside a running inline compaction of the same conversation
    (both summarising the same messages, one commit thrown away); now it runs after it, from its result."""

    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        views = AdminViews(engine, RecallTools(store, files))
        summarizer = HeldCounting()
        reached = summarizer.overlapped
        with on_log("the full sweep waits for it", reached):
            inline = asyncio.create_task(engine.prepare("t", long_turns(30), HARD, summarizer))
            await summarizer.waiting.wait()
            conversation = (await store.read.conversations("t"))[0].id
            admin = asyncio.create_task(views.compact("t", conversation, summarizer))
            await until(reached)
            summarizer.release.set()
            prepared, report = await asyncio.gather(inline, admin)
        assert summarizer.most_in_flight == 1, "two sweeps of one conversation summarised side by side"
        assert prepared.compaction == "inline" and not report["conflict"] and not report["busy"]
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_lcm_proxy_compact_waits_for_the_servers_sweep(
    where: Location, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """The operator's ``compact`` (its own process, its own store) swept while the server compacted the same
    conversation; now it waits for the server's sweep and starts from its result."""
    model = ScriptedModel()
    summarised = threading.Event()  # the operator's summary model was called

    def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            summarised.set()
        return model(body)

    fake_upstream.responder = respond
    # Both "processes" share this test's event loop, which the operator's first import of LiteLLM blocks for
    # seconds: the server's lease renewals must not lapse meanwhile (a real operator is a process of its own).
    settings = SETTINGS.model_copy(update={"compaction_lease_heartbeat_seconds": 30.0})
    config = make_config(
        upstream_url,
        where.data_dir,
        lcm={**settings.model_dump(), "summary_timeout": 30},
        database_url=where.database_url,
    )

    async def scenario() -> None:
        store, files = where.stores()
        await store.open()
        server = ContextEngine(store, files, settings)
        held = Held()
        with on_log("waits up to", summarised):
            inline = asyncio.create_task(server.prepare("t", long_turns(30), HARD, held))
            await held.waiting.wait()
            conversation = (await store.read.conversations("t"))[0].id
            async with Operator(where) as operator:
                cli = asyncio.create_task(operator.compact(conversation, None, "test-model", config))
                await until(summarised)
                early = sum(is_summary_request(r.body) for r in fake_upstream.requests)
                held.release.set()
                prepared, printed = await asyncio.gather(inline, cli)
        assert early == 0, "the operator summarised beside the server's running sweep"
        assert prepared.compaction == "inline"
        assert "conflict" not in printed and "busy" not in printed, printed
        await store.close()

    run(scenario())


def test_a_live_lease_is_respected_and_an_expired_one_taken_over(where: Location) -> None:
    """Another process's lease: a background sweep skips the conversation, a request waits at most its inline
    deadline and is answered from what fits. A lease whose holder died (not renewed past its expiry) is taken
    over by the next sweep."""

    async def scenario() -> None:
        engine, store, files = await open_context_engine(
            where, SETTINGS.model_copy(update={"inline_compaction_seconds": 0.3})
        )
        summarizer = Scripted("ok")
        prepared = await engine.prepare(
            "t", long_turns(18), Budget(window=3000, output_reserve=300, tools=0), summarizer
        )
        assert prepared.compaction == "scheduled"
        conversation = prepared.conversation_id or ""
        async with store.write() as tx:
            assert await tx.take_compaction_lease(conversation, "other-host:1:live", 600)
        assert await engine.after_response(prepared, summarizer)
        await engine.wait_idle()
        hard = await engine.prepare("t", long_turns(30), HARD, summarizer)  # the same conversation, longer
        assert hard.compaction == "deferred"  # waited for the other process's sweep until its deadline
        assert summarizer.calls == 0 and await row_count(store, "summaries") == 0
        async with store.write() as tx:
            await tx.release_compaction_lease(conversation, "other-host:1:live")
            assert await tx.take_compaction_lease(conversation, "other-host:2:dead", -1)  # expired at once
        assert (await store.read.compaction_lease(conversation) or ("",))[0] == "other-host:2:dead"
        assert await engine.after_response(prepared, summarizer)
        await engine.wait_idle()
        assert summarizer.calls > 0 and await row_count(store, "summaries") > 0
        assert await store.read.compaction_lease(conversation) is None  # taken over, then released
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
def test_a_lease_read_agrees_with_the_store_whatever_this_hosts_clock(
    where: Location, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """A waiting sweep polls ``read.compaction_lease`` and compares the expiry with ``time.time()``; a store
    that keeps expiries on the database's clock (PostgreSQL: replicas' clocks may disagree) must give it back
    on this host's, or a live lease looks expired (and the waiter hammers the write lock) or a dead one alive."""

    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        prepared = await engine.prepare("t", long_turns(2), HARD, Scripted("ok"))
        conversation = prepared.conversation_id or ""
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + skew)  # this host's clock is off by an hour
        async with store.write() as tx:
            assert await tx.take_compaction_lease(conversation, "other-host:1:live", 600)
        owner, expires = await store.read.compaction_lease(conversation) or ("", 0.0)
        assert owner == "other-host:1:live" and time.time() + 590 < expires <= time.time() + 600
        async with store.write() as tx:
            assert not await tx.take_compaction_lease(conversation, "me", 600)  # live, as the read said
            await tx.release_compaction_lease(conversation, "other-host:1:live")
            assert await tx.take_compaction_lease(conversation, "other-host:2:dead", -1)  # expired at once
        _, expired = await store.read.compaction_lease(conversation) or ("", 0.0)
        assert time.time() - 10 < expired <= time.time()
        async with store.write() as tx:
            assert await tx.take_compaction_lease(conversation, "me", 600)  # expired, as the read said
            await tx.release_compaction_lease(conversation, "me")
        monkeypatch.undo()
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())
