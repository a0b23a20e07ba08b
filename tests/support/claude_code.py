"""The real Claude Code CLI as a test client: a pinned install, a clean non-interactive run, and a minimal fake.

``claude_binary()`` installs ``@anthropic-ai/claude-code@CLAUDE_CODE_VERSION`` once into
``${XDG_CACHE_HOME:-~/.cache}/lcm-proxy/npm/claude-code-<version>`` (``.ci/run`` does the same beforehand), under a
file lock so parallel test workers don't race, and returns the runnable ``claude``. ``require_claude()`` fails the
test (never skips it) when it is missing. ``run_claude()`` runs ``claude -p`` offline against a base URL, from an
environment holding only ``PATH`` and the variables of FIELD-NOTES.md ("Coding agents as real clients"): the
developer's own ``ANTHROPIC_*`` / ``CLAUDE_*`` never reach it. ``FakeAnthropic`` is a Starlette app answering
``POST /v1/messages`` with a valid Anthropic SSE stream, recording every request it sees (serve it with
``tests.support.servers.serve_in_thread``). What the CLI sends is described in
``tests/support/fixtures/claude_code/README.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.npm import pinned_install

CLAUDE_CODE_VERSION = "2.1.330"
MODEL = "claude-sonnet-4-5"
_why_missing: list[str] = []  # why the last claude_binary() returned None


def cache_dir() -> Path:
    """Where the pinned version is installed (the folder ``.ci/run`` installs into)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lcm-proxy" / "npm" / f"claude-code-{CLAUDE_CODE_VERSION}"


def _runnable(prefix: Path) -> Path | None:
    candidates = [
        prefix / "node_modules" / ".bin" / "claude",
        prefix / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude",
    ]
    for candidate in candidates:
        if not candidate.exists():
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [str(candidate), "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
            )
            if done.returncode == 0 and CLAUDE_CODE_VERSION in done.stdout:
                return candidate
    return None


def claude_binary() -> Path | None:
    """The runnable ``claude`` of the pinned version, installed on first use; None when npm is missing or the
    install failed (the reason in ``require_claude``'s message)."""
    return pinned_install(cache_dir(), f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}", _runnable, _why_missing)


def require_claude() -> Path:
    """The runnable ``claude``, or the test fails saying why (CI installs it first, so it must be there)."""
    found = claude_binary()
    if found is None:
        reason = _why_missing[0] if _why_missing else "unknown reason"
        pytest.fail(f"Claude Code {CLAUDE_CODE_VERSION} is not installed in {cache_dir()}: {reason}", pytrace=False)
    return found


@dataclass
class ClaudeResult:
    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any] | None  # stdout parsed (``--output-format json``): result, session_id, is_error, ...


def run_claude(
    binary: Path,
    base_url: str,
    prompt: str,
    *,
    home: Path,
    cwd: Path,
    extra_env: dict[str, str] | None = None,
    args: Sequence[str] = (),
    timeout: float = 180,
) -> ClaudeResult:
    """``claude -p PROMPT --model claude-sonnet-4-5 --output-format json *args`` against ``base_url``, with
    ``HOME=home``, in ``cwd``, stdin from /dev/null; ``extra_env`` may override any variable (``ANTHROPIC_API_KEY``
    included; ``IS_SANDBOX=1`` lets ``--dangerously-skip-permissions`` run as root)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    env.update(extra_env or {})
    command = [str(binary), "-p", prompt, "--model", MODEL, "--output-format", "json", *args]
    done = subprocess.run(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    parsed: dict[str, Any] | None = None
    with contextlib.suppress(ValueError):
        loaded = json.loads(done.stdout)
        parsed = loaded if isinstance(loaded, dict) else None
    return ClaudeResult(done.returncode, done.stdout, done.stderr, parsed)


# --- a minimal Anthropic fake -------------------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names lowercased (as uvicorn hands them over)
    raw: bytes
    body: Any = None  # the JSON body, when there is one


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def sse_message(answer: str | dict[str, Any], model: str = MODEL, input_tokens: int = 100) -> list[bytes]:
    """The events of one assistant message: a text answer, or (a dict ``{"name", "input"}``) one tool_use block."""
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    }
    message: dict[str, Any] = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",  # unique: Claude Code merges blocks of one message id
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
    }
    message |= {"stop_reason": None, "stop_sequence": None, "usage": usage}
    events = [_sse("message_start", {"type": "message_start", "message": message})]
    if isinstance(answer, str):
        block: dict[str, Any] = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": answer}
        stop = "end_turn"
    else:
        block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": answer["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(answer["input"])}
        stop = "tool_use"
    events.append(_sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}))
    events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    final_usage = usage | {"output_tokens": 10}
    end = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": final_usage}
    events.append(_sse("message_delta", end))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message (its text blocks joined), or ''."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


COMPACTION_PROMPT = "CRITICAL: Respond with TEXT ONLY"
SUMMARY = "<analysis>a</analysis>\n<summary>the summary</summary>"


@dataclass
class FakeAnthropic:
    """``POST /v1/messages`` (any query) streams ``answer(body)``'s reply (by default ``reply``, or ``SUMMARY`` for
    a compaction request); ``/v1/messages/count_tokens`` answers ``{"input_tokens": 100}``; ``HEAD /api/hello``
    200; anything else 404. Every request lands in ``seen``."""

    reply: str = "Hello from the fake Anthropic."
    answer: Callable[[dict[str, Any]], str | dict[str, Any]] | None = None
    seen: list[Seen] = field(default_factory=list)

    def _default(self, body: dict[str, Any]) -> str | dict[str, Any]:
        return SUMMARY if last_user_text(body).startswith(COMPACTION_PROMPT) else self.reply

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        seen = Seen(request.method, request.url.path, request.url.query, dict(request.headers), raw)
        with contextlib.suppress(ValueError):
            seen.body = json.loads(raw) if raw else None
        self.seen.append(seen)
        if request.url.path == "/api/hello":
            return Response(status_code=200)
        if request.method == "POST" and request.url.path == "/v1/messages/count_tokens":
            return JSONResponse({"input_tokens": 100})
        if request.method == "POST" and request.url.path == "/v1/messages" and isinstance(seen.body, dict):
            answer = (self.answer or self._default)(seen.body)
            model = str(seen.body.get("model") or MODEL)
            return StreamingResponse(iter(sse_message(answer, model)), media_type="text/event-stream")
        return JSONResponse({"type": "error", "error": {"type": "not_found_error", "message": "no route"}}, 404)

    @property
    def app(self) -> Starlette:
        methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]
        return Starlette(routes=[Route("/{path:path}", self._handle, methods=methods)])
