"""The ledger of standing instructions in the store (``ledger_items``), SQLite and PostgreSQL: items read back as
written, current or superseded, pinned or dropped; a fork gets copies of its own; deletion and a replaced answer
leave no item behind and make current again what a removed statement had superseded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxy.engine.doctor import check_database
from proxy.store.location import Location
from proxy.store.postgres import migrations as postgres_migrations
from proxy.store.postgres import store as postgres_store
from proxy.store.records import LedgerItem, NewMessage
from proxy.store.sqlite import migrations as sqlite_migrations
from proxy.store.sqlite import store as sqlite_store
from tests.support.engine import execute, located, row_count, rows, run


def message(i: int) -> NewMessage:
    role = "user" if i % 2 == 0 else "assistant"
    return NewMessage(role, f'{{"content": "message {i}"}}', None, None, None, f"message {i}", 3, 3, f"h{i}")


async def conversation(store: Any, cid: str, n: int, **fork: Any) -> dict[int, int]:
    """A conversation of ``n`` messages; {seq: message id}."""
    async with store.write() as tx:
        await tx.create_conversation(cid, "t", **fork)
        await tx.append_messages(cid, 0, [message(i) for i in range(n)])
    return {m.seq: m.id for m in await store.read.messages(cid)}


async def planted(store: Any, cid: str, base: int) -> list[LedgerItem]:
    """Four items (ids numbered from ``base``) in a conversation of 6 messages: the budget stated at seq 2 is
    superseded by the one at seq 4."""
    ids = await conversation(store, cid, 6)

    def item(n: int, seq: int, kind: str, slot: str, value: str) -> LedgerItem:
        text = f"The {slot} is {value}."
        return LedgerItem(f"led_{base + n:016x}", cid, kind, slot, value, text, seq, ids[seq], "user", 1000.0 + n)

    items = [
        item(1, 1, "rule", "push main", "never"),
        item(2, 2, "constraint", "budget", "$800"),
        item(3, 4, "constraint", "budget", "$500"),
        item(4, 4, "preference", "units", "metric"),
    ]
    async with store.write() as tx:
        await tx.add_ledger_items(items)
        await tx.supersede_ledger_items([items[1].id], items[2].id, 4)
    return items


def superseded(old: LedgerItem, by: LedgerItem) -> LedgerItem:
    return replace(old, superseded_seq=by.seq, superseded_by=by.id)


async def opened(where: Location) -> Any:
    store, _ = located(where).stores()
    await store.open()
    return store


def test_items_read_back_current_or_superseded_and_a_state_is_set_in_one_conversation_only(where: Location) -> None:
    async def scenario() -> None:
        store = await opened(where)
        rule, old_budget, budget, units = await planted(store, "conv_a", 0)
        await planted(store, "conv_b", 100)

        assert await store.read.ledger("conv_a") == [rule, budget, units]
        everything = await store.read.ledger("conv_a", include_superseded=True)
        assert everything == [rule, superseded(old_budget, budget), budget, units]
        assert [i.current for i in everything] == [True, False, True, True]

        async with store.write() as tx:
            dropped = await tx.set_ledger_state("conv_a", units.id, "dropped")
            pinned = await tx.set_ledger_state("conv_a", rule.id, "pinned")
            assert await tx.set_ledger_state("conv_b", rule.id, "dropped") is None  # conv_a's item, not conv_b's
            assert await tx.set_ledger_state("conv_a", "led_ffffffffffffffff", "pinned") is None
        assert dropped == replace(units, state="dropped") and not dropped.current
        assert pinned == replace(rule, state="pinned") and pinned.current
        assert await store.read.ledger("conv_a") == [pinned, budget, dropped]  # a dropped item is still listed
        assert [i.state for i in await store.read.ledger("conv_b")] == ["active"] * 3
        await store.close()

        store = await opened(where)  # as stored, after a restart
        assert await store.read.ledger("conv_a") == [pinned, budget, dropped]
        assert await store.integrity() == []
        await store.close()

    run(scenario())


def test_a_fork_gets_copies_of_the_items_before_its_fork_point(where: Location) -> None:
    async def scenario() -> None:
        store = await opened(where)
        parent = await planted(store, "conv_p", 0)
        rule, old_budget, budget, units = parent
        # Forked at 4: the update of the budget (seq 4) is not in the fork, so its $800 is current there.
        early = await conversation(store, "conv_early", 0, parent_id="conv_p", fork_seq=4)
        late = await conversation(store, "conv_late", 0, parent_id="conv_p", fork_seq=6)
        async with store.write() as tx:
            await tx.copy_prefix("conv_p", "conv_early", 4)
            await tx.copy_prefix("conv_p", "conv_late", 6)
        assert early == late == {}
        early_ids = {m.seq: m.id for m in await store.read.messages("conv_early")}
        late_ids = {m.seq: m.id for m in await store.read.messages("conv_late")}

        copies = await store.read.ledger("conv_early", include_superseded=True)
        assert [(i.text, i.seq, i.message_id, i.current) for i in copies] == [
            ("The push main is never.", 1, early_ids[1], True),
            ("The budget is $800.", 2, early_ids[2], True),
        ]
        assert all(i.conversation_id == "conv_early" and i.id.startswith("led_") for i in copies)
        assert {i.id for i in copies}.isdisjoint(i.id for i in parent)

        # By seq, then id: the copies' ids are new, so two items of one message may come in another order.
        late_copies = {i.text: i for i in await store.read.ledger("conv_late", include_superseded=True)}
        assert sorted((i.seq, i.text, i.message_id, i.created_at) for i in late_copies.values()) == sorted(
            (i.seq, i.text, late_ids[i.seq], i.created_at) for i in parent
        )
        # The copy of the $800 budget is superseded by the fork's own copy of the $500 one.
        assert late_copies[old_budget.text].superseded_seq == 4
        assert late_copies[old_budget.text].superseded_by == late_copies[budget.text].id
        current = [i.text for i in await store.read.ledger("conv_late")]
        assert sorted(current) == sorted([rule.text, budget.text, units.text]) and current[0] == rule.text

        async with store.write() as tx:  # the fork's to drop: its parent's item stays as it was
            await tx.set_ledger_state("conv_late", late_copies[rule.text].id, "dropped")
        assert await store.read.ledger("conv_p", include_superseded=True) == [
            rule, superseded(old_budget, budget), budget, units
        ]  # fmt: skip
        assert await store.integrity() == []
        await store.close()

    run(scenario())


def test_deleting_leaves_no_item_and_a_kept_prefix_keeps_its_own(where: Location) -> None:
    async def scenario() -> None:
        store = await opened(where)
        await planted(store, "conv_gone", 0)
        rule, old_budget, _, _ = await planted(store, "conv_kept", 100)
        others = await planted(store, "conv_other", 200)

        async with store.write() as tx:
            await tx.remove_conversation("conv_gone", 0)
            await tx.remove_conversation("conv_kept", 3)  # as for a fork made at message 3
        assert await row_count(store, "ledger_items", "WHERE conversation_id = ?", ("conv_gone",)) == 0
        assert await store.read.conversation(None, "conv_gone", deleted=True) is None
        # What stays of the budget was superseded by a statement that is gone: current again.
        assert await store.read.ledger("conv_kept", include_superseded=True) == [rule, old_budget]
        assert await store.read.ledger("conv_other", include_superseded=True) == [
            others[0], superseded(others[1], others[2]), *others[2:]
        ]  # fmt: skip
        assert await row_count(store, "ledger_items") == 6
        assert await store.integrity() == []
        await store.close()

    run(scenario())


def test_a_replaced_relayed_answer_takes_its_items_with_it(where: Location) -> None:
    async def scenario() -> None:
        store = await opened(where)
        rule, old_budget, budget, units = await planted(store, "conv_a", 0)
        async with store.write() as tx:
            await tx.append_messages("conv_a", 6, [message(6)])
            await tx.set_relayed_answer("conv_a", 6, 1.0)
            answer = (await tx.messages("conv_a", 6))[0]
            stated = LedgerItem("led_00000000000000aa", "conv_a", "decision", "db", "postgres", "Use postgres.", 6,
                                answer.id, "assistant", 2000.0)  # fmt: skip
            await tx.add_ledger_items([stated])
            await tx.supersede_ledger_items([rule.id], stated.id, 6)
        assert [i.id for i in await store.read.ledger("conv_a")] == [budget.id, units.id, stated.id]

        async with store.write() as tx:
            assert await tx.replaceable_answer("conv_a") == 6
            await tx.drop_relayed_answer("conv_a", 6)
        assert await store.read.ledger("conv_a", include_superseded=True) == [
            rule, superseded(old_budget, budget), budget, units
        ]  # fmt: skip
        assert await store.integrity() == []
        await store.close()

    run(scenario())


def test_doctor_checks_each_item_names_its_own_message_and_successor(where: Location) -> None:
    async def scenario() -> None:
        store, files = located(where).stores()
        await store.open()
        parent = await planted(store, "conv_p", 0)
        await conversation(store, "conv_f", 0, parent_id="conv_p", fork_seq=6)
        async with store.write() as tx:
            await tx.copy_prefix("conv_p", "conv_f", 6)
        assert await check_database(store, files) == []  # the fork's copies point at the fork's own rows

        copies = {i.text: i for i in await store.read.ledger("conv_f", include_superseded=True)}
        stale, moved = copies[parent[1].text], copies[parent[0].text]
        await execute(store, "UPDATE ledger_items SET superseded_by = ? WHERE id = ?", (parent[2].id, stale.id))
        await execute(store, "UPDATE ledger_items SET message_id = ? WHERE id = ?", (parent[0].message_id, moved.id))
        assert await check_database(store, files) == sorted(
            [
                f"conv_f: ledger item {moved.id} does not name its message 1",
                f"conv_f: ledger item {stale.id} is superseded by {parent[2].id}, not one of its items",
            ]
        )
        await store.close()

    run(scenario())


async def open_items_plan(store: Any, where: Location) -> str:
    """How the store reads a conversation's open items (``Reads.ledger``): its query plan."""
    sql = "SELECT id FROM ledger_items WHERE conversation_id = ? AND superseded_seq IS NULL ORDER BY seq, id"
    if where.kind == "sqlite":
        return " ".join(str(r) for r in await rows(store, "EXPLAIN QUERY PLAN " + sql, ("conv_a",)))
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")  # a test's table is small enough for a scan
        cursor = await conn.execute("EXPLAIN " + sql.replace("ledger_items", "lcm.ledger_items").replace("?", "%s"),
                                    ("conv_a",))  # fmt: skip
        return " ".join(str(r) for r in await cursor.fetchall())


