"""Deleting conversations (``proxy.engine.deletion``) against a real store, SQLite and PostgreSQL: nothing of a
deleted conversation stays (rows, full-text entries, payloads, the raw bytes of the SQLite files), everything
else exports as before, forks keep what they share with a deleted parent until they go too, and doctor passes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pty
import re
import subprocess
from typing import IO, Any

import openai
import orjson
import pytest

from proxy.cli.main import main
from proxy.engine.deletion import Deleter
from proxy.engine.doctor import check_database
from proxy.engine.engine import ContextEngine
from proxy.engine.errors import NotFound
from proxy.engine.ingest import export_conversation
from proxy.engine.recall.tools import RecallTools
from proxy.store.location import Location
from proxy.store.records import LedgerItem
from proxy.store.sqlite.store import SQLiteStore
from tests.support.cli import main as in_process_cli
from tests.support.deletion import Echo, holding, open_engine, prepare, turns
from tests.support.engine import assistant, execute, located, rows, run, user


def pasted(name: str, body: str) -> dict[str, Any]:
    document = "".join(f"{body} line {i}: alpha beta gamma delta\n" for i in range(400))
    return user(f'Please read <file name="{name}" mime="text/plain">{document}</file> now')


async def compact(engine: ContextEngine, conversation_id: str) -> None:
    report = await engine.compactor.sweep(conversation_id, Echo())
    assert report.leaf_passes >= 1, report


async def everything(store: Any, files: Any) -> dict[str, tuple[str, list[Any]]]:
    """Every conversation a client can see, exported: {id: (tenant, transcript)}."""
    return {
        c.id: (c.tenant, await export_conversation(store, files, c.tenant, c.id))
        for c in await store.read.conversations(None, 10_000)
    }


async def traces(store: Any, conversation_ids: list[str], message_ids: list[int], summary_ids: list[str]) -> list[str]:
    """Rows anywhere that still belong to these conversations, messages or summaries."""
    found: list[str] = []

    async def count(label: str, table: str, column: str, values: list[Any]) -> None:
        for value in values:
            n = (await rows(store, f"SELECT count(*) FROM {table} WHERE {column} = ?", (value,)))[0][0]
            if n:
                found.append(f"{label}: {table}.{column} = {value} ({n})")

    tables = ("messages", "summaries", "context_items", "last_sent", "relayed_answers", "compaction_leases")
    for table in (*tables, "ledger_items"):
        await count("conversation", table, "conversation_id", conversation_ids)
    await count("conversation", "conversations", "id", conversation_ids)
    await count("conversation", "conversations", "parent_id", conversation_ids)
    await count("conversation", "files", "conversation_id", conversation_ids)
    await count("message", "messages", "id", message_ids)
    await count("message", "message_files", "message_id", message_ids)
    await count("message", "summary_sources", "message_id", message_ids)
    await count("message", "ledger_items", "message_id", message_ids)
    for column in ("summary_id", "child_summary_id"):
        await count("summary", "summary_sources", column, summary_ids)
    await count("summary", "context_items", "summary_id", summary_ids)
    await count("summary", "summaries", "id", summary_ids)
    return found


async def owned(store: Any, conversation_ids: list[str]) -> tuple[list[int], list[str]]:
    message_ids: list[int] = []
    summary_ids: list[str] = []
    for cid in conversation_ids:
        message_ids += [
            int(r[0]) for r in await rows(store, "SELECT id FROM messages WHERE conversation_id = ?", (cid,))
        ]
        summary_ids += [
            str(r[0]) for r in await rows(store, "SELECT id FROM summaries WHERE conversation_id = ?", (cid,))
        ]
    return message_ids, summary_ids


async def stated(store: Any, conversation_id: str, marker: str) -> list[LedgerItem]:
    """Two standing instructions carrying ``marker`` (the second, from a later message, supersedes the first), as
    ingest stores them."""
    first, later = (await store.read.messages(conversation_id))[1:4:2]
    items = [
        LedgerItem(f"led_{n:03d}{conversation_id[-13:]}", conversation_id, "rule", "vault code", value,
                   f"The vault code is {value}.", m.seq, m.id, "user", 1.0)
        for n, (m, value) in enumerate(((first, f"{marker}A"), (later, f"{marker}B")))
    ]  # fmt: skip
    async with store.write() as tx:
        await tx.add_ledger_items(items)
        await tx.supersede_ledger_items([items[0].id], items[1].id, later.seq)
    stored: list[LedgerItem] = await store.read.ledger(conversation_id, include_superseded=True)
    assert [i.current for i in stored] == [False, True]
    return stored


async def payloads(store: Any, files: Any) -> set[str]:
    """Paths of stored payload contents: files on disk, or rows of lcm.blobs."""
    if isinstance(store, SQLiteStore):
        return {f.relative for f in files.stored_files()}
    return {str(r[0]) for r in await rows(store, "SELECT path FROM blobs")}


async def indexed_terms(store: Any) -> str:
    """Every term of both full-text indexes (SQLite's FTS5 tables, PostgreSQL's tsvector columns), one string."""
    if isinstance(store, SQLiteStore):
        conn = store.search_conn
        terms = []
        for table in ("messages_fts", "summaries_fts"):
            await conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.v_{table} USING fts5vocab(main, {table}, row)")
            async with conn.execute(f"SELECT term FROM temp.v_{table}") as cursor:
                terms += [str(r[0]) for r in await cursor.fetchall()]
        return " ".join(terms)
    found = await rows(store, "SELECT words::text FROM messages UNION ALL SELECT words::text FROM summaries")
    return " ".join(str(r[0]) for r in found)


def test_delete_leaves_nothing_of_a_conversation_and_everything_else(where: Location) -> None:
    marker = "ZqDeletedWombat4711"

    async def scenario() -> None:
        engine, store, files, deleter = await open_engine(where)
        shared_file = pasted("shared.txt", "common material")

        def transcript(mark: str) -> list[dict[str, Any]]:
            # Its instructions, a message, a summary and a file of its own carry the marker; it shares a
            # pasted file with another conversation of the same tenant.
            return [
                {"role": "system", "content": f"You help {mark}."},
                shared_file,
                assistant("Read it."),
                pasted("own.txt", f"private {mark}"),
                assistant("Read that too."),
                *turns(10, "Doomed", mark),
                # Short, and last: it shares a database page with the next conversation's first messages, which
                # stay (the page is rewritten, not freed: only secure_delete zeroes the deleted cell).
                user(f"And {mark}?"),
            ]

        doomed = transcript(marker)
        doomed_id = await prepare(engine, "t", doomed)
        await compact(engine, doomed_id)
        await stated(store, doomed_id, marker)
        keeper_id = await prepare(
            engine, "t", [user("Keeper here."), assistant("Hi."), shared_file, *turns(3, "Keeper")]
        )
        # Another tenant with the same transcript (but its own marker): a conversation of its own, untouched.
        other_id = await prepare(engine, "u", transcript("ZqOtherWombat99"))
        summaries = await store.read.context_summaries(doomed_id)
        assert any(marker in s.content for s in summaries)  # the marker reached a summary
        before = await everything(store, files)
        stored_before = await payloads(store, files)
        assert len(stored_before) == 4  # two files per tenant
        message_ids, summary_ids = await owned(store, [doomed_id])
        assert marker.lower() in await indexed_terms(store)
        if isinstance(store, SQLiteStore):
            assert holding(where.data_dir, marker)  # present before: the check below can fail

        deleted = await deleter.delete("t", doomed_id, via="cli")

        assert (deleted.id, deleted.tenant, deleted.forks, deleted.kept_messages) == (doomed_id, "t", 0, 0)
        assert deleted.messages == len(message_ids) and deleted.summaries == len(summary_ids) >= 1
        assert deleted.files == 1  # its own file; the shared one is still the keeper's
        assert await traces(store, [doomed_id], message_ids, summary_ids) == []
        assert len(await payloads(store, files)) == 3
        assert (await rows(store, "SELECT count(*) FROM files"))[0][0] == 3  # and their rows
        assert marker.lower() not in await indexed_terms(store)
        after = await everything(store, files)
        assert after == {k: v for k, v in before.items() if k != doomed_id}
        assert set(after) == {keeper_id, other_id}
        # The shared file, first seen in the deleted conversation, now belongs to the keeper (the admin view
        # of a file scopes it by that conversation).
        shared_ids = {str(r[0]) for r in await rows(store, "SELECT id FROM files WHERE tenant = 't'")}
        assert len(shared_ids) == 1
        assert await store.read.file_owner("t", shared_ids.pop()) == ("t", keeper_id)
        with pytest.raises(NotFound):
            await deleter.delete("t", doomed_id, via="cli")  # gone: deleting again is an unknown id
        with pytest.raises(NotFound):
            await deleter.delete("t", other_id, via="cli")  # another tenant's: just as unknown
        if isinstance(store, SQLiteStore):
            assert holding(where.data_dir, marker) == []  # not in lcm.sqlite3, its -wal, nor any file
        else:  # the dead rows are vacuumed away (their space is reused, not zeroed: docs/operations.md, "Deleting data")
            async with store.pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT relname FROM pg_stat_user_tables WHERE schemaname = 'lcm' AND last_vacuum IS NOT NULL"
                )
                vacuumed = {r[0] for r in await cursor.fetchall()}
            assert {"messages", "summaries", "files", "blobs", "conversations"} <= vacuumed
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_a_deleted_parent_stays_for_its_fork_until_the_fork_goes(where: Location) -> None:
    marker = "ZqParentWombat1234"

    async def scenario() -> None:
        engine, store, files, deleter = await open_engine(where)
        tools = RecallTools(store, files)
        parent = [pasted("notes.txt", "shared notes"), assistant("Read it."), *turns(14, "Parent", marker)]
        parent_id = await prepare(engine, "t", parent)
        await compact(engine, parent_id)
        ledger = await stated(store, parent_id, marker)
        edited = [*parent[:-3], user("a different question altogether")]
        fork_id = await prepare(engine, "t", edited)
        assert fork_id != parent_id
        assert [i.text for i in await store.read.ledger(fork_id)] == [ledger[1].text]  # the fork's own copies
        fork_context = await store.read.context_summaries(fork_id)
        assert fork_context and all(s.conversation_id == parent_id for s in fork_context)
        fork_export = await export_conversation(store, files, "t", fork_id)
        parent_messages, parent_summaries = await owned(store, [parent_id])
        fork_point = (await store.read.conversation("t", fork_id)).fork_seq

        deleted = await deleter.delete("t", parent_id, via="api")

        # Kept for the fork: the prefix up to the fork point and the summaries its context names.
        assert (deleted.forks, deleted.kept_messages) == (1, fork_point)
        assert deleted.messages == len(parent_messages) - fork_point
        # Gone for every lookup made for a client.
        assert await store.read.conversation("t", parent_id) is None
        assert await store.read.conversation_by_key("t", parent_id) is None
        assert parent_id not in {c.id for c in await store.read.conversations("t")}
        with pytest.raises(NotFound):
            await export_conversation(store, files, "t", parent_id)
        kept = await store.read.conversation(None, parent_id, deleted=True)
        assert kept is not None and kept.deleted_at is not None and kept.instructions_json is None
        assert await store.read.ledger(parent_id, include_superseded=True) == ledger  # within the kept prefix
        assert [i.text for i in await store.read.ledger(fork_id)] == [ledger[1].text]
        assert kept.message_count == fork_point and await store.read.context_summaries(parent_id) == []
        # The fork is whole: its export, its context, and recall into the shared prefix.
        assert await export_conversation(store, files, "t", fork_id) == fork_export
        assert [s.id for s in await store.read.context_summaries(fork_id)] == [s.id for s in fork_context]
        scope = await tools.scope("t", fork_id)
        assert scope.bounds[1] == (parent_id, fork_point)

        async def call(name: str, **args: Any) -> str:
            return await tools.run(scope, name, orjson.dumps(args).decode())

        leaf = fork_context[0]
        assert marker in await call("lcm_describe", id=leaf.id)
        while leaf.kind == "condensed":  # down to the parent's messages
            leaf = (await store.read.child_summaries(leaf.id))[0]
        expanded = await call("lcm_expand", id=leaf.id, token_cap=20000)
        assert "Parent question 1" in expanded
        message_id = int(re.findall(r"msg_(\d+)", expanded)[-1])
        assert (await store.read.messages_by_id([message_id]))[0].conversation_id == parent_id
        assert "Parent " in await call("lcm_describe", id=f"msg_{message_id}")
        assert "shared notes line 399" in await call("lcm_grep", pattern="shared notes line 399")
        assert await check_database(store, files) == []
        # A new request opening like the deleted parent does not continue it.
        again = await prepare(engine, "t", [*parent, user("one more")])
        assert again not in (parent_id, fork_id)
        assert (await store.read.conversation("t", again)).parent_id != parent_id
        await deleter.delete("t", again, via="api")
        assert (await store.read.conversation(None, parent_id, deleted=True)) is not None  # the fork still lives

        # The fork goes: so does everything kept of the parent.
        fork_messages, fork_summaries = await owned(store, [fork_id])
        gone = await deleter.delete("t", fork_id, via="api")
        assert gone.forks == 0
        assert await store.read.conversation(None, parent_id, deleted=True) is None
        assert (
            await traces(
                store, [parent_id, fork_id], parent_messages + fork_messages, parent_summaries + fork_summaries
            )
            == []
        )
        assert await payloads(store, files) == set()
        assert await rows(store, "SELECT id FROM conversations") == []
        assert marker.lower() not in await indexed_terms(store)
        if isinstance(store, SQLiteStore):
            assert holding(where.data_dir, marker) == []
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_deleting_a_fork_leaves_its_parent_as_it_was(where: Location) -> None:
    async def scenario() -> None:
        engine, store, files, deleter = await open_engine(where)
        parent = turns(14, "Parent")
        parent_id = await prepare(engine, "t", parent)
        await compact(engine, parent_id)
        fork_id = await prepare(engine, "t", [*parent[:-3], user("another way")])
        sibling_id = await prepare(engine, "t", [*parent[:-1], user("a third way")])
        before = await everything(store, files)
        parent_rows = await rows(store, "SELECT id, text FROM messages WHERE conversation_id = ?", (parent_id,))
        parent_context = [s.id for s in await store.read.context_summaries(parent_id)]

        deleted = await deleter.delete("t", fork_id, via="api")

        assert deleted.forks == 0 and deleted.kept_messages == 0
        assert await rows(store, "SELECT id, text FROM messages WHERE conversation_id = ?", (parent_id,)) == parent_rows
        assert [s.id for s in await store.read.context_summaries(parent_id)] == parent_context
        assert await everything(store, files) == {k: v for k, v in before.items() if k != fork_id}
        assert (await store.read.conversation("t", sibling_id)).parent_id == parent_id
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_a_chain_of_deleted_forks_is_kept_for_its_last_live_descendant(where: Location) -> None:
    """A <- B <- C: deleting A, then B, keeps both for C (each up to where the line of forks left it);
    deleting C then removes all three."""

    async def scenario() -> None:
        engine, store, files, deleter = await open_engine(where)
        a = turns(12, "Root")
        a_id = await prepare(engine, "t", a)
        await compact(engine, a_id)
        b = [*a[:-3], user("branch b"), assistant("b answer"), *turns(3, "Bee")]
        b_id = await prepare(engine, "t", b)
        c_id = await prepare(engine, "t", [*b[:-2], user("branch c")])
        c = await store.read.conversation("t", c_id)
        assert c.parent_id == b_id
        c_export = await export_conversation(store, files, "t", c_id)

        await deleter.delete("t", a_id, via="cli")
        second = await deleter.delete("t", b_id, via="cli")
        assert second.forks == 1 and second.kept_messages == c.fork_seq
        kept_a = await store.read.conversation(None, a_id, deleted=True)
        kept_b = await store.read.conversation(None, b_id, deleted=True)
        assert kept_a is not None and kept_b is not None and kept_b.deleted_at is not None
        assert kept_a.message_count == kept_b.fork_seq  # the line of forks left A where B did
        assert await store.read.conversations("t") == [await store.read.conversation("t", c_id)]
        assert await export_conversation(store, files, "t", c_id) == c_export
        assert await check_database(store, files) == []

        await deleter.delete("t", c_id, via="cli")
        assert await rows(store, "SELECT id FROM conversations") == []
        assert await rows(store, "SELECT id FROM messages") == []
        assert await rows(store, "SELECT id FROM summaries") == []
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_sibling_forks_deleted_at_once_take_their_deleted_parent_with_them(where: Location) -> None:
    """Two deletions racing (two stores on one database, as two workers or replicas are): the second to reach
    the deleted parent sees the first's result, so nothing of the parent outlives both forks."""

    async def scenario() -> None:
        engine, store, files, deleter = await open_engine(where)
        parent = turns(10, "Parent")
        parent_id = await prepare(engine, "t", parent)
        await compact(engine, parent_id)
        first = await prepare(engine, "t", [*parent[:-3], user("first branch")])
        second = await prepare(engine, "t", [*parent[:-1], user("second branch")])
        await deleter.delete("t", parent_id, via="api")
        other, other_files = located(where).stores()
        await other.open()
        try:
            await asyncio.gather(
                deleter.delete("t", first, via="api"), Deleter(other, other_files).delete("t", second, via="api")
            )
        finally:
            await other.close()
        assert await rows(store, "SELECT id FROM conversations") == []
        assert await rows(store, "SELECT id FROM summaries") == []
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


