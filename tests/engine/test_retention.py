"""``lcm_settings.retention_days``: the background purge of idle conversations (``proxy.engine.deletion.Retention``),
on its own and started by the application's lifespan; SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from proxy.config.loading import parse_config
from proxy.engine.deletion import Deleter, Retention
from proxy.engine.doctor import check_database
from proxy.errors import ConfigError
from proxy.store.location import Location
from tests.support.deletion import open_engine, prepare, turns
from tests.support.engine import execute, located, run

DAY = 86400


async def age(store: Any, conversation_id: str, days: int) -> None:
    """Last activity ``days`` ago: the store's own column, set behind the engine's back (no clock to wait for)."""
    await execute(
        store, "UPDATE conversations SET updated_at = updated_at - ? WHERE id = ?", (days * DAY, conversation_id)
    )


def test_retention_purges_idle_conversations_and_runs_beside_another_worker(
    where: Location, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lcm_proxy.audit")

    async def scenario() -> None:
        engine, store, files, _ = await open_engine(where)
        old = [await prepare(engine, tenant, turns(2, f"Old {tenant}")) for tenant in ("t", "u")]
        parent = await prepare(engine, "t", turns(4, "Parent"))
        recent_fork = await prepare(engine, "t", [*turns(4, "Parent")[:-1], {"role": "user", "content": "new"}])
        recent = await prepare(engine, "t", turns(2, "Recent"))
        for cid in (*old, parent):
            await age(store, cid, 31)
        # A second worker (or replica): its own store on the same database, running its own retention.
        other, other_files = located(where).stores()
        await other.open()
        first = Retention(Deleter(store, files), days=30)
        second = Retention(Deleter(other, other_files), days=30)
        first.start()
        second.start()
        await asyncio.gather(first.wait_for_pass(1), second.wait_for_pass(1))
        await asyncio.gather(first.stop(), second.stop())

        live = {c.id for c in await store.read.conversations(None)}
        assert live == {recent, recent_fork}
        kept = await store.read.conversation(None, parent, deleted=True)
        assert kept is not None and kept.deleted_at is not None  # kept for its recent fork
        audit = [r.getMessage() for r in caplog.records if r.name == "lcm_proxy.audit"]
        assert sorted(line.split()[2] for line in audit) == sorted([*old, parent])  # each deleted once
        assert all("via retention" in line for line in audit)
        assert first.passes == second.passes == 1  # stopped while waiting for the next hour, not after it
        assert await check_database(store, files) == []
        await other.close()
        await store.close()

    run(scenario())


def test_the_server_starts_retention_and_stops_it(where: Location, proxy_factory: Any, tmp_path: Any) -> None:
    async def populate() -> tuple[str, str]:
        # The first proxy of ``proxy_factory`` keeps its conversations here (or in the ``where`` database).
        engine, store, _, _ = await open_engine(Location(tmp_path / "data0", where.database_url))
        old = await prepare(engine, "default", turns(2, "Old"))
        recent = await prepare(engine, "default", turns(2, "Recent"))
        await age(store, old, 8)
        await store.close()
        return old, recent

    old, recent = run(populate())
    proxy = proxy_factory(lcm={"retention_days": 7}, where=where)
    retention = proxy.app.state.lcm.retention
    assert retention is not None and retention.days == 7
    asyncio.run_coroutine_threadsafe(retention.wait_for_pass(1), retention.loop).result(timeout=60)

    async def remaining() -> set[str]:
        store, _ = Location(tmp_path / "data0", where.database_url).stores()
        await store.open()
        try:
            return {c.id for c in await store.read.conversations(None)}
        finally:
            await store.close()

    assert run(remaining()) == {recent}
    assert old != recent


def test_retention_days_must_be_a_positive_number_of_days() -> None:
    base: dict[str, Any] = {"model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m"}}]}
    assert parse_config({**base, "lcm_settings": {}}).lcm_settings.retention_days is None
    assert parse_config({**base, "lcm_settings": {"retention_days": 30}}).lcm_settings.retention_days == 30
    for bad in (0, -1, "soon"):
        with pytest.raises(ConfigError, match="retention_days"):
            parse_config({**base, "lcm_settings": {"retention_days": bad}})


def test_a_conversation_continued_after_the_purge_listed_it_is_kept(where: Location) -> None:
    """A purge lists its candidates, then deletes them one transaction at a time: one that a client continued
    in between is active again, and is kept (its last activity is read again under its lock)."""

    async def scenario() -> None:
        engine, store, files, _ = await open_engine(where)
        idle = await prepare(engine, "t", turns(2, "Idle"))
        back = await prepare(engine, "t", turns(2, "Back"))
        for cid in (idle, back):
            await age(store, cid, 31)
        deleter = Deleter(store, files)
        listed = deleter.candidates

        async def listed_then_continued(tenant: str | None, before: float | None, limit: int) -> list[Any]:
            found = await listed(tenant, before, limit)
            continued = [*turns(2, "Back"), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
            assert await prepare(engine, "t", continued) == back
            return found

        deleter.candidates = listed_then_continued  # type: ignore[method-assign]
        done = await deleter.purge(None, time.time() - 30 * DAY, via="retention")
        assert [d.id for d in done] == [idle]
        assert [c.id for c in await store.read.conversations(None)] == [back]
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_purging_a_tenant_takes_its_end_users_too(where: Location) -> None:
    """A privacy request for a whole tenant covers the end users its key served, and nobody else."""
    from proxy.scopes import user_scope

    async def scenario() -> None:
        engine, store, files, _ = await open_engine(where)
        await prepare(engine, "acme", turns(2, "Acme itself"))
        await prepare(engine, user_scope("acme", "alice"), turns(2, "Alice"))
        kept = await prepare(engine, "acme-two", turns(2, "Another tenant whose name starts alike"))
        other_user = await prepare(engine, user_scope("acme-two", "alice"), turns(2, "Alice elsewhere"))
        done = await Deleter(store, files).purge("acme", None, via="cli")
        assert len(done) == 2
        assert {c.id for c in await store.read.conversations(None)} == {kept, other_user}
        # A user's own scope purges only that user.
        await prepare(engine, user_scope("acme", "bob"), turns(2, "Bob"))
        await prepare(engine, user_scope("acme", "carol"), turns(2, "Carol"))
        assert len(await Deleter(store, files).purge(user_scope("acme", "bob"), None, via="cli")) == 1
        assert [c.tenant for c in await store.read.conversations(None) if c.tenant.startswith("acme/")] == [
            user_scope("acme", "carol")
        ]
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())
