"""Transcripts of Anthropic Messages and OpenAI Responses through the engine, before their doors exist:
stored as sent (thinking signatures and encrypted reasoning byte-identical on export), identified apart
from chat, compacted and assembled with cuts only between pairs, summaries rendered in their own format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.dialects import CHAT, MESSAGES, RESPONSES, Dialect, cut_allowed
from proxy.engine.canonical import chain_hashes
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.ingest import export_conversation
from proxy.engine.recall import RecallTools
from proxy.store.location import Location
from tests.support import wire_formats as t
from tests.support.compaction import SETTINGS as COMPACTION_SETTINGS
from tests.support.engine import run

SETTINGS = COMPACTION_SETTINGS.model_copy(update={"auto_recall": "off"})
SMALL = Budget(window=2500, output_reserve=300, tools=0)
FILLER = "the build log shows several warnings about deprecated options in the config. "


class Summarizer:
    model = "summary-model"

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        assert "PRIVATE" not in user  # thinking and reasoning never reach the summarizer
        return "Short summary of the work."

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A log."


def messages_rounds(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        a, b = f"toolu_{i}a", f"toolu_{i}b"
        out += [
            {"role": "user", "content": [{"type": "text", "text": f"Step {i}: check the build. " + FILLER * 3}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"PRIVATE {i}", "signature": t.SIGNATURE + str(i)},
                    {"type": "tool_use", "id": a, "name": "Bash", "input": {"cmd": f"make {i}"}},
                    {"type": "tool_use", "id": b, "name": "Bash", "input": {"cmd": f"make test {i}"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": a, "content": f"built {i} " + FILLER * 2},
                    {"type": "tool_result", "tool_use_id": b, "content": f"tested {i} " + FILLER * 2},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": f"Step {i} is green. " + FILLER}]},
        ]
    return out


def responses_rounds(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [t.RESPONSES[0]]
    for i in range(n):
        out += [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"Step {i}. " + FILLER * 3}],
            },
            {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": f"PRIVATE{i}" + "e" * 400},
            {"type": "function_call", "call_id": f"c{i}a", "name": "shell", "arguments": f'{{"cmd":"make {i}"}}'},
            {"type": "function_call", "call_id": f"c{i}b", "name": "shell", "arguments": f'{{"cmd":"test {i}"}}'},
            {"type": "function_call_output", "call_id": f"c{i}a", "output": f"built {i} " + FILLER * 2},
            {"type": "function_call_output", "call_id": f"c{i}b", "output": f"tested {i} " + FILLER * 2},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"Green {i}. {FILLER}"}],
            },
        ]
    return out


def assert_pairs_intact(dialect: Dialect, forwarded: list[dict[str, Any]], source: list[dict[str, Any]]) -> None:
    """Every result forwarded has its call forwarded before it, and every message that continues another in
    the transcript is forwarded right after that one."""
    called: set[str] = set()
    for message in forwarded:
        assert set(dialect.result_ids(message)) <= called, message
        called |= {c.id for c in dialect.tool_calls(message)}
    roles = [dialect.role(m) for m in source]
    for position, message in enumerate(forwarded):
        if message in source:
            i = source.index(message)
            if not cut_allowed(dialect, roles, i):
                assert position > 0 and forwarded[position - 1] == source[i - 1]


async def open_engine(tmp_path: Path) -> tuple[ContextEngine, Any, Any]:
    store, files = Location(tmp_path).stores()
    await store.open()
    return ContextEngine(store, files, SETTINGS), store, files


def compacts_in_its_own_format(tmp_path: Path, dialect: Dialect, transcript: list[dict[str, Any]]) -> int:
    """Checks a compacted transcript of ``dialect`` (see the assertions); returns how many summaries it forwarded."""

    async def scenario() -> int:
        engine, store, files = await open_engine(tmp_path)
        try:
            prepared = await engine.prepare("t", transcript, SMALL, Summarizer(), dialect=dialect)
            cid = prepared.conversation_id or ""
            assert (await store.read.conversation("t", cid)).dialect == dialect.name
            assert prepared.sent.summaries, "the small budget must have made the engine summarise"
            assert await export_conversation(store, files, "t", cid) == transcript  # signatures, ciphertexts too
            # Leaf summaries end only where a cut may fall.
            roles = await store.read.roles(cid, 0, len(transcript))  # seqs count from after the instructions
            for summary in await store.read.context_summaries(cid):
                assert cut_allowed(dialect, roles, summary.end_seq), (summary.end_seq, roles)
            instructions = len(transcript) - len(roles)
            forwarded = prepared.messages[instructions:]
            assert prepared.messages[:instructions] == transcript[:instructions]
            head = forwarded[0]
            assert dialect.user_turn(dialect.role(head))
            assert dialect.text(head).startswith('<summary id="sum_')
            assert_pairs_intact(dialect, forwarded, transcript[instructions:])
            assert forwarded[1:] == transcript[len(transcript) - len(forwarded) + 1 :]  # the raw tail as sent
            await engine.close()
            return len(prepared.sent.summaries)
        finally:
            await store.close()

    return int(run(scenario()))


def test_a_messages_transcript_compacts_in_its_own_format(tmp_path: Path) -> None:
    assert compacts_in_its_own_format(tmp_path, MESSAGES, messages_rounds(25)) >= 1


def test_a_responses_transcript_compacts_in_its_own_format(tmp_path: Path) -> None:
    assert compacts_in_its_own_format(tmp_path, RESPONSES, responses_rounds(20)) >= 1


def test_the_summary_block_has_the_shape_of_each_format(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_engine(tmp_path)
        try:
            m = await engine.prepare("t", messages_rounds(25), SMALL, Summarizer(), dialect=MESSAGES)
            block, words = m.messages[0]["content"][:2]
            assert m.messages[0]["role"] == "user" and block["type"] == "text" and set(block) == {"type", "text"}
            assert block["text"].startswith('<summary id="sum_') and words["text"].startswith("Step ")
            r = await engine.prepare("t", responses_rounds(20), SMALL, Summarizer(), dialect=RESPONSES)
            item = r.messages[1]
            assert (item.get("type", "message"), item["role"]) == ("message", "user")
            assert item["content"][0]["type"] == "input_text" and item["content"][0]["text"].startswith("<summary")
            await engine.close()
        finally:
            await store.close()

    run(scenario())


def test_a_dialect_never_continues_another_dialects_conversation(tmp_path: Path) -> None:
    plain = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert chain_hashes("t", plain) == chain_hashes("t", plain, CHAT.name)  # chat's chains as they always were
    assert chain_hashes("t", plain, MESSAGES.name)[0] != chain_hashes("t", plain)[0]

    async def scenario() -> None:
        engine, store, _ = await open_engine(tmp_path)
        try:
            big = Budget(window=100_000, output_reserve=1000, tools=0)
            as_chat = await engine.prepare("t", plain, big, None)
            as_messages = await engine.prepare("t", plain, big, None, dialect=MESSAGES)
            assert as_chat.conversation_id != as_messages.conversation_id
            stored = await store.read.conversation("t", as_chat.conversation_id or "")
            assert stored.dialect == "chat" and stored.message_count == 2
            again = await engine.prepare(
                "t", [*plain, {"role": "user", "content": "more"}], big, None, dialect=MESSAGES
            )
            assert again.conversation_id == as_messages.conversation_id
            await engine.close()
        finally:
            await store.close()

    run(scenario())


def test_large_tool_output_of_each_format_is_stored_out_of_line(tmp_path: Path) -> None:
    huge = "line of output that goes on. " * 900

    async def scenario() -> None:
        engine, store, files = await open_engine(tmp_path)
        try:
            big = Budget(window=100_000, output_reserve=1000, tools=0)
            m = messages_rounds(1)
            m[2]["content"][0]["content"] = huge
            r = responses_rounds(1)
            r[5]["output"] = huge
            cases = ((MESSAGES, m, (2, "content", 0, "content"), "Bash"), (RESPONSES, r, (5, "output"), "shell"))
            for dialect, transcript, where, tool in cases:
                prepared = await engine.prepare("t", transcript, big, None, dialect=dialect)
                value: Any = prepared.messages
                for key in where:
                    value = value[key]
                assert value.startswith("[LCM Tool Output: file_") and f"tool={tool} |" in value
                cid = prepared.conversation_id or ""
                assert await export_conversation(store, files, "t", cid) == transcript
            await engine.close()
        finally:
            await store.close()

    run(scenario())


def test_recall_reads_a_stored_message_in_its_conversations_format(tmp_path: Path) -> None:
    """``lcm_describe`` of a stored assistant message shows its tool calls whatever the format: a Messages
    ``tool_use`` block and a Responses ``function_call`` item read as calls, not as empty chat messages."""

    async def scenario() -> None:
        engine, store, files = await open_engine(tmp_path)
        recall = RecallTools(store, files)
        try:
            big = Budget(window=100_000, output_reserve=1000, tools=0)
            cases = (
                (MESSAGES, messages_rounds(1), 1, "-> calls Bash("),
                (RESPONSES, responses_rounds(1), 3, "-> calls shell("),
            )
            for dialect, transcript, index, call in cases:
                prepared = await engine.prepare("t", transcript, big, None, dialect=dialect)
                cid = prepared.conversation_id or ""
                stored = await store.read.messages(cid)
                seq = index - (len(transcript) - len(stored))  # seqs count from after the instructions
                scope = await recall.scope("t", cid)
                described = await recall.run(scope, "lcm_describe", f'{{"id": "msg_{stored[seq].id}"}}')
                assert call in described, described
                assert "PRIVATE" not in described  # thinking and reasoning stay out of recall, as of summaries
            await engine.close()
        finally:
            await store.close()

    run(scenario())
