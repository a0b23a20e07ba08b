"""A compaction lease whose holder was killed is seen dead within a few heartbeats, far within a request's
inline deadline (``proxy.engine.lease``). Before: a lease ran 60 s past its last renewal, so a replica killed
mid-sweep made the next request for its conversation wait the whole inline deadline (30 s) and answer with
messages evicted. Every test runs on SQLite and PostgreSQL; the holder is a real process, SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from proxy.config.lcm import LcmSettings
from proxy.engine.doctor import check_database
from proxy.engine.engine import Budget
from proxy.store.location import Location
from tests.support import REPO
from tests.support.compaction import HARD, SETTINGS, Scripted, long_turns, open_context_engine
from tests.support.engine import row_count, run

HEARTBEAT = 0.2  # seconds: short, so that the test takes little time; the default is 2 s


def test_by_default_a_lease_expires_within_a_small_part_of_the_inline_deadline(where: Location) -> None:
    async def scenario() -> None:
        settings = LcmSettings()
        engine, store, _ = await open_context_engine(where, settings)
        try:
            leases = engine.compactor.leases
            assert leases.heartbeat == settings.compaction_lease_heartbeat_seconds == 2.0
            assert leases.ttl == 3 * leases.heartbeat  # renewed each heartbeat; dead after three missed
            assert leases.ttl * 5 <= settings.inline_compaction_seconds  # was 60 s against a 30 s deadline
        finally:
            await engine.close()
            await store.close()

    run(scenario())


def test_a_killed_holders_lease_is_taken_over_by_the_next_request_within_its_deadline(where: Location) -> None:
    settings = SETTINGS.model_copy(update={"compaction_lease_heartbeat_seconds": HEARTBEAT})
    summarizer = Scripted("ok")

    async def started() -> str:
        engine, store, _ = await open_context_engine(where, settings)
        try:
            prepared = await engine.prepare(
                "t", long_turns(18), Budget(window=3000, output_reserve=300, tools=0), summarizer
            )
            assert prepared.compaction == "scheduled" and prepared.conversation_id is not None
            return prepared.conversation_id
        finally:
            await engine.close()
            await store.close()

    conversation = run(started())
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.support.lease_holder", str(where.data_dir), where.database_url or "", conversation,
         str(HEARTBEAT)],
        cwd=REPO, env=env, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().decode().split()  # once it holds the lease
        assert line[0] == "held", line
        holders = line[1]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    async def next_request() -> None:
        engine, store, files = await open_context_engine(where, settings)
        try:
            owner, expires = await store.read.compaction_lease(conversation) or ("", 0.0)
            assert owner == holders  # the killed process's lease, not released: it never got to
            # Its own bookkeeping: it lapses at most three heartbeats after it was last renewed, which is far
            # within the deadline the next request waits for it.
            assert expires - time.time() <= 3 * HEARTBEAT
            assert settings.inline_compaction_seconds >= 3 * HEARTBEAT * 10

            hard = await engine.prepare("t", long_turns(30), HARD, summarizer)  # the same conversation, longer

            assert hard.conversation_id == conversation
            assert hard.compaction not in ("deferred", "evicted")  # compacted inline: the lease was taken over
            assert summarizer.calls > 0 and await row_count(store, "summaries") > 0
            assert await store.read.compaction_lease(conversation) is None  # taken over, then released
            assert await check_database(store, files) == []
        finally:
            await engine.wait_idle()
            await engine.close()
            await store.close()

    run(asyncio.wait_for(next_request(), timeout=settings.inline_compaction_seconds * 2))
