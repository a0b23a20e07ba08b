"""``lcm-proxy migrate``: an SQLite store made by the engine (compaction, a fork, pasted files, tool results, a
relayed answer) copied into a real PostgreSQL, then read back through the store interface on both sides."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.engine.answers import record_answer
from proxy.engine.doctor import check_database
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.ingest import export_conversation
from proxy.store.files import FileStore
from proxy.store.location import Location
from proxy.store.migrate import PAYLOADS, TABLES, MigrateError, Migration, Outcome, _parents_first, report
from proxy.store.records import LedgerItem
from proxy.store.sqlite.store import SQLiteStore
from tests.support import REPO
from tests.support.compaction import SETTINGS as COMPACTION_SETTINGS
from tests.support.engine import assistant, row_count, rows, user

SETTINGS = COMPACTION_SETTINGS.model_copy(update={"summary_timeout": 5})
BIG = Budget(window=100_000, output_reserve=1000, tools=0)


class Summarizer:
    model = "summary-model"

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        return "Summary: " + " ".join(user.split()[:20])

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A document about " + " ".join(text.split()[:5])


def turns(n: int, tag: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append(user(f"{tag} question {i}: " + "please consider the following details carefully. " * 6))
        out.append(assistant(f"{tag} answer {i}: " + "here is a thorough response with several points. " * 6))
    return out


def with_payloads(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A pasted file over the large-file threshold and a tool result over the tool-result one."""
    pasted = "\n".join(f"line {i}: the quarterly ledger entry {i * 7919 % 10007} balanced" for i in range(700))
    calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": "read_log", "arguments": f'{{"n": {n}}}'}}
        for n in range(4)
    ]
    results = [
        {
            "role": "tool",
            "tool_call_id": f"call_{n}",
            "content": "\n".join(f"log {n} record {i}: status ok latency {i * 31 % 97} ms" for i in range(120)),
        }
        for n in range(4)
    ]
    return [
        *transcript,
        user("Here is the ledger:\n" + pasted),
        assistant("I read the ledger."),
        user("read the logs"),
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
        assistant("The logs look fine."),
    ]


async def build_source(data_dir: Path) -> None:
    """A compacted conversation with payloads, a fork of it, a second compacted conversation and a relayed
    answer: every table migrate copies holds rows."""
    store = SQLiteStore(data_dir)
    await store.open()
    files = FileStore(data_dir)
    engine = ContextEngine(store, files, SETTINGS)
    summarizer = Summarizer()
    try:
        main = with_payloads(turns(14, "alpha")) + turns(6, "beta")
        first = await engine.prepare("t", main, BIG, summarizer)
        cid = first.conversation_id or ""
        await engine.compactor.sweep(cid, summarizer)
        await standing_instructions(store, cid)  # before the fork: it gets copies of them
        await engine.prepare("t", [*main, user("and then?")], BIG, summarizer)
        fork = await engine.prepare("t", [*main[:-3], user("a different question")], BIG, summarizer)
        assert fork.conversation_id not in (None, cid)
        other = await engine.prepare("u", [{"role": "system", "content": "Be brief."}, *turns(12, "gamma")], BIG, None)
        await engine.compactor.sweep(other.conversation_id or "", summarizer)
        messages = await store.read.messages(cid)
        answered = await record_answer(
            engine.ingestor, "t", cid, len(messages), messages[-1].chain_hash, assistant("Then we ship."), 1.0
        )
        assert answered
        assert await check_database(store, files) == []
    finally:
        await store.close()


async def standing_instructions(store: SQLiteStore, cid: str) -> None:
    """Ledger items as ingest stores them: one superseded by a later one, one pinned."""
    first, later = (await store.read.messages(cid))[0:3:2]
    items = [
        LedgerItem(f"led_{n:016x}", cid, "constraint", "budget", value, f"Keep the budget under {value}.", m.seq, m.id,
                   "user", 5.0 + n)
        for n, (m, value) in enumerate(((first, "$800"), (later, "$500")))
    ]  # fmt: skip
    async with store.write() as tx:
        await tx.add_ledger_items(items)
        await tx.supersede_ledger_items([items[0].id], items[1].id, later.seq)
        await tx.set_ledger_state(cid, items[1].id, "pinned")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("source")
    asyncio.run(build_source(data_dir))
    return data_dir


@pytest.fixture
def source(built: Path, tmp_path: Path) -> Path:
    """A copy of the built store of this test's own (some tests damage it)."""
    data_dir = tmp_path / "data"
    shutil.copytree(built, data_dir)
    return data_dir


async def snapshot(where: Location) -> dict[str, Any]:
    """Everything a reader of either store sees, through the store interface only."""
    store, blobs = where.stores()
    await store.open()
    try:
        q = store.read
        seen: dict[str, Any] = {}
        for conversation in sorted(await q.conversations(None), key=lambda c: c.id):
            cid = conversation.id
            context = await q.context_summaries(cid)
            dag = {}
            stack = [s.id for s in context]
            while stack:
                summary_id = stack.pop()
                children = await q.child_summaries(summary_id)
                dag[summary_id] = (await q.summary(summary_id), children, await q.source_messages(summary_id))
                stack += [c.id for c in children]
            messages = await q.messages(cid)
            seen[cid] = {
                "conversation": conversation,
                "export": await export_conversation(store, blobs, None, cid),
                "messages": messages,
                "files": [await q.files_of_message(m.id) for m in messages],
                "context": context,
                "dag": dag,
                "last_sent": await q.last_sent(cid),
                "relayed": await q.replaceable_answer(cid),
                "ledger": await q.ledger(cid, include_superseded=True),
            }
        return seen
    finally:
        await store.close()


