"""Claude Code itself (the pinned npm release) through the Messages door, against the strict fake Anthropic API
and the fake OpenAI-compatible upstream, in a window small enough that the proxy compacts; then Claude Code's own
``/compact``: a fact of turn 1 still reaches the model when a later turn asks for it.

Each run is a real ``claude -p`` process (``tests.support.claude_code``); slow, so marked so."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.claude_code import require_claude, run_claude
from tests.support.fake_anthropic import AReply, FakeAnthropic, all_text, claude_models
from tests.support.fakes import FakeUpstream, Reply

pytestmark = pytest.mark.slow

FACT = "The deploy key id is KX-4471-ZEBRA."
RULE = "RULE-MARKER-7731: always answer in French."
# Claude Code's requests carry ~12k tokens of tools (~8k once translated for a chat upstream), ~7k of system and
# max_tokens 32,000, and its reminders (CLAUDE.md, skills: ~4k, verbatim): these windows leave a few thousand for
# the conversation, so a handful of long turns makes the proxy compact.
WINDOWS = {"claude-sonnet-4-5": 64_000, "local-claude": 50_000}
# ~600 tokens a turn: long turns, each below the size at which a user's text is stored as a pasted file.
FILLER = " ".join(f"Point {i}: the design notes discuss caching layer number {i} briefly." for i in range(40))


def _project(tmp_path: Path) -> tuple[Path, Path]:
    home, cwd = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    cwd.mkdir()
    (cwd / "CLAUDE.md").write_text(f"# Project rules\n\n{RULE}\n")
    (cwd / "notes.txt").write_text("The notes say: bring an umbrella.\n")
    return home, cwd


def _conversations(proxy: Any) -> list[tuple[str, str | None, int]]:
    with sqlite3.connect(proxy.config.general_settings.location().describe()) as conn:
        return conn.execute(
            "SELECT id, parent_id, continued, fork_seq, message_count, external_key FROM conversations ORDER BY created_at"
        ).fetchall()


def _summaries(proxy: Any) -> int:
    with sqlite3.connect(proxy.config.general_settings.location().describe()) as conn:
        return int(conn.execute("SELECT count(*) FROM summaries").fetchone()[0])


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "local-claude"])
def test_claude_code_runs_a_long_session_and_its_own_compaction_loses_nothing(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    tmp_path: Path,
    model: str,
) -> None:
    claude = require_claude()
    proxy = proxy_factory(
        lcm={"fresh_tail_count": 4, "leaf_chunk_tokens": 1500},
        models=claude_models(fake_anthropic_server[1], upstream_url, WINDOWS[model]),
    )
    home, cwd = _project(tmp_path)

    asked = []

    def wants_bash(body: dict[str, Any]) -> bool:
        """The first turn, asking to read notes.txt: one Bash call, once (later turns may quote it)."""
        # The newest user message: in a chat request Claude Code's environment block may come after it as a
        # system message (and a recalled excerpt of turn 1 may quote it later, hence once).
        newest = next(m for m in reversed(body["messages"]) if m.get("role") in ("user", "tool"))
        if asked or newest["role"] != "user" or "use bash" not in str(newest["content"]):
            return False
        asked.append(True)
        return True

    def answer_anthropic(body: dict[str, Any]) -> AReply:
        if body.get("tools") and wants_bash(body):
            return AReply(
                tool_uses=[
                    {"id": "toolu_bash1", "name": "Bash", "input": {"command": "cat notes.txt", "description": "read"}}
                ]
            )
        return AReply(text="D'accord, noté.")

    def answer_chat(body: dict[str, Any]) -> Reply:
        if body.get("tools") and wants_bash(body):
            call = {
                "id": "call_bash1",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "cat notes.txt", "description": "read"}'},
            }
            return Reply(content=None, tool_calls=[call])
        return Reply(content="D'accord, noté.")

    fake_anthropic.responder = answer_anthropic
    fake_anthropic.window = WINDOWS[model] - 32_000  # Claude Code asks for max_tokens 32,000: the rest is the input's
    fake_upstream.responder = answer_chat

    def turn(prompt: str, *more: str) -> dict[str, Any]:
        done = run_claude(
            claude, proxy.url, prompt, home=home, cwd=cwd, args=["--model", model, "--allowedTools", "Bash", *more]
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.result is not None and not done.result.get("is_error"), done.stdout[-2000:]
        return done.result

    turn(f"Remember this: {FACT} Then use bash to read notes.txt. Now read these notes: {FILLER}")
    for i in range(8):
        turn(f"Turn {i + 2}. More notes to keep in mind: {FILLER}", "--continue")

    def forwarded() -> list[Any]:
        """Claude Code's turns as the upstream received them (not the proxy's own summariser calls)."""
        seen = fake_anthropic.requests if model == "claude-sonnet-4-5" else fake_upstream.requests
        return [r for r in seen if r.body.get("tools")]

    bodies = [r.body for r in forwarded()]
    assert len(bodies) >= 10  # nine turns, the first a tool round trip
    # The tool ran in Claude Code and its result came back through the proxy, paired with its call.
    results = [b for b in bodies if "bring an umbrella" in str(b["messages"])]
    assert results, "the Bash tool's output reached the upstream"
    # The proxy compacted: the newest request no longer carries turn 1's words raw, yet every request fit.
    texts = [all_text(b) if model == "claude-sonnet-4-5" else str(b["messages"]) for b in bodies]
    assert FACT not in texts[-1] or "summary" in texts[-1].lower()
    assert all(RULE in t for t in texts), "the CLAUDE.md rule is in every forwarded request"
    assert len({c[0] for c in _conversations(proxy)}) == 1, _conversations(proxy)  # one conversation
    assert _summaries(proxy) > 0  # the proxy compacted

    # Claude Code's own compaction, answered by the proxy from what it stores; then a question about turn 1.
    turn("/compact", "--continue")
    turn("What is the deploy key id I gave you at the very start?", "--continue")
    newest = forwarded()[-1].body
    last = all_text(newest) if model == "claude-sonnet-4-5" else str(newest["messages"])
    assert "KX-4471-ZEBRA" in last, (_conversations(proxy), last[-3000:])  # the digest, the tail or a recalled excerpt
    assert RULE in last
    rows = _conversations(proxy)
    assert any(c[2] for c in rows), rows  # the continuation is linked to what it continues


@pytest.mark.parametrize("model", ["claude-sonnet-4-5"])
def test_claude_codes_auto_compaction_is_answered_by_the_proxy_and_loses_nothing(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    tmp_path: Path,
    model: str,
) -> None:
    """The upstream reports a context near the window Claude Code assumes (CLAUDE_CODE_AUTO_COMPACT_WINDOW), so
    it compacts on its own before the next turn, with the gateway hint headers on. Native only: a translated
    stream's ``message_start`` carries the proxy's own count of what it forwards, which is what Claude Code reads
    (and what keeps it from compacting while the proxy keeps the context within the window)."""
    claude = require_claude()
    proxy = proxy_factory(models=claude_models(fake_anthropic_server[1], upstream_url))
    home, cwd = _project(tmp_path)
    full = {"big": False}

    def anthropic_reply(body: dict[str, Any]) -> AReply:
        return AReply(text="Noté.", usage={"input_tokens": 150_000} if full["big"] else None)

    def chat_reply(body: dict[str, Any]) -> Reply:
        reply = Reply(content="Noté.")
        if full["big"]:
            reply.usage = {"prompt_tokens": 150_000, "completion_tokens": 3, "total_tokens": 150_003}
        return reply

    fake_anthropic.responder = anthropic_reply
    fake_upstream.responder = chat_reply
    env = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1"}

    def turn(prompt: str, *more: str) -> None:
        done = run_claude(claude, proxy.url, prompt, home=home, cwd=cwd, extra_env=env, args=["--model", model, *more])
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.result is not None and not done.result.get("is_error"), done.stdout[-2000:]

    turn(f"Remember this: {FACT}")
    full["big"] = True
    turn("Note also that the staging cluster is called heron.", "--continue")
    full["big"] = False
    turn("What is the deploy key id I gave you at the very start?", "--continue")
    seen = fake_anthropic.requests if model == "claude-sonnet-4-5" else fake_upstream.requests
    turns = [r.body for r in seen if r.body.get("tools")]
    compacting = [b for b in turns if "CRITICAL: Respond with TEXT ONLY" in str(b["messages"][-1])]
    assert compacting == []  # the proxy answered Claude Code's compaction itself: no model call
    rows = _conversations(proxy)
    assert any(c[2] for c in rows), rows  # Claude Code compacted, and its continuation is linked
    newest = turns[-1]
    text = all_text(newest) if model == "claude-sonnet-4-5" else str(newest["messages"])
    assert "KX-4471-ZEBRA" in text
    assert RULE in text