def test_purge_deletes_by_age_and_by_tenant(where: Location) -> None:
    async def scenario() -> None:
        engine, store, files, deleter = await open_engine(where)
        old_id = await prepare(engine, "t", turns(2, "Old"))
        recent_id = await prepare(engine, "t", turns(2, "Recent"))
        other_old_id = await prepare(engine, "u", turns(2, "Other"))
        # Last activity 40 days ago for two of them: the store's own column, set behind the engine's back.
        for cid in (old_id, other_old_id):
            await execute(store, "UPDATE conversations SET updated_at = updated_at - ? WHERE id = ?", (40 * 86400, cid))
        cutoff = (await store.read.conversation("t", recent_id)).updated_at - 30 * 86400

        assert {c.id for c in await deleter.candidates(None, cutoff, 100)} == {old_id, other_old_id}
        assert [c.id for c in await deleter.candidates("t", cutoff, 100)] == [old_id]
        purged = await deleter.purge("t", cutoff, via="cli")
        assert [d.id for d in purged] == [old_id]
        assert {c.id for c in await store.read.conversations(None)} == {recent_id, other_old_id}
        everything_of_u = await deleter.purge("u", None, via="cli")
        assert [d.id for d in everything_of_u] == [other_old_id]
        assert [c.id for c in await store.read.conversations(None)] == [recent_id]
        with pytest.raises(ValueError):
            await deleter.purge(None, None, via="cli")
        assert await check_database(store, files) == []
        await store.close()

    run(scenario())