async def doctor(where: Location) -> list[str]:
    store, blobs = where.stores()
    await store.open()
    try:
        return await check_database(store, blobs)
    finally:
        await store.close()


def migrate(source: Path, dsn: str, **options: Any) -> Outcome:
    return asyncio.run(Migration(source, dsn, **options).run())


def test_a_migrated_store_reads_the_same_and_a_second_run_copies_nothing(source: Path, pg_dsn: str) -> None:
    before = asyncio.run(snapshot(Location(source)))
    kinds = {s.kind for c in before.values() for s, _, _ in c["dag"].values()}
    assert kinds == {"leaf", "condensed"}, kinds
    assert any(c["conversation"].parent_id for c in before.values())  # the fork
    assert any(f.kind == "tool_output" for c in before.values() for fs in c["files"] for f in fs)
    assert any(c["relayed"] is not None for c in before.values())

    outcome = migrate(source, pg_dsn)
    assert outcome.problems == [] and outcome.mismatches() == []
    assert all(outcome.source[t.name] > 0 for t in TABLES), outcome.source
    assert outcome.copied == outcome.source and outcome.source[PAYLOADS] >= 5

    target = Location(source, pg_dsn)
    assert asyncio.run(snapshot(target)) == before  # transcripts, ids, summaries, DAG links, context, files
    assert asyncio.run(doctor(target)) == []

    again = migrate(source, pg_dsn)
    assert set(again.copied.values()) == {0} and again.mismatches() == [] and again.problems == []
    with open(os.devnull, "w") as out:
        assert report(again, "target", out) == 0

    async def write_after() -> None:
        """The sequences moved past the copied ids: the proxy writes new messages and summaries on top."""
        store, blobs = target.stores()
        await store.open()
        try:
            engine = ContextEngine(store, blobs, SETTINGS)
            top = max(m.id for c in before.values() for m in c["messages"])
            prepared = await engine.prepare("v", turns(12, "delta"), BIG, Summarizer())
            await engine.compactor.sweep(prepared.conversation_id or "", Summarizer())
            assert min(m.id for m in await store.read.messages(prepared.conversation_id or "")) > top
            assert await store.read.context_summaries(prepared.conversation_id or "")
            assert await check_database(store, blobs) == []
        finally:
            await store.close()

    asyncio.run(write_after())


@pytest.mark.parametrize("stop_in", ["conversations", "messages", PAYLOADS, "summaries", "summary_sources"])
def test_an_interrupted_run_resumes_to_the_same_result(source: Path, pg_dsn: str, stop_in: str) -> None:
    class Stop(Exception):
        pass

    def after_batch(table: str, done: int) -> None:
        if table == stop_in:
            raise Stop(table)

    with pytest.raises(Stop):
        migrate(source, pg_dsn, batch_rows=2, after_batch=after_batch)
    target = Location(source, pg_dsn)

    async def partial() -> int:
        store, _ = target.stores()
        await store.open()
        try:
            table = "blobs" if stop_in == PAYLOADS else stop_in
            return await row_count(store, table)
        finally:
            await store.close()

    assert asyncio.run(partial()) == 2  # exactly the first batch was committed

    outcome = migrate(source, pg_dsn, batch_rows=3)
    assert outcome.problems == [] and outcome.mismatches() == []
    assert 0 < outcome.copied[stop_in] < outcome.source[stop_in]  # the resumed run did not copy it again
    assert asyncio.run(snapshot(target)) == asyncio.run(snapshot(Location(source)))
    assert asyncio.run(doctor(target)) == []


def test_missing_and_corrupt_payloads_are_reported_and_the_rest_copied(source: Path, pg_dsn: str) -> None:
    import sqlite3

    db = sqlite3.connect(source / "lcm.sqlite3")
    paths = db.execute("SELECT id, path FROM files ORDER BY id").fetchall()
    db.close()
    assert len(paths) >= 2
    (gone_id, gone), (bad_id, bad) = paths[0], paths[1]
    (source / gone).unlink()
    (source / bad).write_bytes(b"not what was stored")

    outcome = migrate(source, pg_dsn)
    assert len(outcome.problems) == 2
    assert gone_id in outcome.problems[0] or gone_id in outcome.problems[1]
    assert any(bad_id in p and "sha256" in p for p in outcome.problems)
    assert outcome.mismatches() == [f"{PAYLOADS}: {len(paths)} in SQLite, {len(paths) - 2} in PostgreSQL"]
    assert all(outcome.source[t.name] == outcome.target[t.name] for t in TABLES)
    with open(os.devnull, "w") as out:
        assert report(outcome, "target", out) == 1
    problems = asyncio.run(doctor(Location(source, pg_dsn)))
    assert any(gone in p for p in problems) and any(bad in p for p in problems)


