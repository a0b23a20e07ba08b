"""Compaction engine against a real store, SQLite and PostgreSQL: summarizer failure modes, budgets,
eviction, forks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.engine.doctor import check_database
from proxy.engine.engine import Budget
from proxy.engine.errors import ContextTooLong
from proxy.engine.ingest import export_conversation
from proxy.engine.summarize import FALLBACK_MARKER
from proxy.errors import UpstreamError
from proxy.store.location import Location
from proxy.wire.http import to_proxy_error
from tests.support.compaction import BIG, SETTINGS, Held, Scripted, long_turns, open_context_engine
from tests.support.engine import assistant, rows, run, unreachable_messages, user
from tests.support.sim import check_tool_pairing, without_recall


@pytest.mark.parametrize("behaviour", ["ok", "timeout", "500", "empty", "longer", "reasoning"])
def test_summarizer_failures_fall_back_and_stay_usable(where: Location, behaviour: str) -> None:
    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        summarizer = Scripted(behaviour)
        transcript = long_turns(12)
        prepared = await engine.prepare("t", transcript, BIG, summarizer)
        report = await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        assert report.leaf_passes >= 2 and not report.unavailable
        assert report.tokens_after < report.tokens_before
        summaries = await store.read.context_summaries(prepared.conversation_id or "")
        assert summaries
        if behaviour == "ok":
            assert all(
                s.escalation == 0 and s.content.startswith("Short summary of the discussion.")
                for s in summaries
                if s.kind == "leaf"
            )
        else:
            leaves = [s for s in summaries if s.kind == "leaf"]
            assert all(s.escalation == 2 and s.content.endswith(FALLBACK_MARKER) for s in leaves)
            assert all(s.token_count <= SETTINGS.fallback_max_tokens for s in leaves)
            assert "<think>" not in "".join(s.content for s in summaries)
        # Still usable: the next request assembles summaries + tail, and export is lossless.
        nxt = [*transcript, user("and now?")]
        again = await engine.prepare("t", nxt, BIG, summarizer)
        assert str(again.messages[0]["content"]).startswith('<summary id="sum_')
        assert without_recall(again.messages[-1]) == nxt[-1]
        assert await export_conversation(store, files, "t", again.conversation_id or "") == nxt
        assert await unreachable_messages(store, again.conversation_id or "") == set()
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_auth_failure_writes_no_summary_and_opens_breaker(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("401")
        prepared = await engine.prepare("t", long_turns(12), BIG, summarizer)
        report = await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        assert report.unavailable and report.leaf_passes == 0
        assert await store.read.context_summaries(prepared.conversation_id or "") == []
        calls = summarizer.calls
        report2 = await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        assert report2.unavailable and summarizer.calls == calls  # breaker open: no further call
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_hard_budget_compacts_inline_and_fits(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript = long_turns(30)
        budget = Budget(window=2500, output_reserve=300, tools=0)
        prepared = await engine.prepare("t", transcript, budget, summarizer)
        assert prepared.compaction == "inline"
        assert prepared.tokens_forwarded <= budget.window - budget.output_reserve
        assert [without_recall(m) for m in prepared.messages[-4:]] == transcript[-4:]
        check_tool_pairing(prepared.messages)
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_summarizer_down_evicts_from_view_not_from_store(where: Location) -> None:
    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        summarizer = Scripted("401")
        transcript = long_turns(30)
        budget = Budget(window=2500, output_reserve=300, tools=0)
        prepared = await engine.prepare("t", transcript, budget, summarizer)
        assert prepared.compaction == "evicted"
        assert prepared.tokens_forwarded <= budget.window - budget.output_reserve
        assert prepared.messages[-1] == transcript[-1]
        check_tool_pairing(prepared.messages)
        assert await export_conversation(store, files, "t", prepared.conversation_id or "") == transcript
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_tail_that_cannot_fit_is_context_length_exceeded(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        transcript = [user("x " * 1500)]  # under the huge-paste threshold (2000), over this budget
        with pytest.raises(ContextTooLong) as info:
            await engine.prepare("t", transcript, Budget(window=1200, output_reserve=200, tools=0), Scripted("ok"))
        reported = to_proxy_error(info.value)  # what the client gets
        assert reported.code == "context_length_exceeded" and reported.status == 400
        assert "newest user message" in info.value.message and "max_tokens" in info.value.message
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_tool_pairs_never_split_by_compaction(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript: list[dict[str, Any]] = []
        for i in range(25):
            calls = [
                {"id": f"c{i}_{j}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                for j in range(3)
            ]
            transcript += [user(f"q{i} " * 20), {"role": "assistant", "content": None, "tool_calls": calls}]
            transcript += [
                {"role": "tool", "tool_call_id": c["id"], "content": f"result {c['id']} " * 40} for c in calls
            ]
            transcript.append(assistant(f"a{i} " * 20))
            budget = Budget(window=3000, output_reserve=200, tools=0)
            prepared = await engine.prepare("t", transcript, budget, summarizer)
            check_tool_pairing(prepared.messages)
            assert prepared.tokens_forwarded <= 2800
            await engine.after_response(prepared, summarizer)
            await engine.wait_idle()
        summaries = await store.read.context_summaries(prepared.conversation_id or "")
        assert summaries
        for s in summaries:  # every summary boundary is a message that is not a tool result
            assert transcript[s.end_seq]["role"] != "tool"
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_zero_cost_below_threshold(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript = [{"role": "system", "content": "sys"}, user("hello")]
        for i in range(10):
            prepared = await engine.prepare("t", transcript, BIG, summarizer)
            assert prepared.messages is transcript and prepared.compaction == "none"
            assert not await engine.after_response(prepared, summarizer)
            transcript = [*transcript, assistant(f"a{i}"), user(f"u{i}")]
        assert summarizer.calls == 0
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_a_fork_waits_for_its_parents_running_compaction_and_reuses_it(where: Location) -> None:
    """A fork made while its parent is being compacted used to start a compaction of its own over the same
    prefix; now it waits for the parent's and takes its summaries of the shared prefix."""

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Held()
        transcript = long_turns(18)  # over the soft threshold of this budget, under its limit
        budget = Budget(window=3000, output_reserve=300, tools=0)
        first = await engine.prepare("t", transcript, budget, summarizer)
        assert first.compaction == "scheduled"
        assert await engine.after_response(first, summarizer)
        await summarizer.waiting.wait()  # the parent's compaction is running, its summary held
        edited = [*transcript[:-1], user("a different last question")]
        fork = asyncio.create_task(engine.prepare("t", edited, budget, summarizer))
        summarizer.release.set()
        forked = await fork
        await engine.wait_idle()
        assert forked.conversation_id != first.conversation_id
        parent = {s.id for s in await store.read.context_summaries(first.conversation_id or "")}
        shared = await store.read.context_summaries(forked.conversation_id or "")
        assert parent and shared and {s.id for s in shared} <= parent  # the parent's summaries, not new ones
        assert forked.sent.summaries and set(forked.sent.summaries) <= parent
        # Only the parent's sweep wrote summaries: the fork summarised nothing of the shared prefix.
        assert all(s.conversation_id == first.conversation_id for s in shared)
        await store.close()

    run(scenario())


