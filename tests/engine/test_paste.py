"""A paste inside a user's own words (docs/architecture.md, "Interception"): only the paste becomes a stub.

The issue: a 1 MB log pasted with a question after it, in one user message, became one stub; the question ended
up inside the stub's closing excerpt (or, with a summary model, nowhere) and the model answered "1". The words
before and after a pasted block stay verbatim in the forwarded message, in place, outside the stub; the stored
message still exports to exactly what was sent; search, auto-recall and the ledger read the question.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects import CHAT
from proxy.engine import auto_recall, paste
from proxy.engine.ingest import export_conversation
from proxy.engine.intercept import Interceptor, Payload, outside_stubs, restore
from proxy.engine.recall.tools import RecallTools
from tests.support.cli import main
from tests.support.engine import ScriptedSummarizer, assistant, open_engine, read_ledger, row_count, run, user
from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy

LEAD = "Here's the log from last night:"
QUESTION = "Why does the worker restart every 5 minutes?"
STUB_HEAD = "[LCM File: file_"
HINT = "(Stored out of line by lcm-proxy."


def worker_log(size: int = 1 << 20) -> str:
    """About ``size`` bytes of a worker's log (no final line break), a supervisor restart every 300 lines."""
    lines: list[str] = []
    total = 0
    i = 0
    while total < size:
        h, m, s = (i // 3600) % 24, (i // 60) % 60, i % 60
        if i % 300 == 299:
            line = f"2024-05-01T{h:02d}:{m:02d}:{s:02d}.000Z WARN  supervisor: worker-3 (pid={4000 + i // 300}) missed health check, restarting"
        else:
            line = f"2024-05-01T{h:02d}:{m:02d}:{s:02d}.{i % 1000:03d}Z INFO  worker-3 pid={4000 + i // 300} heartbeat ok queue_depth={i % 17} latency_ms={(i * 37) % 250}"
        lines.append(line)
        total += len(line) + 1
        i += 1
    return "\n".join(lines)


LOG = worker_log()


def split_stub(content: str) -> tuple[str, str, str]:
    """(before, the stub, after) of a forwarded text holding one stub."""
    head = content.index(STUB_HEAD)
    end = content.index(".)", content.index(HINT, head)) + 2
    assert STUB_HEAD not in content[end:] and STUB_HEAD not in content[:head]
    return content[:head], content[head:end], content[end:]


def stub_id(stub: str) -> str:
    return stub[len("[LCM File: ") :].split(" ", 1)[0]


async def ingest_one(ingestor: Any, message: dict[str, Any], **kw: Any) -> tuple[Any, str]:
    result = await ingestor.ingest("t", [message], **kw)
    assert result.conversation_id is not None
    return result, result.conversation_id


def test_a_log_between_a_sentence_and_a_question_keeps_both_outside_the_stub(tmp_path: Path) -> None:
    message = user(f"{LEAD}\n{LOG}\n\n{QUESTION}")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            result, conversation = await ingest_one(ingestor, message)
            forwarded = result.messages[0]["content"]
            before, stub, after = split_stub(forwarded)
            assert before == f"{LEAD}\n"
            assert after == f"\n\n{QUESTION}"
            assert "restart every" not in stub and LEAD not in stub  # not in the excerpts: they quote the log
            assert stub.startswith(f"{STUB_HEAD}") and "| pasted-text.txt | text/plain | " in stub
            assert f"| {len(LOG.encode())} bytes]" in stub  # the stored payload is the log, exactly
            assert result.tokens_forwarded < 1000 < result.tokens_sent
            # Cache-stable: the same message again (a retry, the next turn) is forwarded byte for byte.
            transcript = [message, assistant("It is the health check."), user("Thanks")]
            again = await ingestor.ingest("t", transcript)
            assert again.conversation_id == conversation and again.messages[0]["content"] == forwarded
            assert await row_count(store, "files") == 1
            # Lossless: export gives back what the client sent, byte for byte.
            exported = await export_conversation(store, files, "t", conversation)
            assert exported == transcript
            assert exported[0]["content"] == message["content"]
            # What search reads of the message: the words around the stub.
            (row, *_) = await store.read.messages(conversation, 0, 1)
            assert row.text.startswith(f"{LEAD}\n{STUB_HEAD}") and row.text.endswith(f"\n\n{QUESTION}")

    run(scenario())


def test_a_fenced_paste_keeps_its_fences_in_the_original_and_stores_what_is_inside(tmp_path: Path) -> None:
    fenced = user(f"{LEAD}\n\n```log\n{LOG}\n```\n\n{QUESTION}")
    bare = user(f"Same log, no fence:\n{LOG}\nAny idea?")
    # A short block the user wrote after the paste is theirs, as is a tilde fence around the paste.
    snippet = "I restart it with:\n```sh\nsystemctl restart worker\n```\nIs that why?"
    tilde = user(f"~~~\n{LOG}\n~~~\n{snippet}")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            result, conversation = await ingest_one(ingestor, fenced)
            before, stub, after = split_stub(result.messages[0]["content"])
            assert (before, after) == (f"{LEAD}\n\n", f"\n\n{QUESTION}")
            assert "```" not in result.messages[0]["content"]  # the stub stands for the whole block
            assert f"| {len(LOG.encode())} bytes]" in stub
            assert await export_conversation(store, files, "t", conversation) == [fenced]
            # Inside the fence is the same log as pasted bare: one stored file.
            bare_result, _ = await ingest_one(ingestor, bare)
            bare_before, bare_stub, bare_after = split_stub(bare_result.messages[0]["content"])
            assert (bare_before, bare_after) == ("Same log, no fence:\n", "\nAny idea?")
            assert stub_id(bare_stub) == stub_id(stub)
            assert await row_count(store, "files") == 1
            tilde_result, tilde_conversation = await ingest_one(ingestor, tilde)
            tilde_before, tilde_stub, tilde_after = split_stub(tilde_result.messages[0]["content"])
            assert (tilde_before, tilde_after) == ("", f"\n{snippet}")
            assert stub_id(tilde_stub) == stub_id(stub)
            assert await export_conversation(store, files, "t", tilde_conversation) == [tilde]

    run(scenario())


def test_an_unfenced_paste_is_found_by_its_lines(tmp_path: Path) -> None:
    syslog = "\n".join(
        f"May  1 03:{i // 60 % 60:02d}:{i % 60:02d} host systemd[1]: worker.service: Scheduled restart job, restart counter is at {i}."
        for i in range(12000)
    )
    code = "\n\n".join(f"def handler_{i}(event):\n    return process(event, retries={i % 5})" for i in range(15000))
    cases = [
        (f"Hi!\n\nHere is syslog:\n{syslog}\n{QUESTION}", "Hi!\n\nHere is syslog:\n", f"\n{QUESTION}"),
        (f"Our handlers:\n\n{code}\n\nWhich one leaks?\nIt started after the deploy.", "Our handlers:\n\n", "\n\nWhich one leaks?\nIt started after the deploy."),
    ]  # fmt: skip

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            for text, lead, trail in cases:
                result, conversation = await ingest_one(ingestor, user(text))
                before, stub, after = split_stub(result.messages[0]["content"])
                assert (before, after) == (lead, trail)
                assert trail.strip() not in stub
                assert await export_conversation(store, files, "t", conversation) == [user(text)]

    run(scenario())


def test_a_question_only_after_the_paste(tmp_path: Path) -> None:
    message = user(f"{LOG}\n\n{QUESTION}\n")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            result, conversation = await ingest_one(ingestor, message)
            before, stub, after = split_stub(result.messages[0]["content"])
            assert (before, after) == ("", f"\n\n{QUESTION}\n")
            assert "restart every" not in stub and f"| {len(LOG.encode())} bytes]" in stub
            assert await export_conversation(store, files, "t", conversation) == [message]

    run(scenario())


def test_words_only_before_the_paste(tmp_path: Path) -> None:
    message = user(f"{LEAD}\n{LOG}")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            result, conversation = await ingest_one(ingestor, message)
            before, stub, after = split_stub(result.messages[0]["content"])
            assert (before, after) == (f"{LEAD}\n", "")
            assert LEAD not in stub and f"| {len(LOG.encode())} bytes]" in stub
            assert await export_conversation(store, files, "t", conversation) == [message]

    run(scenario())


def test_a_message_that_is_all_paste_is_one_stub_of_the_same_file(tmp_path: Path) -> None:
    """Unchanged: a message with no words around the paste is stubbed whole. The same paste sent with a
    question is the same stored file (before, it was another file: the paste with the question in it)."""
    fenced = f"```\n{LOG}\n```"

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            result, conversation = await ingest_one(ingestor, user(LOG))
            forwarded = result.messages[0]["content"]
            assert split_stub(forwarded)[::2] == ("", "")
            assert (
                forwarded.startswith(f"{STUB_HEAD}")
                and f"| pasted-text.txt | text/plain | {len(LOG.encode())} bytes]" in forwarded
            )
            assert await export_conversation(store, files, "t", conversation) == [user(LOG)]
            fenced_result, fenced_conversation = await ingest_one(ingestor, user(fenced))
            fenced_stub = fenced_result.messages[0]["content"]
            assert split_stub(fenced_stub)[::2] == ("", "")
            assert f"| {len(fenced.encode())} bytes]" in fenced_stub  # all of it, fences too, as before
            assert await export_conversation(store, files, "t", fenced_conversation) == [user(fenced)]
            asked, _ = await ingest_one(ingestor, user(f"{LEAD}\n{LOG}\n\n{QUESTION}"))
            assert stub_id(split_stub(asked.messages[0]["content"])[1]) == stub_id(forwarded)
            assert await row_count(store, "files") == 2  # the log, and the fenced whole

    run(scenario())


def test_a_text_part_keeps_its_words_and_the_other_parts_stay(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/graph.png"}}
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": f"{LEAD}\n\n```\n{LOG}\n```\n{QUESTION}"},
            image,
            {"type": "text", "text": "Thanks!"},
        ],
    }

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            result, conversation = await ingest_one(ingestor, message)
            parts = result.messages[0]["content"]
            before, stub, after = split_stub(parts[0]["text"])
            assert (before, after) == (f"{LEAD}\n\n", f"\n{QUESTION}")
            assert f"| {len(LOG.encode())} bytes]" in stub and "restart every" not in stub
            assert parts[1:] == message["content"][1:]
            assert await export_conversation(store, files, "t", conversation) == [message]

    run(scenario())


