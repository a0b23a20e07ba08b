"""The ledger's caps (``proxy/engine/standing/flow.py``): at most 8 new items per message and none once 300 are
open, while every update is written, so that a value the user replaced is never left current; and the plan made
before the write transaction is the old in-transaction ``record`` (every pair compared), caps aside."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import replace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine.standing import flow, ledger
from proxy.engine.standing.flow import MAX_NEW_PER_MESSAGE, MAX_OPEN_ITEMS, Plan, Said
from proxy.engine.standing.index import Index
from proxy.engine.standing.intake import Intake
from proxy.store.location import Location
from proxy.store.records import LedgerItem
from tests.support.engine import open_engine, read_ledger, rows, run, user
from tests.support.rule_dense import corpus, rule_dense_request

WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "granite", "harbor", "juniper", "kestrel", "lagoon",
         "meadow", "nectar", "onyx", "pebble")  # fmt: skip


def said(*texts: str, role: str = "user") -> tuple[str, list[ledger.Statement]]:
    return role, [s for text in texts for s in ledger.extract(text, role)]


def stored(plan: Plan, basis: list[LedgerItem]) -> list[LedgerItem]:
    """Every item after ``plan`` is written over ``basis`` (what ``flow.apply`` writes, in memory)."""
    items = {item.id: item for item in basis}
    ordered = sorted((item for item in basis if item.superseded_seq is None), key=flow.signature)
    ids = [f"new:{k}" for k in range(len(plan.writes))]
    for k, write in enumerate(plan.writes):
        s, seq = write.statement, plan.start + write.offset
        item = LedgerItem(ids[k], "conv", s.kind, s.slot, s.value, s.text, seq, seq, write.role, 0.0, state=write.state)
        if write.replaced is not None:
            item = replace(item, superseded_seq=plan.start + write.replaced[0], superseded_by=ids[write.replaced[1]])
        items[item.id] = item
        for p in write.replaces:
            items[ordered[p].id] = replace(items[ordered[p].id], superseded_seq=seq, superseded_by=ids[k])
    return list(items.values())


def recorded(basis: list[LedgerItem], start: int, new: Said) -> list[LedgerItem]:
    """What ``flow.record`` stored before the plan existed: inside the transaction, message by message, every
    statement compared with every item."""
    current = list(basis)
    n = 0
    for offset, (role, statements) in enumerate(new):
        seq = start + offset
        everything = Index((c for c in current if c.superseded_seq is None), exhaustive=True)
        for statement, superseded in ledger.reconcile(current, statements, index=everything):
            pinned = any(item.id in superseded and item.state == "pinned" for item in current)
            s = statement
            item = LedgerItem(f"new:{n}", "conv", s.kind, s.slot, s.value, s.text, seq, seq, role, 0.0,
                              state="pinned" if pinned else "active")  # fmt: skip
            n += 1
            current = [
                replace(c, superseded_seq=seq, superseded_by=item.id) if c.id in superseded else c for c in current
            ]
            current.append(item)
    return current


def shape(items: list[LedgerItem]) -> list[tuple[Any, ...]]:
    return sorted(
        (i.id, i.kind, i.slot, i.value, i.seq, i.role, i.state, i.superseded_seq, i.superseded_by) for i in items
    )


SENTENCES = [(role, text) for role, text in corpus() if ledger.extract(text, role)]


def basis_of(picked: list[tuple[int, str]]) -> list[LedgerItem]:
    out = []
    for n, (which, state) in enumerate(picked):
        role, text = SENTENCES[which % len(SENTENCES)]
        s = ledger.extract(text, role)[0]
        out.append(LedgerItem(f"led_{n:04d}", "conv", s.kind, s.slot, s.value, s.text, n, n, role, 0.0, state=state))
    return out


picks = st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["active", "pinned", "dropped"])), max_size=40)
messages = st.lists(st.lists(st.integers(0, 10_000), max_size=12), max_size=6)


def request_of(which: list[list[int]]) -> Said:
    return [said(*(SENTENCES[i % len(SENTENCES)][1] for i in texts)) for texts in which]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picks, messages)
def test_without_caps_the_plan_stores_what_record_stored(picked: list[tuple[int, str]], which: list[list[int]]) -> None:
    basis, new = basis_of(picked), request_of(which)
    with mock.patch.object(flow, "MAX_NEW_PER_MESSAGE", 10**6), mock.patch.object(flow, "MAX_OPEN_ITEMS", 10**6):
        planned = flow.plan(basis, len(basis), new)
    assert planned.left_out == 0
    assert shape(stored(planned, basis)) == shape(recorded(basis, len(basis), new))


def caps(per: int, most: int) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(flow, "MAX_NEW_PER_MESSAGE", per))
    stack.enter_context(mock.patch.object(flow, "MAX_OPEN_ITEMS", most))
    return stack


def open_count(items: list[LedgerItem]) -> int:
    return len([i for i in items if i.superseded_seq is None])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picks, messages, st.integers(0, 3), st.integers(0, 30))
def test_the_caps_leave_out_new_items_only(
    picked: list[tuple[int, str]], which: list[list[int]], per: int, most: int
) -> None:
    """Every item the uncapped plan replaces the capped one replaces too; a message opens at most ``per`` more
    items than it replaces, and no new item is opened past ``most``."""
    basis, new = basis_of(picked), request_of(which)
    with caps(per, most):
        capped = flow.plan(basis, 100, new)
    with caps(10**6, 10**6):
        uncapped = flow.plan(basis, 100, new)
    replaced = {p for write in uncapped.writes for p in write.replaces}
    assert replaced <= {p for write in capped.writes for p in write.replaces}
    assert open_count(stored(capped, basis)) <= max(most, open_count(basis))
    items = basis
    for offset, message in enumerate(new):  # message by message: what each one opens
        before = open_count(items)
        with caps(per, most):
            items = _named(stored(flow.plan(items, 100 + offset, [message]), items), offset)
        assert open_count(items) - before <= per
        assert open_count(items) <= max(most, before)


def test_a_message_adds_its_first_eight_new_items_and_every_update() -> None:
    assert MAX_NEW_PER_MESSAGE == 8
    basis = basis_of([])
    first = said("Never push to main.", "The budget cap is $800.", "Please give me every estimate in metric units.")
    planned = flow.plan(basis, 0, [first])
    basis = _named(stored(planned, []), 0)
    assert len(basis) == 3
    rules = [f"Never touch the {word} folder." for word in WORDS[:12]]
    updates = ["Quick update: keep spend under $500.", "You may push to main now.", "Use imperial units from now on."]
    planned = flow.plan(basis, 1, [said(*rules, *updates)])
    assert planned.left_out == 4
    assert [w.statement.text for w in planned.writes if not w.replaces] == rules[:8]  # the first ones
    assert [w.statement.text for w in planned.writes if w.replaces] == updates  # every update, though they came last
    after = stored(planned, basis)
    assert {i.text for i in after if i.current} == {*rules[:8], *updates}


def test_at_three_hundred_open_items_a_conversation_takes_updates_only() -> None:
    assert MAX_OPEN_ITEMS == 300
    rng = random.Random(5)
    items: list[LedgerItem] = []
    seq = 0
    while len([i for i in items if i.superseded_seq is None]) < MAX_OPEN_ITEMS:
        (message,) = rule_dense_request(1, seed=rng.randrange(10**6))
        items = _named(stored(flow.plan(items, seq, [said(message["content"])]), items), seq)
        seq += 1
    open_items = [i for i in items if i.superseded_seq is None]
    assert len(open_items) == MAX_OPEN_ITEMS
    budget = next(i for i in open_items if i.kind == "constraint" and "$" in i.value)
    update = f"{budget.text.split(' budget ')[0]} budget is $123456."
    planned = flow.plan(open_items, seq, [said("Never touch the kestrel folder.", update)])
    assert [w.statement.text for w in planned.writes] == [update] and planned.left_out == 1
    after = stored(planned, open_items)
    assert len([i for i in after if i.superseded_seq is None]) <= MAX_OPEN_ITEMS  # (it may replace several)
    assert next(i for i in after if i.id == budget.id).superseded_seq == seq  # the replaced value is not current


def _named(items: list[LedgerItem], seq: int) -> list[LedgerItem]:
    """Items with the plan's placeholder ids ("new:k") named as stored ones, their supersessions following."""
    names = {i.id: f"led_{seq}_{i.id[4:]}" for i in items if i.id.startswith("new:")}
    return [replace(i, id=names.get(i.id, i.id), superseded_by=names.get(i.superseded_by or "", i.superseded_by))
            for i in items]  # fmt: skip