def test_fork_shares_summaries_of_the_common_prefix(where: Location) -> None:
    async def scenario() -> None:
        engine, store, files = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript = long_turns(20)
        first = await engine.prepare("t", transcript, BIG, summarizer)
        await engine.compactor.sweep(first.conversation_id or "", summarizer)
        parent_summaries = await store.read.context_summaries(first.conversation_id or "")
        assert parent_summaries
        calls = summarizer.calls
        edited = [*transcript[:-3], user("a different question")]
        fork = await engine.prepare("t", edited, BIG, summarizer)
        assert fork.conversation_id != first.conversation_id
        shared = await store.read.context_summaries(fork.conversation_id or "")
        assert shared and {s.id for s in shared} <= {s.id for s in parent_summaries} | {
            c.id for p in parent_summaries for c in await store.read.child_summaries(p.id)
        }
        assert summarizer.calls == calls  # nothing summarised twice
        assert str(fork.messages[0]["content"]).startswith("<summary")
        assert without_recall(fork.messages[-1]) == edited[-1]
        assert await export_conversation(store, files, "t", fork.conversation_id or "") == edited
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_condensed_nodes_link_to_children(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        prepared = await engine.prepare("t", long_turns(40), BIG, summarizer)
        for _ in range(4):
            await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        context = await store.read.context_summaries(prepared.conversation_id or "")
        condensed = [s for s in context if s.kind == "condensed"]
        assert condensed, [s.kind for s in context]
        for node in condensed:
            children = await store.read.child_summaries(node.id)
            assert len(children) >= 2 and all(c.depth == node.depth - 1 for c in children)
            assert (node.start_seq, node.end_seq) == (children[0].start_seq, children[-1].end_seq)
            assert node.descendant_count == sum(c.descendant_count + 1 for c in children)
        assert await unreachable_messages(store, prepared.conversation_id or "") == set()
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_summarizer_call_cap_degrades_to_fallback(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(
            where, SETTINGS.model_copy(update={"max_summarizer_calls_per_hour": 1})
        )
        summarizer = Scripted("ok")
        prepared = await engine.prepare("t", long_turns(12), BIG, summarizer)
        report = await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        assert summarizer.calls == 1 and report.leaf_passes >= 2
        escalations = [row[0] for row in await rows(store, "SELECT escalation FROM summaries ORDER BY created_at, pk")]
        assert escalations.count(0) == 1 and escalations.count(2) == len(escalations) - 1 >= 1
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_file_ids_are_carried_into_summaries(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        document = "".join(f"row {i}: some value here\n" for i in range(1500))  # over the 2000-token threshold
        transcript = [user(f'<file name="rows.txt">{document}</file>'), assistant("got it"), *long_turns(10)]
        prepared = await engine.prepare("t", transcript, BIG, summarizer)
        file_id = prepared.messages[0]["content"].split("[LCM File: ")[1].split(" ")[0]
        await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        first = (await store.read.context_summaries(prepared.conversation_id or ""))[0]
        assert first.file_ids is not None and file_id in first.file_ids
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_hopeless_request_changes_nothing(where: Location) -> None:
    """A request whose fresh tail cannot fit (a huge max_tokens) fails before any compaction is stored."""

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript = long_turns(10)
        first = await engine.prepare("t", transcript, BIG, summarizer)
        with pytest.raises(ContextTooLong):
            await engine.prepare("t", transcript, Budget(window=8000, output_reserve=7990, tools=0), summarizer)
        assert summarizer.calls == 0
        assert await store.read.context_summaries(first.conversation_id or "") == []
        again = await engine.prepare("t", transcript, BIG, summarizer)
        assert again.messages is transcript
        assert await check_database(store, engine.files) == []  # doctor passes
        await store.close()

    run(scenario())


def test_fallbacks_do_not_copy_the_previous_summary_forward(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("500")
        prepared = await engine.prepare("t", long_turns(20), BIG, summarizer)
        await engine.compactor.sweep(prepared.conversation_id or "", summarizer)
        contents = [
            row[0] for row in await rows(store, "SELECT content FROM summaries WHERE kind = 'leaf' ORDER BY pk")
        ]
        assert len(contents) >= 3
        assert all("<previous_context>" not in c and "<conversation>" not in c for c in contents)
        assert len(set(contents)) == len(contents)
        await store.close()

    run(scenario())


def test_every_summarizer_failure_is_logged_with_its_cause_and_sizes(
    where: Location, caplog: pytest.LogCaptureFixture
) -> None:
    """A summarizer 400 or timeout used to show up only as ``fallbacks=1``."""

    class TooLong(Scripted):
        async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
            raise UpstreamError("request (17169 tokens) exceeds the available context size (8192 tokens)", status=400)

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        prepared = await engine.prepare("t", long_turns(12), BIG, TooLong())
        with caplog.at_level("WARNING", logger="lcm_proxy.compaction"):
            report = await engine.compactor.sweep(prepared.conversation_id or "", TooLong())
        assert report.fallbacks >= 1
        await store.close()

    run(scenario())
    # The compactor's own lines: a test before this one may leave a task whose log line lands here too.
    failures = [
        r.getMessage() for r in caplog.records if r.name == "lcm_proxy.compaction" and "failed" in r.getMessage()
    ]
    assert failures and all("HTTP 400" in m and "exceeds the available context size" in m for m in failures)
    assert all("source " in m and "max_tokens " in m and "model summary-model" in m for m in failures)
    assert not any("Question 0" in m for m in failures)  # sizes, never content
