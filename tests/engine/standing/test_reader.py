"""The ledger's reader off the request's path (``proxy/engine/standing/reader.py``): a request is forwarded
before its messages are read for standing instructions; they are read after the response (the engine's tracked
background task), or caught up before the ledger is used, also when the background read never ran (a crash);
racing reads write each message's items once, and a fork reads what its parent had not read against its own
items. Synchronised by awaiting the engine's tasks, never by sleeping."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any
from unittest import mock

from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.standing import flow
from proxy.engine.standing.intake import Intake
from proxy.engine.standing.reader import LedgerReader
from proxy.store.location import Location
from tests.support.compaction import SETTINGS, Scripted, open_context_engine
from tests.support.engine import assistant, run, user

SMALL = Budget(window=2000, output_reserve=300, tools=0)
BIG = Budget(window=100_000, output_reserve=1000, tools=0)
FILLER = "We went through the sensor calibration notes for the east wing once more, line by line. " * 3
OPENING = [user("Two ground rules: never push to main. The budget cap is $800 for this quarter."), assistant("OK.")]


def chat(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [user(f"Round {i}: {FILLER}"), assistant(f"Noted round {i}.")]
    return out


class Heard:
    """``flow.heard`` counted: the messages the deterministic reader read, by their text."""

    def __init__(self) -> None:
        self.texts: Counter[str] = Counter()
        self._heard = flow.heard

    def __call__(self, message: dict[str, Any], *args: Any) -> flow.Heard:
        self.texts[str(message.get("content"))] += 1
        return self._heard(message, *args)


async def texts(store: Any, conversation_id: str) -> list[tuple[str, str, bool]]:
    items = await store.read.ledger(conversation_id, include_superseded=True)
    return sorted((i.kind, i.text, i.superseded_seq is None) for i in items)


def test_a_conversation_far_below_its_threshold_is_never_read(where: Location) -> None:
    """Its ledger would be neither forwarded nor reserved for: no message is read, before the request is
    forwarded or after its response."""

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        heard = Heard()
        with mock.patch.object(flow, "heard", heard):
            prepared = await engine.prepare("t", [*OPENING, user("What next?")], BIG, None)
            assert prepared.conversation_id is not None and prepared.compaction == "none"
            assert not engine.unread(prepared)
            await engine.after_response(prepared, None)  # the wire layer's hook, once the response is sent
            await engine.wait_idle()
        assert heard.texts == Counter()
        assert await texts(store, prepared.conversation_id) == []
        conversation = await store.read.conversation("t", prepared.conversation_id)
        assert conversation.ledger_upto == 0 and conversation.message_count == 3
        await engine.close()
        await store.close()

    run(scenario())


def test_a_turn_nearing_compaction_is_forwarded_before_its_messages_are_read(where: Location) -> None:
    """Past half its soft threshold (``READ_AHEAD``), still forwarded as sent: its messages, the earlier
    turns' among them, are read once after the response (the engine's tracked background task)."""

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        heard = Heard()
        transcript = [*OPENING, *chat(4), user("What next?")]
        with mock.patch.object(flow, "heard", heard):
            prepared = await engine.prepare("t", transcript, SMALL, None)
            assert prepared.conversation_id is not None
            assert prepared.compaction == "none" and prepared.messages is transcript  # forwarded as sent
            assert heard.texts == Counter()  # nothing read before the request is forwarded
            assert await texts(store, prepared.conversation_id) == []
            assert engine.unread(prepared)
            answer = assistant("Understood.")
            assert await engine.record_answer("t", prepared, answer, 1.0)  # the relayed answer, read with them
            await engine.after_response(prepared, None)  # the wire layer's hook, once the response is sent
            await engine.wait_idle()  # the background read, tracked by the engine
        assert heard.texts == Counter(str(m["content"]) for m in [*transcript, answer])  # each read once
        assert await texts(store, prepared.conversation_id) == [
            ("constraint", "The budget cap is $800 for this quarter.", True),
            ("rule", "Two ground rules: never push to main.", True),
        ]
        conversation = await store.read.conversation("t", prepared.conversation_id)
        assert conversation.ledger_upto == conversation.message_count == len(transcript) + 1
        await engine.close()
        await store.close()

    run(scenario())


def test_the_first_compacted_request_catches_up_a_ledger_never_read(where: Location) -> None:
    """A crash between storing the messages and reading them: the next process's first compacted request reads
    them before it assembles, and its block holds the rule and the latest limit, never the replaced one."""

    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        system = {"role": "system", "content": "You help run the east wing."}
        transcript = [system, *OPENING, user("Quick update: keep spend under $500 from now on."), assistant("OK.")]
        prepared = await engine.prepare("t", transcript, SMALL, None)
        assert prepared.compaction == "none" and prepared.messages is transcript  # forwarded as sent
        cid = prepared.conversation_id
        assert cid is not None and await texts(store, cid) == []
        # The process dies before the response ends: ``after_response`` never runs, nothing is read.
        restarted = ContextEngine(store, files, SETTINGS)
        transcript += chat(24)
        prepared = await restarted.prepare("t", transcript, SMALL, Scripted("ok"))
        assert prepared.conversation_id == cid and prepared.sent is not None and prepared.sent.first_raw > 4
        first = str(prepared.messages[1]["content"])
        assert first.startswith('<standing_instructions source="lcm-proxy">')
        assert "never push to main" in first and "keep spend under $500" in first
        assert "$800" not in "\n".join(str(m.get("content")) for m in prepared.messages)
        assert ("constraint", "The budget cap is $800 for this quarter.", False) in await texts(store, cid)
        await restarted.wait_idle()
        await restarted.close()
        # Compacted now, it is updated again, and the process dies again before the read: the next request
        # (no compaction of its own) reads the update before its block, which no longer shows $500 as current.
        transcript += [user("Quick update: keep spend under $300 from now on."), assistant("OK.")]
        again = ContextEngine(store, files, SETTINGS)
        prepared = await again.prepare("t", transcript, SMALL, Scripted("ok"))
        assert prepared.sent is not None and prepared.sent.first_raw > 4
        first = str(prepared.messages[1]["content"])
        assert "never push to main" in first and "$500" not in first
        await again.wait_idle()
        await again.close()
        await engine.close()
        await store.close()

    run(scenario())


def test_racing_reads_read_each_message_once_and_write_its_items_once(where: Location) -> None:
    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        transcript = [*OPENING, user("Quick update: keep spend under $500 from now on."), assistant("OK.")]
        prepared = await engine.prepare("t", transcript, BIG, None)
        cid = prepared.conversation_id
        assert cid is not None
        heard = Heard()
        with mock.patch.object(flow, "heard", heard):
            # Two requests of one process that need the ledger, and the background read: one read.
            await asyncio.gather(engine.reader.catch_up(cid), engine.reader.catch_up(cid), engine.wait_idle())
        assert sum(heard.texts.values()) == 4 and heard.texts["OK."] == 2  # each message once (two say "OK.")
        once = await texts(store, cid)
        assert once == [
            ("constraint", "Quick update: keep spend under $500 from now on.", True),
            ("constraint", "The budget cap is $800 for this quarter.", False),
            ("rule", "Two ground rules: never push to main.", True),
        ]

        # Two processes, each with its own reader, plan the same messages before either writes: one writes
        # them, the other finds the watermark moved and writes nothing.
        transcript += [user("Never touch the kestrel folder."), assistant("OK."), user("Use metric units.")]
        prepared = await engine.prepare("t", transcript, BIG, None)
        barrier, planned = asyncio.Barrier(2), []
        prepare = Intake.prepare

        async def prepare_then_wait(self: Intake, *args: Any) -> None:
            await prepare(self, *args)
            planned.append(self)
            if len(planned) <= 2:  # the two first plans, one per reader: neither writes before both planned
                await asyncio.wait_for(barrier.wait(), timeout=30)

        readers = [LedgerReader(store, files), LedgerReader(store, files)]
        with mock.patch.object(Intake, "prepare", prepare_then_wait):
            await asyncio.gather(*(reader.catch_up(cid) for reader in readers))
        assert sorted(reader.read_messages for reader in readers) == [0, 3]  # one wrote the run, the other nothing
        after = await texts(store, cid)
        assert Counter(after) == Counter([*once, ("rule", "Never touch the kestrel folder.", True),
                                          ("preference", "Use metric units.", True)])  # fmt: skip
        conversation = await store.read.conversation("t", cid)
        assert conversation.ledger_upto == conversation.message_count == 7
        await engine.close()
        await store.close()

    run(scenario())


def test_a_fork_reads_what_its_parent_had_not_read_against_its_own_items(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        parent = await engine.prepare("t", [*OPENING, user("Fine.")], BIG, None)  # not read yet
        edited = [*OPENING, user("Quick update: keep spend under $500 from now on.")]
        fork = await engine.prepare("t", edited, BIG, None)
        assert fork.conversation_id != parent.conversation_id and fork.conversation_id is not None
        record = await store.read.conversation("t", fork.conversation_id)
        assert record.ledger_upto == 0  # the parent's watermark at the fork point
        await engine.reader.catch_up(fork.conversation_id)  # (far below their thresholds: read when asked)
        await engine.reader.catch_up(parent.conversation_id or "")
        budget = "The budget cap is $800 for this quarter."
        assert ("constraint", budget, False) in await texts(store, fork.conversation_id)  # replaced in the fork
        assert ("constraint", budget, True) in await texts(store, parent.conversation_id or "")  # not in the parent
        # A later fork of the read parent copies its items and its watermark up to the fork point.
        later = await engine.prepare("t", [*OPENING, user("Use metric units.")], BIG, None)
        assert later.conversation_id is not None
        record = await store.read.conversation("t", later.conversation_id)
        assert record.ledger_upto == 2
        assert await texts(store, later.conversation_id) == [
            ("constraint", budget, True),
            ("rule", "Two ground rules: never push to main.", True),
        ]
        await engine.close()
        await store.close()

    run(scenario())


def test_a_replaced_relayed_answer_takes_the_watermark_back(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        prepared = await engine.prepare("t", [*OPENING, user("Plan?")], BIG, None)
        cid = prepared.conversation_id
        assert cid is not None
        assert await engine.record_answer("t", prepared, assistant("First we migrate the store."), 1.0)
        await engine.reader.catch_up(cid)
        assert (await store.read.conversation("t", cid)).ledger_upto == 4
        # A regenerate: the later request's answer replaces the relayed one in place, and is read again.
        assert await engine.record_answer("t", prepared, assistant("First we write the tests."), 2.0)
        record = await store.read.conversation("t", cid)
        assert (record.ledger_upto, record.message_count) == (3, 4)
        await engine.reader.catch_up(cid)  # (far below its threshold: read when the ledger is asked for)
        assert (await store.read.conversation("t", cid)).ledger_upto == 4
        await engine.close()
        await store.close()

    run(scenario())
