"""Transcript reconciliation and interception, against a real SQLite file in a per-test data directory."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from proxy.engine.canonical import same_message
from proxy.engine.chunks import NeedsPreparation
from proxy.engine.errors import ConversationBusy
from proxy.engine.ingest import export_conversation
from proxy.store.location import Location
from proxy.wire.http import to_proxy_error
from tests.support.engine import ScriptedSummarizer, assistant, open_engine, row_count, run, user

SYSTEM = {"role": "system", "content": "You are helpful. Today is Monday."}


def test_continuation_appends_only_new_messages(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            t1 = [SYSTEM, user("hi")]
            r1 = await ingestor.ingest("t", t1)
            assert (r1.action, r1.appended) == ("new", 1)
            t2 = [*t1, assistant("hello"), user("how are you?")]
            r2 = await ingestor.ingest("t", t2)
            assert (r2.conversation_id, r2.action, r2.appended) == (r1.conversation_id, "append", 2)
            assert await row_count(store, "messages") == 3
            assert await export_conversation(store, files, "t", r2.conversation_id) == t2

    run(scenario())


def test_identical_resend_writes_nothing(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _):
            t = [user("hi"), assistant("hello"), user("again")]
            first = await ingestor.ingest("t", t)
            for _ in range(3):
                again = await ingestor.ingest("t", [dict(m) for m in t])
                assert (again.conversation_id, again.action, again.appended) == (first.conversation_id, "same", 0)
            assert await row_count(store, "messages") == 3
            assert await row_count(store, "conversations") == 1

    run(scenario())


def test_canonical_form_ignores_key_order_and_empty_fields(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _):
            call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            t = [
                user("q"),
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ]
            first = await ingestor.ingest("t", t)
            variant = [
                {"content": "q", "role": "user", "name": None},
                {"role": "assistant", "tool_calls": [call], "refusal": None, "content": ""},
                {"tool_call_id": "c1", "content": "r", "role": "tool"},
                user("next"),
            ]
            second = await ingestor.ingest("t", variant)
            assert (second.conversation_id, second.action, second.appended) == (first.conversation_id, "append", 1)
            assert await row_count(store, "messages") == 4

    run(scenario())


def test_regenerate_from_earlier_point_writes_nothing_then_forks(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            full = [user("a"), assistant("b"), user("c"), assistant("d"), user("e")]
            original = await ingestor.ingest("t", full)
            earlier = await ingestor.ingest("t", full[:3])
            assert (earlier.conversation_id, earlier.action, earlier.appended) == (
                original.conversation_id,
                "earlier",
                0,
            )
            assert earlier.messages == full[:3]  # served from what was sent, not from the longer stored version
            branch = [*full[:3], assistant("d2"), user("e2")]
            forked = await ingestor.ingest("t", branch)
            assert forked.action == "fork" and forked.forked_from == original.conversation_id
            assert forked.conversation_id != original.conversation_id
            assert await export_conversation(store, files, "t", original.conversation_id) == full
            assert await export_conversation(store, files, "t", forked.conversation_id) == branch
            # Continuing either branch goes to the right conversation.
            again = await ingestor.ingest("t", [*full, assistant("f")])
            assert again.conversation_id == original.conversation_id and again.appended == 1
            again2 = await ingestor.ingest("t", [*branch, assistant("f2")])
            assert again2.conversation_id == forked.conversation_id and again2.appended == 1

    run(scenario())


def test_edit_of_earlier_turn_forks_and_keeps_old_intact(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            old = [user("plan a trip"), assistant("where?"), user("Paris"), assistant("ok, Paris")]
            first = await ingestor.ingest("t", old)
            edited = [user("plan a trip"), assistant("where?"), user("Rome")]
            fork = await ingestor.ingest("t", edited)
            assert fork.action == "fork" and fork.conversation_id != first.conversation_id
            assert await export_conversation(store, files, "t", first.conversation_id) == old
            assert await export_conversation(store, files, "t", fork.conversation_id) == edited
            parent = await store.read.conversation("t", fork.conversation_id)
            assert parent is not None and (parent.parent_id, parent.fork_seq) == (first.conversation_id, 2)

    run(scenario())


def test_same_opening_never_mixes_once_different(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            a = [user("hi"), assistant("Hello! How can I help?"), user("tell me about cats")]
            b = [user("hi"), assistant("Hey there."), user("tell me about dogs")]
            ra = await ingestor.ingest("t", a)
            rb = await ingestor.ingest("t", b)
            assert ra.conversation_id != rb.conversation_id
            a2 = [*a, assistant("cats purr"), user("more")]
            b2 = [*b, assistant("dogs bark"), user("more")]
            assert (await ingestor.ingest("t", a2)).conversation_id == ra.conversation_id
            assert (await ingestor.ingest("t", b2)).conversation_id == rb.conversation_id
            assert await export_conversation(store, files, "t", ra.conversation_id) == a2
            assert await export_conversation(store, files, "t", rb.conversation_id) == b2

    run(scenario())


def test_changed_system_prompt_keeps_conversation(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            t = [user("hi"), assistant("hello")]
            first = await ingestor.ingest("t", [SYSTEM, *t])
            new_system = {"role": "system", "content": "You are helpful. Today is Tuesday."}
            second = await ingestor.ingest(
                "t", [new_system, {"role": "developer", "content": "be brief"}, *t, user("x")]
            )
            assert second.conversation_id == first.conversation_id and second.appended == 1
            exported = await export_conversation(store, files, "t", first.conversation_id)
            assert exported[:2] == [new_system, {"role": "developer", "content": "be brief"}]

    run(scenario())


def test_tenants_are_isolated(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _files):
            t = [user("secret plan"), assistant("noted")]
            alice = await ingestor.ingest("alice", t)
            bob = await ingestor.ingest("bob", [*t, user("continue")])
            assert bob.action == "new" and bob.conversation_id != alice.conversation_id
            assert await store.read.conversation("bob", alice.conversation_id) is None
            assert [c.id for c in await store.read.conversations("bob")] == [bob.conversation_id]

    run(scenario())


def test_explicit_conversation_key(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, _store, _files):
            t = [user("hi")]
            a = await ingestor.ingest("t", t, conversation_key="chat-A")
            b = await ingestor.ingest("t", t, conversation_key="chat-B")
            assert a.conversation_id != b.conversation_id  # same content, different keys: two conversations
            a2 = await ingestor.ingest("t", [*t, assistant("x"), user("y")], conversation_key="chat-A")
            assert (a2.conversation_id, a2.appended) == (a.conversation_id, 2)
            by_id = await ingestor.ingest(
                "t", [*t, assistant("x"), user("y"), assistant("z")], conversation_key=a.conversation_id
            )
            assert by_id.conversation_id == a.conversation_id and by_id.appended == 1
            edited = await ingestor.ingest("t", [user("hi"), assistant("other")], conversation_key="chat-A")
            assert edited.action == "fork" and edited.forked_from == a.conversation_id
            follow = await ingestor.ingest(
                "t", [user("hi"), assistant("other"), user("more")], conversation_key="chat-A"
            )
            assert follow.conversation_id == edited.conversation_id  # the key moved to the client's current branch

    run(scenario())


def test_concurrent_requests_for_one_conversation(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            base = [user("start")]
            await ingestor.ingest("t", base)
            longer = [*base, assistant("a"), user("b"), assistant("c"), user("d")]
            results = await asyncio.gather(*(ingestor.ingest("t", longer[: 2 + i % 4]) for i in range(24)))
            assert len({r.conversation_id for r in results}) == 1
            assert await row_count(store, "messages") == 5
            assert await export_conversation(store, files, "t", results[0].conversation_id) == longer

    run(scenario())


def file_block(name: str, body: str, mime: str = "text/plain") -> str:
    return f'<file name="{name}" mime="{mime}">{body}</file>'


def big_text(kib: int, seed: str = "line") -> str:
    line = f"{seed} alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu\n"
    return line * (kib * 1024 // len(line))


def test_large_file_block_is_stored_once_and_stubbed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            document = big_text(2048, "report")  # 2 MiB
            paste = user(f"Please review this:\n{file_block('report.txt', document)}\nThanks!")
            summarizer = ScriptedSummarizer("Kind: the quarterly report")
            transcript: list[dict[str, Any]] = [paste]
            for turn in range(20):
                result = await ingestor.ingest("t", transcript, summarizer=summarizer)
                forwarded = result.messages[0]["content"]
                assert forwarded.startswith("Please review this:\n[LCM File: file_")
                assert "| report.txt | text/plain | " in forwarded and forwarded.endswith("\nThanks!")
                assert document not in forwarded and len(forwarded) < 5000
                assert result.tokens_forwarded < 2000 < result.tokens_sent
                transcript = [*transcript, assistant(f"answer {turn}"), user(f"q {turn}")]
            assert await row_count(store, "files") == 1
            stored = list((tmp_path / "files").rglob("*"))
            assert len([p for p in stored if p.is_file()]) == 1
            assert summarizer.calls == 1  # the exploration summary is reused, not recomputed
            exported = await export_conversation(store, files, "t", result.conversation_id)
            assert exported[0] == paste  # byte for byte
            assert exported == transcript[:-2]

    run(scenario())


def test_large_tool_result_stored_once(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            output = big_text(1024, "log")  # 1 MiB
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_logs", "arguments": '{"path": "/var/log/x"}'},
            }
            t: list[dict[str, Any]] = [
                user("check logs"),
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": output},
            ]
            for i in range(20):
                result = await ingestor.ingest("t", t)
                stub = result.messages[2]["content"]
                assert stub.startswith("[LCM Tool Output: file_") and "tool=read_logs" in stub
                assert "/var/log/x" not in stub  # tool inputs are never echoed into the stub
                t = [*t, assistant(f"done {i}"), user(f"next {i}")]
            assert await row_count(store, "files") == 1
            exported = await export_conversation(store, files, "t", result.conversation_id)
            assert exported[2]["content"] == output

    run(scenario())


def test_medium_tool_result_is_stored_but_forwarded_raw(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _files):
            output = big_text(16, "row")  # ~3-4k tokens: above 2k, below 25k
            call = {"id": "c", "type": "function", "function": {"name": "query", "arguments": "{}"}}
            t = [
                user("q"),
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": output},
            ]
            result = await ingestor.ingest("t", t)
            assert result.messages is t  # zero-cost: forwarded unchanged until compaction is due
            assert await row_count(store, "files") == 1
            rows = await store.read.messages(result.conversation_id)
            assert rows[2].compact_json is not None and "[LCM Tool Output:" in rows[2].compact_json
            assert rows[2].forward_json is None

    run(scenario())


def test_base64_image_stored_once_forwarded_intact(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            png = os.urandom(50_000)
            url = "data:image/png;base64," + base64.b64encode(png).decode()
            pdf = base64.b64encode(os.urandom(30_000)).decode()
            message = {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
                    {
                        "type": "file",
                        "file": {"filename": "doc.pdf", "file_data": f"data:application/pdf;base64,{pdf}"},
                    },
                ],
            }
            t = [message]
            for i in range(5):
                result = await ingestor.ingest("t", t)
                assert result.messages is t
                t = [*t, assistant(f"a{i}"), user(f"q{i}")]
            rows = await store.read.messages(result.conversation_id)
            assert url not in rows[0].original_json and len(rows[0].original_json) < 2000
            assert await row_count(store, "files") == 2
            assert (await export_conversation(store, files, "t", result.conversation_id))[0] == message

    run(scenario())


def test_small_content_is_forwarded_unchanged(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _):
            t = [SYSTEM, user(file_block("a.py", "print('hi')\n" * 50)), assistant("ok"), user("and?")]
            result = await ingestor.ingest("t", t)
            assert result.messages is t
            assert await row_count(store, "files") == 0

    run(scenario())


def test_permissions(tmp_path: Path) -> None:
    async def scenario() -> None:
        data = tmp_path / "data"
        async with open_engine(data) as (ingestor, _store, _):
            await ingestor.ingest("t", [user(file_block("big.txt", big_text(200)))])
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert stat.S_IMODE((data / "lcm.sqlite3").stat().st_mode) == 0o600
        for path in (data / "files").rglob("*"):
            assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path

    run(scenario())


def test_same_message_helper() -> None:
    assert same_message({"role": "user", "content": "a", "name": None}, {"content": "a", "role": "user"})
    assert not same_message(user("a"), user("b"))


def test_file_block_scanner_is_linear_and_correct() -> None:
    from proxy.engine.intercept import find_file_blocks

    text = 'a <file name="x.txt">one</file> b <filex> <file\nmime="t">two</file> <file>'
    blocks = find_file_blocks(text)
    assert [text[b.inner_start : b.inner_end] for b in blocks] == ["one", "two"]
    assert [b.attributes.strip() for b in blocks] == ['name="x.txt"', 'mime="t"']
    hostile = "<file>" * 200_000 + "<file " + "a" * 100_000  # unclosed tags: must not go quadratic
    assert find_file_blocks(hostile) == []
    many = "<file>x</file>" * 100_000
    assert len(find_file_blocks(many)) == 100_000


def test_earlier_resend_with_other_instructions_keeps_stored_instructions(where: Location) -> None:
    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            full = [SYSTEM, user("u1"), assistant("a1"), user("u2")]
            first = await ingestor.ingest("t", full)
            side = await ingestor.ingest("t", [{"role": "system", "content": "Write a title."}, user("u1")])
            assert side.action == "earlier" and side.conversation_id == first.conversation_id
            assert await export_conversation(store, files, "t", first.conversation_id) == full

    run(scenario())


def test_a_conversation_that_never_settles_is_a_409_and_writes_nothing(where: Location) -> None:
    """If other requests keep moving the conversation for every attempt, the request fails cleanly with a
    retryable 409 (the SDKs resend it) instead of a 500, and nothing of it is stored."""

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _):
            await ingestor.ingest("t", [user("start")])
            attempts = 0

            async def always_moved(*args: Any) -> Any:
                nonlocal attempts
                attempts += 1
                raise NeedsPreparation([])

            ingestor._commit = always_moved  # type: ignore[method-assign]
            with pytest.raises(ConversationBusy) as info:
                await ingestor.ingest("t", [user("start"), assistant("a"), user("b")])
            reported = to_proxy_error(info.value)  # what the client gets
            assert (reported.status, reported.code, reported.retryable) == (409, "conversation_busy", True)
            assert attempts == 5
            assert await row_count(store, "messages") == 1

    run(scenario())


def test_nul_characters_are_stored_losslessly(where: Location) -> None:
    """JSON allows ``\\u0000`` in strings; PostgreSQL text does not: the transcript still comes back exactly,
    on both stores, and a large paste carrying one is stored and restored too."""

    async def scenario() -> None:
        async with open_engine(where, large=300) as (ingestor, store, files):
            paste = "".join(f"row {i}\x00value {i}\n" for i in range(400))
            transcript = [
                user("a\x00b"),
                assistant("nul \x00 inside"),
                user(f'<file name="x\x00y.txt">\n{paste}</file>'),
            ]
            result = await ingestor.ingest("t", transcript)
            assert result.messages[-1] != transcript[-1]  # the paste was stubbed
            assert await export_conversation(store, files, "t", result.conversation_id) == transcript
            again = await ingestor.ingest("t", transcript)
            assert (again.conversation_id, again.action) == (result.conversation_id, "same")

    run(scenario())