def test_a_target_holding_other_data_is_refused_and_never_overwritten(source: Path, pg_dsn: str) -> None:
    migrate(source, pg_dsn)
    target = Location(source, pg_dsn)

    async def tamper(sql: str) -> None:
        store, _ = target.stores()
        await store.open()
        try:
            await rows(store, sql)
        finally:
            await store.close()

    async def texts() -> list[Any]:
        store, _ = target.stores()
        await store.open()
        try:
            return await rows(store, "SELECT text FROM messages WHERE id = (SELECT min(id) FROM messages)")
        finally:
            await store.close()

    asyncio.run(tamper("UPDATE messages SET text = 'changed in the target' WHERE id = (SELECT min(id) FROM messages)"))
    with pytest.raises(MigrateError, match=r"messages \(\d+\): the target holds other data \(text\)"):
        migrate(source, pg_dsn)
    assert asyncio.run(texts()) == [("changed in the target",)]

    asyncio.run(
        tamper("INSERT INTO conversations (id, tenant, created_at, updated_at) VALUES ('conv_foreign', 't', 0, 0)")
    )
    with pytest.raises(MigrateError, match="already holds conversation conv_foreign"):
        migrate(source, pg_dsn)


def test_forks_are_copied_after_the_conversations_they_come_from() -> None:
    # Neither ascending nor descending ids would do: conv_a is forked from conv_b, conv_c from conv_a.
    assert _parents_first({"conv_a": "conv_b", "conv_c": "conv_a", "conv_b": None, "conv_d": None}) == [
        "conv_b",
        "conv_d",
        "conv_a",
        "conv_c",
    ]
    with pytest.raises(MigrateError, match="cycle"):
        _parents_first({"conv_a": "conv_b", "conv_b": "conv_a"})


def console(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = REPO / ".venv" / "bin" / "lcm-proxy"
    found = str(script) if script.exists() else shutil.which("lcm-proxy")
    assert found, "the lcm-proxy console script is not installed"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_command_migrates_resumes_and_refuses_what_it_cannot_copy(
    source: Path, pg_dsn: str, tmp_path: Path
) -> None:
    first = console("migrate", "--data-dir", str(source), "--to", pg_dsn, "--batch-size", "7", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "migrate: messages: " in first.stderr  # not a terminal: one line per table
    lines = {line.split()[0]: line.split()[1:] for line in first.stdout.splitlines()[1:-1]}
    assert set(lines) == {t.name for t in TABLES} | {PAYLOADS}
    assert all(a == b == c for a, b, c in lines.values()), first.stdout  # sqlite, postgresql, copied now
    assert first.stdout.splitlines()[-1].endswith(": OK")

    again = console("migrate", "--data-dir", str(source), "--to", pg_dsn, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert all(line.split()[-1] == "0" for line in again.stdout.splitlines()[1:-1]), again.stdout

    wrong = console("migrate", "--data-dir", str(source), "--to", "sqlite:///x", cwd=tmp_path)
    assert wrong.returncode == 2 and "expected postgresql://" in wrong.stderr

    config = tmp_path / "proxy.yaml"
    config.write_text(
        "model_list:\n  - model_name: m\n    litellm_params: {model: openai/x, api_key: sk-x}\n"
        f"general_settings:\n  database_url: {pg_dsn}\n",
        encoding="utf-8",
    )
    from_pg = console("migrate", "--config", str(config), "--to", pg_dsn, cwd=tmp_path)
    assert from_pg.returncode == 1 and "already PostgreSQL" in from_pg.stderr, from_pg.stderr

    empty = console("migrate", "--data-dir", str(tmp_path / "nowhere"), "--to", pg_dsn, cwd=tmp_path)
    assert empty.returncode == 1 and "no database at" in empty.stderr


def test_text_with_nul_characters_migrates_and_exports_the_same(tmp_path: Path, pg_dsn: str) -> None:
    """PostgreSQL text holds no NUL: the copy writes it as the PostgreSQL store does, the transcript (stored as
    JSON) comes back exactly, and a second run finds every row as it left it."""
    transcript = [user("a\x00b"), assistant("c\x00d"), user("e")]

    async def build() -> str:
        store, files = Location(tmp_path).stores()
        await store.open()
        try:
            prepared = await ContextEngine(store, files, SETTINGS).prepare("t", transcript, BIG, None)
            return prepared.conversation_id or ""
        finally:
            await store.close()

    async def exported(where: Location, cid: str) -> list[dict[str, Any]]:
        store, files = where.stores()
        await store.open()
        try:
            return await export_conversation(store, files, "t", cid)
        finally:
            await store.close()

    cid = asyncio.run(build())
    assert migrate(tmp_path, pg_dsn).problems == []
    assert asyncio.run(exported(Location(tmp_path, pg_dsn), cid)) == transcript
    again = migrate(tmp_path, pg_dsn)
    assert set(again.copied.values()) == {0} and again.problems == []