# --- through the ingestor and the reader, on both stores -------------------------------------------------------------------


def test_a_rule_dense_request_stays_within_the_caps(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            transcript = rule_dense_request(60)  # 60 messages of 4 KB of rules, about 80 statements each
            result = await ingestor.ingest("t", transcript)
            await read_ledger(store, files, result.conversation_id)
            items = await store.read.ledger(result.conversation_id, include_superseded=True)
            open_items = [i for i in items if i.superseded_seq is None]
            assert len(open_items) == MAX_OPEN_ITEMS

            def open_after(seq: int) -> int:
                return len([i for i in items if i.seq <= seq and (i.superseded_seq or seq + 1) > seq])

            for seq in range(len(transcript)):  # a message opens at most 8 items more than it replaces
                assert open_after(seq) - open_after(seq - 1) <= MAX_NEW_PER_MESSAGE
            assert len(items) > MAX_OPEN_ITEMS  # updates went on being written past the cap
            ids = {m.seq: m.id for m in await store.read.messages(result.conversation_id)}
            assert all(i.message_id == ids[i.seq] for i in items)

    run(scenario())


def test_a_ledger_changed_between_plan_and_write_is_planned_again(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            first = [user("The budget cap is $800."), {"role": "assistant", "content": "Noted."}]
            conversation = (await ingestor.ingest("t", first)).conversation_id
            await read_ledger(store, files, conversation)
            (old,) = await store.read.ledger(conversation)
            prepare = Intake.prepare
            plans: list[Plan] = []

            async def prepare_then_pin(self: Intake, *args: Any) -> None:
                await prepare(self, *args)
                assert self.plan is not None
                plans.append(self.plan)
                if len(plans) == 1:
                    async with store.write() as tx:  # the user pins the item meanwhile
                        await tx.set_ledger_state(conversation, old.id, "pinned")

            await ingestor.ingest("t", [*first, user("Quick update: keep spend under $500.")])
            with mock.patch.object(Intake, "prepare", prepare_then_pin):
                await read_ledger(store, files, conversation)
            items = await store.read.ledger(conversation, include_superseded=True)
            (new,) = [i for i in items if i.id != old.id]
            assert plans and plans[0].writes[0].state == "active"  # planned before the pin ...
            assert new.state == "pinned" and new.value == "$500"  # ... written after a new plan: the pin passed on
            assert [(i.id, i.superseded_by) for i in items if i.id == old.id] == [(old.id, new.id)]
            assert await rows(store, "SELECT count(*) FROM messages") == [(3,)]

    run(scenario())


def test_an_answer_sets_nothing_even_against_a_moved_ledger(where: Location) -> None:
    """``record_answer`` reads the model's answer like any message: an agent's turn sets nothing (its plans are
    in the summaries), so "we decided to use requests instead" neither adds an item nor replaces the user's,
    also when another request changed the ledger while the answer was being read."""
    from proxy.engine.answers import record_answer

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            first = [user("Let's go with httpx for the client code."), {"role": "assistant", "content": "Sure."}]
            result = await ingestor.ingest("t", first)
            conversation = result.conversation_id
            await read_ledger(store, files, conversation)
            (old,) = await store.read.ledger(conversation)
            prepare = Intake.prepare

            async def prepare_then_pin(self: Intake, *args: Any) -> None:
                await prepare(self, *args)
                async with store.write() as tx:
                    await tx.set_ledger_state(conversation, old.id, "pinned")

            answer = {"role": "assistant", "content": "We decided to use requests for the client code instead."}
            assert await record_answer(ingestor, "t", conversation, 2, result.tip_chain, answer, 0.0)
            with mock.patch.object(Intake, "prepare", prepare_then_pin):
                await read_ledger(store, files, conversation)
            items = await store.read.ledger(conversation, include_superseded=True)
            assert [(i.value, i.state, i.superseded_by) for i in items] == [(old.value, "pinned", None)]

    run(scenario())


def test_statements_are_read_in_one_worker_thread_call_per_run_of_messages(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            calls: list[int] = []
            to_thread = asyncio.to_thread

            async def counted(func: Any, *args: Any) -> Any:
                if getattr(func, "__module__", "") == flow.__name__:
                    calls.append(len(args))
                return await to_thread(func, *args)

            with mock.patch.object(flow.asyncio, "to_thread", counted):
                result = await ingestor.ingest("t", [user(f"Never touch the {w} folder.") for w in WORDS])
                assert calls == []  # ingest stores them only: they are read after the response
                await read_ledger(store, files, result.conversation_id)
            assert len(calls) == 2  # one call reads all 15 messages, one plans them

    run(scenario())