def test_search_finds_the_question_and_the_file_holds_only_the_log(tmp_path: Path) -> None:
    """With a summary model the stub holds no excerpt at all: the question asked after the paste was nowhere
    the model or a search could read it."""
    message = user(f"{LEAD}\n{LOG}\n\n{QUESTION}")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            summarizer = ScriptedSummarizer("A worker's log: heartbeats and supervisor warnings.")
            result, conversation = await ingest_one(ingestor, message, summarizer=summarizer)
            before, stub, after = split_stub(result.messages[0]["content"])
            assert (before, after) == (f"{LEAD}\n", f"\n\n{QUESTION}") and "heartbeats" in stub
            tools = RecallTools(store, files)
            scope = await tools.scope("t", conversation)
            found = await tools.run(scope, "lcm_grep", orjson.dumps({"pattern": "restart every 5 minutes"}).decode())
            assert "msg_" in found and "restart every 5 minutes" in found, found
            full_text = await tools.run(
                scope, "lcm_grep", orjson.dumps({"pattern": "worker restart", "mode": "full_text"}).decode()
            )
            assert "msg_" in full_text, full_text
            described = await tools.run(
                scope, "lcm_describe", orjson.dumps({"id": stub_id(stub), "start_line": 11000}).decode()
            )
            assert "heartbeat ok" in described and "restart every" not in described and LEAD not in described

    run(scenario())


