"""The real Codex CLI (tests/support/codex.py) against the recording fake: the request shapes the proxy relies on
(tests/support/fixtures/codex/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.codex import (
    LOCAL_COMPACTION_PROMPT,
    SUMMARY,
    CodexClient,
    FakeResponses,
    is_local_compaction,
    last_user_text,
    message_text,
    require_codex,
)
from tests.support.servers import serve_in_thread

RULES = "# Project rules\n\nAlways answer in French.\nRULE-MARKER-7731\n"
SUMMARY_PREFIX = "Another language model started to solve this problem and produced a summary of its thinking process."


def _kinds(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, role, first 40 characters) of each input item."""
    return [(i.get("type", ""), i.get("role", ""), message_text(i)[:40]) for i in body["input"]]


def test_a_turn_starts_with_two_developer_items_then_agents_md_then_the_prompt(tmp_path: Path) -> None:
    fake = FakeResponses(reply="PONG from the fake")
    with serve_in_thread(fake.app) as url:
        client = CodexClient(require_codex(), tmp_path, f"{url}/v1", agents_md=RULES).setup()
        done = client.exec("say pong")
    assert done.returncode == 0, done.stderr
    assert "PONG from the fake" in done.stdout
    assert [(s.method, s.path, s.websocket) for s in fake.seen] == [("POST", "/v1/responses", False)]
    seen = fake.turns[0]
    body = seen.body
    session = seen.headers["session-id"]
    assert body["prompt_cache_key"] == session
    metadata = json.loads(seen.headers["x-codex-turn-metadata"])
    assert metadata["session_id"] == session and metadata["request_kind"] == "turn"
    assert seen.headers["x-codex-window-id"] == f"{session}:0"
    assert body["stream"] is True and body["store"] is False
    assert "instructions" not in body and "previous_response_id" not in body
    items = body["input"]
    assert [(i["type"], i["role"]) for i in items] == [("message", "developer")] * 2 + [("message", "user")] * 2
    assert message_text(items[0]).startswith("You are Codex")
    agents = items[2]["content"]
    assert agents[0]["text"].startswith(f"# AGENTS.md instructions for {client.cwd}\n\n<INSTRUCTIONS>\n")
    assert "RULE-MARKER-7731" in agents[0]["text"]
    assert agents[1]["text"].startswith("<environment_context>")
    assert message_text(items[3]) == "say pong"
    assert all(i["id"].startswith("msg_") for i in items)


def test_after_a_local_compaction_the_initial_context_sits_before_the_last_user_message(tmp_path: Path) -> None:
    def usage(body: dict[str, Any]) -> int:
        return 30_000 if "BIG" in last_user_text(body) else 1_000

    fake = FakeResponses(usage=usage)
    with serve_in_thread(fake.app) as url:
        client = CodexClient(
            require_codex(), tmp_path, f"{url}/v1", context_window=100_000, auto_compact_limit=20_000, agents_md=RULES
        ).setup()
        for prompt in ("USER-1 first", "USER-2 BIG second", "USER-3 third"):
            done = client.exec(prompt) if prompt.startswith("USER-1") else client.resume(prompt)
            assert done.returncode == 0, done.stderr
    turns = fake.turns
    assert len(turns) == 4, [_kinds(t.body) for t in turns]  # USER-1, USER-2, the compaction (pre-turn), USER-3
    compaction, after = turns[2], turns[3]
    assert is_local_compaction(compaction.body)
    assert json.loads(compaction.headers["x-codex-turn-metadata"])["request_kind"] == "compaction"
    assert compaction.body["tools"] == [] and compaction.body["parallel_tool_calls"] is False
    assert message_text(compaction.body["input"][-1]).startswith(LOCAL_COMPACTION_PROMPT)
    session = after.headers["session-id"]
    assert after.headers["x-codex-window-id"] == f"{session}:1"
    shape = [(kind, role, text[:12]) for kind, role, text in _kinds(after.body)]
    assert shape == [
        ("message", "developer", "You are Code"),
        ("message", "user", "USER-1 first"),
        ("message", "developer", "<skills_inst"),
        ("message", "user", "# AGENTS.md "),
        ("message", "user", "USER-2 BIG s"),
        ("message", "user", SUMMARY_PREFIX[:12]),
        ("message", "user", "USER-3 third"),
    ]
    summary = message_text(after.body["input"][5])
    assert summary.startswith(SUMMARY_PREFIX) and summary.endswith(":\n" + SUMMARY)