ALICE_KEY, BOB_KEY = "sk-alice-0000000", "sk-bob-11111111"
KEYS = [{"key": ALICE_KEY, "tenant": "alice"}, {"key": BOB_KEY, "tenant": "bob"}]


def test_delete_over_http_answers_for_own_conversations_only(
    where: Location, app_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    marker = "ZqHttpWombat5150"
    proxy = app_factory(api_keys=KEYS, where=where)

    def started(key: str, text: str) -> str:
        sdk = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, http_client=proxy.client)
        raw = sdk.chat.completions.with_raw_response.create(
            model="test-model", messages=[{"role": "user", "content": text}]
        )
        return str(raw.headers["x-lcm-conversation-id"])

    alices = started(ALICE_KEY, f"My secret is {marker}.")
    bobs = started(BOB_KEY, "Bob's own question.")
    alice = {"authorization": f"Bearer {ALICE_KEY}"}
    bob = {"authorization": f"Bearer {BOB_KEY}"}
    caplog.set_level(logging.INFO, logger="lcm_proxy.audit")
    client = proxy.client
    theirs = client.delete(f"/lcm/conversations/{alices}", headers=bob)
    unknown = client.delete("/lcm/conversations/conv_0123456789abcdef", headers=bob)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"] == {**unknown.json()["error"], "message": f"no conversation {alices}"}
    assert client.get(f"/lcm/conversations/{alices}", headers=alice).status_code == 200  # untouched
    assert not [r for r in caplog.records if r.name == "lcm_proxy.audit"]

    mine = client.delete(f"/lcm/conversations/{alices}", headers=alice)

    assert mine.status_code == 200, mine.text
    body = mine.json()
    assert body["id"] == alices and body["deleted"] is True and body["messages"] >= 1
    assert body["kept_for_forks"] == {"forks": 0, "messages": 0}
    assert client.get(f"/lcm/conversations/{alices}", headers=alice).status_code == 404
    assert client.delete(f"/lcm/conversations/{alices}", headers=alice).status_code == 404
    assert client.get("/lcm/conversations", headers=alice).json()["data"] == []
    assert [c["id"] for c in client.get("/lcm/conversations", headers=bob).json()["data"]] == [bobs]
    audit = [r for r in caplog.records if r.name == "lcm_proxy.audit"]
    assert len(audit) == 1 and audit[0].levelno == logging.INFO
    line = audit[0].getMessage()
    assert alices in line and "'alice'" in line and "via api" in line
    assert marker not in line and ALICE_KEY not in line and "secret" not in line


