"""The real Claude Code CLI (tests/support/claude_code.py) answers a turn through a fake Anthropic upstream."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.claude_code import FakeAnthropic, require_claude, run_claude
from tests.support.servers import serve_in_thread

pytestmark = pytest.mark.slow


def test_the_real_cli_answers_a_turn_through_a_fake_upstream(tmp_path: Path) -> None:
    binary = require_claude()
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    fake = FakeAnthropic(reply="PONG from the fake upstream")
    with serve_in_thread(fake.app) as url:
        done = run_claude(binary, url, "say pong", home=home, cwd=project)
    assert done.returncode == 0, done.stderr or done.stdout
    assert done.result is not None, done.stdout
    assert done.result.get("is_error") is False, done.result
    assert "PONG from the fake upstream" in str(done.result.get("result")), done.result
    turns = [seen for seen in fake.seen if seen.method == "POST" and seen.path == "/v1/messages"]
    assert turns, [(seen.method, seen.path) for seen in fake.seen]
    assert turns[0].headers.get("x-claude-code-session-id") == done.result.get("session_id")
    assert turns[0].body["stream"] is True