def test_the_ledger_reads_an_instruction_written_after_the_paste(tmp_path: Path) -> None:
    message = user(f"{LEAD}\n{LOG}\n\nFrom now on, answer in French.")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, files):
            _, conversation = await ingest_one(ingestor, message)
            await read_ledger(store, files, conversation)  # read after the response
            items = await store.read.ledger(conversation)
            assert [(i.kind, i.value, i.text) for i in items] == [
                ("preference", "French", "From now on, answer in French.")
            ]

    run(scenario())


def test_auto_recall_searches_with_the_question_not_the_stub(tmp_path: Path) -> None:
    sister = "My sister Ingrid lives in Bergen."
    earlier = [user(sister), assistant("Noted.")]
    for i in range(6):
        earlier += [user(f"What goes with risotto, take {i}?"), assistant("A dry white wine.")]
    newest = user(f"{LEAD}\n{LOG}\n\nUnrelated, but which city does my sister live in again?")

    async def scenario() -> None:
        async with open_engine(tmp_path) as (ingestor, store, _):
            result = await ingestor.ingest("t", [*earlier, newest])
            assert result.conversation_id is not None
            last = len(earlier)
            raw = [result.messages[last]]
            out, added, ids, _ = await auto_recall.place(
                store, result.conversation_id, last, raw, 400, CHAT, lambda s: s
            )
            assert added > 0 and len(ids) >= 1
            content = out[0]["content"]
            assert sister in content.split("</recalled_history>")[0]
            assert content.endswith("which city does my sister live in again?")  # the question stays last

    run(scenario())


# --- the boundary finder itself -------------------------------------------------------------------------------


def test_outside_stubs_is_the_words_around_them() -> None:
    stub = '[LCM File: file_0123456789abcdef | a.txt | text/plain | 3 bytes]\nExploration Summary:\nx\n(Stored out of line by lcm-proxy. Call lcm_describe with id "file_0123456789abcdef" to read the full content.)'
    assert outside_stubs(f"Before:\n{stub}\nAfter?") == "Before:\n\nAfter?"
    assert outside_stubs(stub) == ""
    assert outside_stubs("[LCM nothing] plain") == "[LCM nothing] plain"
    hostile = "[LCM File: file_" * 100_000 + '(Stored out of line by lcm-proxy. Call lcm_describe with id "file_' * 1000
    started = time.monotonic()
    assert outside_stubs(hostile) == hostile  # nothing closes: nothing removed, in linear time
    assert time.monotonic() - started < 2


