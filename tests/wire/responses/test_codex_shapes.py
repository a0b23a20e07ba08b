"""What the Responses door reads of Codex's requests: identity, its two compactions, where a checkpoint stands,
and which leading items are instructions (its AGENTS.md and environment context are, the user's words not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.dialects.responses import RESPONSES
from proxy.errors import InvalidRequestError
from proxy.wire.responses import codex
from proxy.wire.responses.issued import CHECKPOINT


def message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


BASE = message("developer", "You are Codex, a coding agent.")
SKILLS = message("developer", "## Skills\n...")
AGENTS = message("user", "# AGENTS.md instructions for /work\n\n<INSTRUCTIONS>\nAlways use tabs.\n</INSTRUCTIONS>")
ENVIRONMENT = message("user", "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>")
HANDLE = "lcm_ckpt_" + "A" * 43


def test_codex_project_rules_are_instructions_but_the_users_words_are_not() -> None:
    items = [BASE, SKILLS, AGENTS, ENVIRONMENT, message("user", "fix the build"), AGENTS]
    assert RESPONSES.instruction_count(items) == 4
    # The same text later in the conversation is not an instruction: only the leading run is.
    assert RESPONSES.instruction_count([message("user", "hello"), AGENTS]) == 0


def test_the_conversation_key_prefers_the_clients_own_then_codexs_session_then_the_cache_key() -> None:
    body = {"prompt_cache_key": "pck-1"}
    assert codex.conversation_key({"x-lcm-conversation-id": "mine", "session-id": "s"}, body) == "mine"
    assert codex.conversation_key({"session-id": "s-1"}, body) == "codex:s-1"
    assert codex.conversation_key({}, body) == "responses:pck-1"
    assert codex.conversation_key({}, {}) is None
    with pytest.raises(InvalidRequestError) as refused:
        codex.conversation_key({"session-id": "x" * 201}, {})
    assert refused.value.param == "session-id"


def test_local_compaction_is_read_from_the_metadata_or_the_prompt() -> None:
    prompt = message("user", "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary")
    assert codex.is_local_compaction({}, [BASE, message("user", "hi"), prompt])
    assert codex.is_local_compaction({"x-codex-turn-metadata": '{"request_kind": "compaction"}'}, [BASE])
    assert not codex.is_local_compaction({"x-codex-turn-metadata": "{not json"}, [BASE, message("user", "hi")])
    # Only the last user message counts: the prompt quoted earlier is not a compaction request.
    assert not codex.is_local_compaction({}, [prompt, message("assistant", "ok"), message("user", "go on")])


def test_a_trigger_is_the_last_item_only() -> None:
    assert codex.is_trigger([message("user", "hi"), {"type": "compaction_trigger"}])
    assert not codex.is_trigger([{"type": "compaction_trigger"}, message("user", "hi")])
    assert not codex.is_trigger([])


def test_the_newest_checkpoint_after_the_instructions_is_found() -> None:
    summary = message("user", codex.summary_text("what happened", HANDLE))
    older = message("user", codex.summary_text("before", "lcm_ckpt_" + "B" * 43))
    items = [BASE, AGENTS, older, message("user", "kept"), summary, message("user", "next")]
    found = first(items)
    assert found == codex.Checkpoint(4, HANDLE, False)
    item = {"type": "compaction", "encrypted_content": "anything"}
    assert first([BASE, message("user", "kept"), item, message("user", "n")]) == codex.Checkpoint(2, "anything", True)
    assert first([BASE, message("user", "no marker here")]) is None


def test_the_marker_written_into_a_summary_is_what_the_door_looks_for() -> None:
    assert CHECKPOINT.findall(codex.summary_text("digest", HANDLE)) == [HANDLE]
    # Only a message that ends with the marker is a summary: one that quotes it (a pasted log) is not.
    quoted = message("user", f"why does my log say {codex.summary_text('x', HANDLE)} here?")
    assert first([BASE, quoted]) is None
    candidates = list(codex.checkpoints([BASE, message("user", codex.summary_text("d", HANDLE)), quoted]))
    assert [c.at for c in candidates] == [1]


def first(items: list[dict[str, Any]]) -> codex.Checkpoint | None:
    return next(codex.checkpoints(items), None)


FIXTURES = Path(__file__).parents[2] / "support" / "fixtures" / "codex"


def recorded(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{name}.json").read_text())["body"]["input"]  # type: ignore[no-any-return]


def words(items: list[dict[str, Any]]) -> list[str]:
    return [RESPONSES.text(i)[:40] if i.get("type") == "message" else str(i.get("type")) for i in items]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("c2_local_compaction", "c3_after_local_compaction"),
        ("c4_midturn_local_compaction", "c5_after_midturn_local_compaction"),
        ("d2_remote_compaction", "d3_after_remote_compaction"),
        ("d4_midturn_remote_compaction", "d5_after_midturn_remote_compaction"),
    ],
)
def test_codexs_history_after_its_compaction_is_rebuilt_to_the_history_before_it(before: str, after: str) -> None:
    """Recorded with Codex 0.169: after a compaction, its base prompt, the user messages it kept, its other
    instructions re-inserted before the last of them, the summary (or compaction item), the new prompt. Put back
    together it is the transcript the compaction was asked on, continued: instructions first, in their order."""
    asked = recorded(before)[:-1]  # the compaction prompt or trigger is not part of the conversation
    start = RESPONSES.instruction_count(asked)
    assert start == 3  # base prompt, skills and permissions, AGENTS.md with the environment
    after_items = recorded(after)
    if after.startswith("c"):  # the local summary: the proxy's marker where the fake's summary was
        summary = next(i for i in after_items if RESPONSES.text(i).startswith("Another language model"))
        summary["content"][0]["text"] += codex.summary_text("digest", HANDLE)
    found = first(after_items)
    assert found is not None and found.item == after.startswith("d")
    rebuilt = codex.rebuilt(after_items, found, asked[start:])
    newest = after_items[found.at + 1 :]
    assert words(rebuilt) == words(asked) + words(newest)
    assert RESPONSES.instruction_count(rebuilt) == 3
