"""The running token sums stored on each message row (``proxy.store.running``), the tail-first view and the
galloping identity search: each equals what reading every row gives, and a long re-send reads as few rows as
a short one."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.config.lcm import LcmSettings
from proxy.dialects import CHAT
from proxy.engine.deletion import Deleter
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.rows import ToolNames
from proxy.store.files import FileStore
from proxy.store.location import Location
from proxy.store.sqlite.reads import Queries
from proxy.store.sqlite.store import SQLiteStore


class StubSummarizer:
    model = "stub"

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        return "Summary: what was said."

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A document."


def talk(n: int, mark: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(n):
        if i % 7 == 3:
            call = {"id": f"c{mark}{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": f"c{mark}{i}", "content": f"result {i} " * (i % 5 + 1)})
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{mark} message {i} " * (i % 9 + 1)})
    return out


async def check_sums(store: Any) -> int:
    """Every stored running sum equals the sum recomputed from the rows; returns the rows checked."""
    checked = 0
    for conversation in await store.read.conversations(None, deleted=True):
        rows = await store.read.messages(conversation.id)
        sums = await store.read.running_sums(conversation.id, [m.seq for m in rows])
        assert sums is not None, conversation.id
        tokens = sent = compact = 0
        for m in rows:
            tokens += m.token_count
            sent += m.sent_token_count
            compact += m.compact_token_count if m.compact_token_count is not None else m.token_count
            assert sums[m.seq] == (tokens, sent, compact), (conversation.id, m.seq)
            checked += 1
        count = len(rows)
        for start, end, stubbed in ((0, count, 0), (count // 3, count, count // 2), (1, count // 2, count)):
            expected = sum(
                (m.compact_token_count if m.seq < stubbed and m.compact_token_count is not None else m.token_count)
                for m in rows[start:end]
            )
            assert await store.read.raw_token_sum(conversation.id, start, end, stubbed) == expected
        assert await store.read.token_sums(conversation.id, count) == (tokens, sent)
    return checked


def test_running_sums_equal_the_rows_after_appends_forks_deletions_and_compaction(where: Location) -> None:
    async def scenario() -> None:
        store, files = where.stores()
        await store.open()
        engine = ContextEngine(store, files, LcmSettings())
        small = Budget(window=4096, output_reserve=512, tools=0)
        try:
            messages = talk(60, "a")
            first = await engine.prepare("t", messages, small, StubSummarizer())
            await engine.wait_idle()
            for r in range(3):  # continuations (compacting in between)
                messages = [*messages, {"role": "assistant", "content": f"ok {r}"}, {"role": "user", "content": "go"}]
                await engine.prepare("t", messages, small, StubSummarizer())
                await engine.wait_idle()
            edited = [*messages[:30], {"role": "user", "content": "an edited turn"}]  # a fork
            fork = await engine.prepare("t", edited, small, StubSummarizer())
            assert fork.conversation_id != first.conversation_id
            await engine.prepare(
                "t",
                [*edited, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
                small,
                StubSummarizer(),
            )
            await engine.compact(first.conversation_id, StubSummarizer())
            assert await check_sums(store) > 100
            await Deleter(store, files).delete("t", first.conversation_id, via="test")  # the fork keeps a prefix
            assert await check_sums(store) > 0
        finally:
            await engine.close()
            await store.close()

    asyncio.run(scenario())


def test_rows_without_running_sums_are_added_up_and_later_appends_heal(tmp_path: Any) -> None:
    """A row written by an older replica (no sums): readers add the rows up, the next append computes its base."""

    async def scenario() -> None:
        store = SQLiteStore(tmp_path)
        await store.open()
        engine = ContextEngine(store, FileStore(tmp_path), LcmSettings())
        big = Budget(window=1_000_000, output_reserve=512, tools=0)
        messages = talk(40, "b")
        prepared = await engine.prepare("t", messages, big, StubSummarizer())
        async with store.write() as tx:
            await tx.conn.execute("UPDATE messages SET cum_tokens = NULL WHERE seq % 2 = 1")
        before = await store.read.token_sums(prepared.conversation_id, len(messages) - 1)
        rows = await store.read.messages(prepared.conversation_id)
        assert before == (sum(m.token_count for m in rows), sum(m.sent_token_count for m in rows))
        messages = [*messages, {"role": "assistant", "content": "later"}, {"role": "user", "content": "more"}]
        await engine.prepare("t", messages, big, StubSummarizer())
        rows = await store.read.messages(prepared.conversation_id)
        sums = await store.read.running_sums(prepared.conversation_id, [rows[-1].seq])
        assert sums is not None and sums[rows[-1].seq][0] == sum(m.token_count for m in rows)
        await engine.close()
        await store.close()

    asyncio.run(scenario())


def test_a_long_resend_reads_as_many_rows_as_a_short_one(tmp_path: Any, monkeypatch: Any) -> None:
    """Identity gallops from the transcript's end and the view reads the tail and two running sums: the
    statements of a re-send and of a continuation do not grow with the conversation."""
    statements: list[str] = []
    one, every = Queries._one, Queries._all

    async def counted_one(self: Queries, sql: str, args: Any) -> Any:
        statements.append(sql)
        return await one(self, sql, args)

    async def counted_all(self: Queries, sql: str, args: Any) -> Any:
        statements.append(sql)
        return await every(self, sql, args)

    monkeypatch.setattr(Queries, "_one", counted_one)
    monkeypatch.setattr(Queries, "_all", counted_all)

    async def requests(n: int) -> tuple[int, int]:
        store = SQLiteStore(tmp_path / str(n))
        await store.open()
        engine = ContextEngine(store, FileStore(tmp_path / str(n)), LcmSettings(standing_instructions="off"))
        big = Budget(window=10_000_000, output_reserve=512, tools=0)
        messages = talk(n, "c")
        await engine.prepare("t", messages, big, StubSummarizer())
        statements.clear()
        await engine.prepare("t", messages, big, StubSummarizer())
        resend = len(statements)
        messages = [*messages, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
        statements.clear()
        await engine.prepare("t", messages, big, StubSummarizer())
        continuation = len(statements)
        await engine.close()
        await store.close()
        return resend, continuation

    short, long = asyncio.run(requests(20)), asyncio.run(requests(2000))
    assert long[0] <= short[0] + 1 and long[1] <= short[1] + 2, (short, long)


def test_the_tail_view_is_the_full_view(tmp_path: Any) -> None:
    async def scenario() -> None:
        store = SQLiteStore(tmp_path)
        await store.open()
        engine = ContextEngine(store, FileStore(tmp_path), LcmSettings(standing_instructions="off"))
        big = Budget(window=1_000_000, output_reserve=512, tools=0)
        messages = talk(400, "d")
        # A long run of tool rounds at the end: the required start lies far back.
        for i in range(100):
            call = {"id": f"r{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"r{i}", "content": "x"},
            ]
        prepared = await engine.prepare("t", messages, big, StubSummarizer())
        conversation = await store.read.conversation("t", prepared.conversation_id)
        assert conversation is not None
        count = len(messages) - 1
        for limit in (100, 5_000, 900_000):
            tail = await engine._view(conversation, count, limit, CHAT)
            full = await engine._view(conversation, count, limit, CHAT, tail=False)
            assert (tail.required, tail.tokens) == (full.required, full.tokens), limit
        await engine.close()
        await store.close()

    asyncio.run(scenario())


def test_tool_names_are_read_lazily_and_the_newest_call_wins() -> None:
    def call(i: str, name: str) -> dict[str, Any]:
        return {"id": i, "type": "function", "function": {"name": name, "arguments": "{}"}}

    transcript = [
        {"role": "assistant", "tool_calls": [call("a", "old"), call("b", "first")]},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [call("a", "new")]},
    ]
    names = ToolNames(CHAT, transcript)
    assert names.get("a") == "new"
    assert names.get("b") == "first" and names.get("zzz") is None
    assert dict(names) == {"a": "new", "b": "first"}