def test_the_finder_is_bounded_on_hostile_text() -> None:
    hostile = [
        "```\n" * 300_000,
        "~~~~~~~~~~\n" * 100_000,
        "\n" * 1_000_000,
        "`" * 1_000_000,
        "x" * 1_000_000,
        "```py\nx\n" * 100_000,
        f"Question?\n{'a' * 1_000_000}\n{'b' * 1_000_000}\nWhy?",
    ]
    for text in hostile:
        started = time.monotonic()
        found = paste.find(text, paste.MAX_WORDS_TOKENS)
        assert time.monotonic() - started < 1
        if found is not None:
            assert 0 <= found.start <= found.inner_start < found.inner_end <= found.end <= len(text)
            window = paste.MAX_WORDS_TOKENS * paste.WINDOW_CHARS_PER_TOKEN
            assert found.start <= window and len(text) - found.end <= window
    assert paste.find(LOG, 512) is None  # all paste
    assert paste.find(f"{LEAD}\n{LOG}", 0) is None  # no budget for words (a tiny threshold)


LINES = [
    "Why?", "", "```", "```py", "~~~", "    indented code", "2024-05-01 12:00:00 INFO x", "Some prose here.", "Intro:",
    "[x] y", "a" * 300, "Jan 12 03:14:07 host x", "| a | b |", "12:30 is when", "日本語のテキスト。", "\r",
]  # fmt: skip


PROSE = {"Why?", "", "Some prose here.", "Intro:", "12:30 is when", "日本語のテキスト。"}


@settings(max_examples=150, deadline=None)
@given(
    head=st.lists(st.sampled_from(LINES), max_size=30),
    tail=st.lists(st.sampled_from(LINES), max_size=30),
    middle=st.integers(min_value=2000, max_value=40_000),
    fenced=st.booleans(),
    parts=st.booleans(),
)
def test_any_split_restores_exactly_and_keeps_the_words_small(
    head: list[str], tail: list[str], middle: int, fenced: bool, parts: bool
) -> None:
    body = LOG[: LOG.index("\n", middle)]  # whole lines of the log
    text = "\n".join([*head, *(["```"] if fenced else []), body, *(["```"] if fenced else []), *tail])
    message: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": text}] if parts else text}
    stored: dict[str, bytes] = {}

    async def explore(payload: Payload) -> str:
        stored[payload.file_id] = payload.data
        return "Kind: text"

    async def scenario() -> None:
        interception = await Interceptor("t", 400, 100, explore, CHAT).intercept(message, {})
        assert interception.changed
        assert restore(interception.original, interception.paths, stored.__getitem__) == message
        # Deterministic: the same text splits the same way.
        again = await Interceptor("t", 400, 100, explore, CHAT).intercept(message, {})
        assert again.forward_patches == interception.forward_patches
        forwarded = interception.forward_patches[0][1]
        before, _, after = split_stub(forwarded)
        budget = paste.words_budget(400)
        window = budget * paste.WINDOW_CHARS_PER_TOKEN
        assert len(before) <= window and len(after) <= window
        assert text.startswith(before) and text.endswith(after)
        # A few lines of prose around the log are the words, exactly (blank lines too, once there are words on
        # either side); with no words at all, the whole text is the paste.
        if not any(line.strip() for line in [*head, *tail]):
            assert before == after == ""
            return
        words = bool(before.strip() or after.strip())
        if len(head) <= 10 and set(head) <= PROSE and (words or any(line.strip() for line in head)):
            assert before == "".join(f"{line}\n" for line in head)
        if len(tail) <= 10 and set(tail) <= PROSE and (words or any(line.strip() for line in tail)):
            assert after == "".join(f"\n{line}" for line in tail)

    run(scenario())


def test_through_the_http_endpoint_the_upstream_gets_the_words_and_export_the_original(
    proxy: RunningProxy, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    message = {"role": "user", "content": f"{LEAD}\n{LOG}\n\n{QUESTION}"}
    body = {"model": "test-model", "messages": [message]}
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    conversation = response.headers["x-lcm-conversation-id"]
    received = fake_upstream.last.body["messages"]
    assert len(received) == 1 and received[0]["role"] == "user"
    before, stub, after = split_stub(received[0]["content"])
    assert before == f"{LEAD}\n" and after == f"\n\n{QUESTION}"
    assert "restart every" not in stub and f"| {len(LOG.encode())} bytes]" in stub
    assert received[0]["content"].endswith(QUESTION)  # the question is the last thing the model reads

    config = tmp_path / "cli.yaml"
    config.write_text(
        "model_list: [{model_name: m, litellm_params: {model: openai/m}}]\n"
        f"general_settings: {{data_dir: '{proxy.config.general_settings.data_dir}'}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    exported = main("export", conversation, "--config", str(config), env=env)
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)[0] == message