def test_delete_and_purge_on_the_command_line(where: Location, capsys: pytest.CaptureFixture[str]) -> None:
    async def populate() -> dict[str, str]:
        engine, store, _, _ = await open_engine(where)
        made = {
            "old": await prepare(engine, "t", turns(2, "Old")),
            "kept": await prepare(engine, "t", turns(2, "Kept")),
            "asked": await prepare(engine, "t", turns(2, "Asked")),
            "other": await prepare(engine, "u", turns(2, "Other")),
        }
        await execute(
            store, "UPDATE conversations SET updated_at = updated_at - ? WHERE id = ?", (40 * 86400, made["old"])
        )
        await store.close()
        return made

    made = run(populate())
    store_args = ["--data-dir", str(where.data_dir)]
    if where.database_url is not None:
        store_args += ["--database-url", where.database_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}

    def cli(*args: str, stdin: str | IO[str] = "") -> subprocess.CompletedProcess[str]:
        return in_process_cli(*args, *store_args, env=env, stdin=stdin)

    async def live() -> set[str]:
        store, _ = where.stores()
        await store.open()
        try:
            return {c.id for c in await store.read.conversations(None)}
        finally:
            await store.close()

    # Refused before anything is read: a bad duration, nothing named, a whole tenant without --yes, no terminal.
    for args, said in (
        (["purge", "--older-than", "3 weeks"], "expected a duration such as 30d, 12h or 90m"),
        (["purge", "--older-than", "0d"], "expected a duration"),
        (["purge"], "name what to delete"),
        (["purge", "--tenant", "u"], "deleting everything of tenant u needs --yes"),
    ):
        with pytest.raises(SystemExit) if "duration" in said else contextlib.nullcontext():
            assert main([*args, *store_args]) == 2
        assert said in capsys.readouterr().err
    unconfirmed = cli("delete", made["asked"])
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr
    assert run(live()) == set(made.values())

    # A terminal gets a question; anything but yes deletes nothing.
    controller, terminal = pty.openpty()
    try:
        with open(terminal, closefd=False) as tty:
            os.write(controller, b"n\n")
            declined = cli("delete", made["asked"], stdin=tty)
            os.write(controller, b"y\n")
            confirmed = cli("delete", made["asked"], stdin=tty)
    finally:
        os.close(controller)
        os.close(terminal)
    assert declined.returncode == 1 and "aborted: nothing was deleted" in declined.stderr
    assert f"Delete conversation {made['asked']} of tenant t (4 messages)? [y/N]" in declined.stdout
    assert confirmed.returncode == 0, confirmed.stderr
    assert f"deleted {made['asked']} (tenant t): 4 messages" in confirmed.stdout
    assert f"deleted conversation {made['asked']} of tenant 't' via cli" in confirmed.stderr  # the audit line

    unknown = cli("delete", "conv_0123456789abcdef", "--yes")
    assert unknown.returncode == 1 and "no conversation conv_0123456789abcdef" in unknown.stderr
    elsewhere = cli("delete", made["kept"], "--tenant", "u", "--yes")
    assert elsewhere.returncode == 1 and f"no conversation {made['kept']}" in elsewhere.stderr

    dry = cli("purge", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert made["old"] in dry.stdout and made["kept"] not in dry.stdout
    assert "would delete 1 conversation(s) of every tenant" in dry.stdout
    assert run(live()) == {made["old"], made["kept"], made["other"]}
    purged = cli("purge", "--older-than", "30d", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert f"deleted {made['old']} (tenant t)" in purged.stdout and "deleted 1 conversation(s)" in purged.stdout
    everything = cli("purge", "--tenant", "u", "--yes", "--vacuum-full")
    assert everything.returncode == 0 and f"deleted {made['other']} (tenant u)" in everything.stdout
    assert run(live()) == {made["kept"]}
    doctor = cli("doctor")
    assert doctor.returncode == 0, doctor.stdout