def test_a_batch_supersedes_many_items_and_the_open_ones_are_read_through_their_index(where: Location) -> None:
    """An ingest's plan replaces its items in one statement (``supersede_ledger_batch``); the open items, which
    every ingest that states something reads, are read through an index of their own, not by scanning every item
    the conversation ever had."""

    async def scenario() -> None:
        store = await opened(where)
        ids = await conversation(store, "conv_a", 4)
        items = [
            LedgerItem(f"led_{n:016x}", "conv_a", "rule", f"slot {n % 300}", f"v{n}", f"Rule {n}.", n // 300,
                       ids[n // 300], "user", 1.0)
            for n in range(900)
        ]  # fmt: skip
        async with store.write() as tx:
            await tx.add_ledger_items(items)
            await tx.supersede_ledger_batch([])  # nothing to do
            # Each of the first 600 replaced by its slot's next item, stated 300 items (one message) later.
            await tx.supersede_ledger_batch(
                [(i.id, items[n + 300].id, items[n + 300].seq) for n, i in enumerate(items[:600])]
            )
        assert await store.read.ledger("conv_a") == items[600:]
        assert await store.read.ledger("conv_a", include_superseded=True) == [
            *(superseded(i, items[n + 300]) for n, i in enumerate(items[:600])), *items[600:]
        ]  # fmt: skip
        assert "ledger_items_open" in await open_items_plan(store, where)
        assert await store.integrity() == []
        await store.close()

    run(scenario())


def test_a_store_made_before_the_open_items_index_gets_it_and_reads_the_same(
    where: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is a migration of its own (append-only registries): a store made before it is migrated when it
    is opened, and its items read back as they did."""
    if where.kind == "sqlite":
        modules: tuple[Any, ...] = (sqlite_migrations, sqlite_store)
        name = "m009_ledger_open_items"
    else:
        modules, name = (postgres_migrations, postgres_store), "p005_ledger_open_items"
    every = modules[0].MIGRATIONS
    earlier = [m for m in every if m[0] != name]  # every other one: the code writes what later migrations add

    async def scenario() -> None:
        for module in modules:
            monkeypatch.setattr(module, "MIGRATIONS", earlier)
        store = await opened(where)
        planted_items = await planted(store, "conv_a", 0)
        before = await store.read.ledger("conv_a", include_superseded=True)
        assert "ledger_items_open" not in await open_items_plan(store, where)
        await store.close()

        for module in modules:
            monkeypatch.setattr(module, "MIGRATIONS", every)
        store = await opened(where)
        assert await store.read.ledger("conv_a", include_superseded=True) == before
        assert await store.read.ledger("conv_a") == [planted_items[0], *planted_items[2:]]
        assert "ledger_items_open" in await open_items_plan(store, where)
        assert await store.integrity() == []  # every migration recorded
        await store.close()

    run(scenario())
