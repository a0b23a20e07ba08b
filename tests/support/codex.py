"""The real Codex CLI as a test client: a pinned install, a clean ``codex exec`` run, and a recording fake.

``codex_binary()`` installs ``@openai/codex@CODEX_VERSION`` once into
``${XDG_CACHE_HOME:-~/.cache}/lcm-proxy/npm/codex-<version>`` (``.ci/run`` does the same beforehand), under a file
lock so parallel test workers don't race, and returns the runnable ``codex``. ``require_codex()`` fails the test
(never skips it) when it is missing. ``CodexClient`` writes an isolated ``$CODEX_HOME/config.toml`` pointing one
provider at a base URL and runs ``codex exec`` / ``codex exec resume --last`` from an environment holding only
``PATH``, ``HOME``, ``CODEX_HOME`` and the provider's key: the developer's own ``OPENAI_*`` / ``CODEX_*`` never reach
it. ``FakeResponses`` is a Starlette app answering ``POST /v1/responses`` with a valid Responses SSE stream (text,
a ``function_call``, or a remote ``compaction`` item), recording every request it sees, WebSocket upgrades
included (serve it with ``tests.support.servers.serve_in_thread``). What the CLI sends is described in
``tests/support/fixtures/codex/README.md``.

Which compaction Codex runs depends on the provider's ``name`` (checked with 0.169.0): ``name = "OpenAI"`` (any
provider id, any base URL) makes it compact remotely (an ordinary ``/v1/responses`` request whose ``input`` ends
with ``{"type": "compaction_trigger"}``); any other name compacts locally (an ordinary turn whose last user
message is the compaction prompt, ``LOCAL_COMPACTION_PROMPT``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from tests.support.npm import pinned_install

CODEX_VERSION = "0.169.0"
MODEL = "gpt-5.5"
API_KEY_ENV = "LCM_TEST_API_KEY"
_why_missing: list[str] = []  # why the last codex_binary() returned None


def cache_dir() -> Path:
    """Where the pinned version is installed (the folder ``.ci/run`` installs into)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lcm-proxy" / "npm" / f"codex-{CODEX_VERSION}"


def _runnable(prefix: Path) -> Path | None:
    candidate = prefix / "node_modules" / ".bin" / "codex"
    if not candidate.exists():
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [str(candidate), "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        if done.returncode == 0 and CODEX_VERSION in done.stdout:
            return candidate
    return None


def codex_binary() -> Path | None:
    """The runnable ``codex`` of the pinned version, installed on first use; None when npm is missing or the
    install failed (the reason in ``require_codex``'s message)."""
    return pinned_install(cache_dir(), f"@openai/codex@{CODEX_VERSION}", _runnable, _why_missing)


def require_codex() -> Path:
    """The runnable ``codex``, or the test fails saying why (CI installs it first, so it must be there)."""
    found = codex_binary()
    if found is None:
        reason = _why_missing[0] if _why_missing else "unknown reason"
        pytest.fail(f"Codex {CODEX_VERSION} is not installed in {cache_dir()}: {reason}", pytrace=False)
    return found


# --- the client -------------------------------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string (JSON escapes are valid TOML escapes)


def config_toml(
    base_url: str,
    *,
    provider_name: str = "lcm",
    model: str = MODEL,
    context_window: int | None = None,
    auto_compact_limit: int | None = None,
    websockets: bool = False,
    provider_id: str = "lcm",
) -> str:
    """``$CODEX_HOME/config.toml``: provider ``provider_id`` (named ``provider_name``; ``"OpenAI"`` selects remote
    compaction) at ``base_url`` (``http://127.0.0.1:PORT/v1``), no approvals, no sandbox (so a shell tool call
    such as ``cat notes.txt`` runs at once), and every outside lookup it has a switch for turned off."""
    top: dict[str, Any] = {
        "model": model,
        "model_provider": provider_id,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "web_search": "disabled",
    }
    if context_window is not None:
        top["model_context_window"] = context_window
    if auto_compact_limit is not None:
        top["model_auto_compact_token_limit"] = auto_compact_limit
    provider = {
        "name": provider_name,
        "base_url": base_url,
        "env_key": API_KEY_ENV,
        "wire_api": "responses",
        "supports_websockets": websockets,
        "request_max_retries": 0,
        "stream_max_retries": 0,
    }
    lines = [f"{key} = {_toml(value)}" for key, value in top.items()]
    lines += ["", "[analytics]", "enabled = false", "", "[features]", "plugins = false", ""]
    lines += [f"[model_providers.{provider_id}]"] + [f"{key} = {_toml(value)}" for key, value in provider.items()]
    return "\n".join(lines) + "\n"


@dataclass
class CodexResult:
    returncode: int
    stdout: str  # the agent's last message (``codex exec`` prints only that on stdout)
    stderr: str  # progress, the transcript and errors


@dataclass
class CodexClient:
    """One isolated Codex installation state under ``root`` (``root/home``, ``root/codex_home``, ``root/work``
    unless ``workdir`` is given): ``setup()`` writes ``config.toml`` (see ``config_toml``) and ``AGENTS.md`` in
    the work dir (when ``agents_md`` is set); ``exec`` / ``resume`` run a turn."""

    binary: Path
    root: Path
    base_url: str
    provider_name: str = "lcm"
    model: str = MODEL
    context_window: int | None = None
    auto_compact_limit: int | None = None
    agents_md: str | None = None
    workdir: Path | None = None
    websockets: bool = False
    api_key: str = "sk-test"
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def codex_home(self) -> Path:
        return self.root / "codex_home"

    @property
    def cwd(self) -> Path:
        return self.workdir or self.root / "work"

    def setup(self) -> CodexClient:
        for folder in (self.home, self.codex_home, self.cwd):
            folder.mkdir(parents=True, exist_ok=True)
        config = config_toml(
            self.base_url,
            provider_name=self.provider_name,
            model=self.model,
            context_window=self.context_window,
            auto_compact_limit=self.auto_compact_limit,
            websockets=self.websockets,
        )
        (self.codex_home / "config.toml").write_text(config, encoding="utf-8")
        if self.agents_md is not None:
            (self.cwd / "AGENTS.md").write_text(self.agents_md, encoding="utf-8")
        return self

    def env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "CODEX_HOME": str(self.codex_home),
            API_KEY_ENV: self.api_key,
        }
        env.update(self.extra_env)
        return env

    def run(self, args: Sequence[str], timeout: float = 180) -> CodexResult:
        """``codex *args`` in the work dir, stdin from /dev/null."""
        done = subprocess.run(
            [str(self.binary), *args],
            cwd=self.cwd,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return CodexResult(done.returncode, done.stdout, done.stderr)

    def exec(self, prompt: str, *, args: Sequence[str] = (), timeout: float = 180) -> CodexResult:
        """A new session: ``codex exec --skip-git-repo-check *args PROMPT``."""
        return self.run(["exec", "--skip-git-repo-check", *args, prompt], timeout)

    def resume(self, prompt: str, *, args: Sequence[str] = (), timeout: float = 180) -> CodexResult:
        """The newest session continued: ``codex exec resume --last --skip-git-repo-check *args PROMPT``."""
        return self.run(["exec", "resume", "--last", "--skip-git-repo-check", *args, prompt], timeout)


# --- a recording fake Responses upstream ------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names lowercased (as uvicorn hands them over)
    raw: bytes
    body: Any = None  # the JSON body, when there is one
    websocket: bool = False  # a WebSocket upgrade (answered with ``FakeResponses.websocket_status``)


@dataclass
class FunctionCall:
    """A reply that calls a tool: ``arguments`` is sent JSON-encoded, as the API does."""

    name: str
    arguments: dict[str, Any]
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass
class Compaction:
    """A remote compaction reply: exactly one ``{"type": "compaction", "encrypted_content": ...}`` item."""

    encrypted_content: str = "ENCRYPTED-SUMMARY-1"


Reply = str | FunctionCall | Compaction
LOCAL_COMPACTION_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
SUMMARY = "SUMMARY-TEXT: the user asked for things; all done."


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("input")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def message_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content or [] if isinstance(part, dict))


def last_user_text(body: dict[str, Any]) -> str:
    for item in reversed(input_items(body)):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            return message_text(item)
    return ""


def is_remote_compaction(body: dict[str, Any]) -> bool:
    items = input_items(body)
    return bool(items) and items[-1].get("type") == "compaction_trigger"


def is_local_compaction(body: dict[str, Any]) -> bool:
    return last_user_text(body).startswith(LOCAL_COMPACTION_PROMPT)


def _sse(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def sse_response(reply: Reply, model: str = MODEL, input_tokens: int = 100, output_tokens: int = 10) -> list[bytes]:
    """The events of one response: created, in_progress, the output item (added / parts / done), completed."""
    rid = f"resp_{uuid.uuid4().hex}"
    counter = itertools.count()
    base: dict[str, Any] = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model}
    base["output"] = []
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": base | {"status": "in_progress"}},
        {"type": "response.in_progress", "response": base | {"status": "in_progress"}},
    ]
    item: dict[str, Any]
    if isinstance(reply, str):
        iid = f"msg_{uuid.uuid4().hex}"
        part = {"type": "output_text", "text": reply, "annotations": []}
        item = {"id": iid, "type": "message", "status": "completed", "role": "assistant", "content": [part]}
        ref: dict[str, Any] = {"item_id": iid, "output_index": 0, "content_index": 0}
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": item | {"status": "in_progress"} | {"content": []},
            },
            {"type": "response.content_part.added", **ref, "part": part | {"text": ""}},
            {"type": "response.output_text.delta", **ref, "delta": reply},
            {"type": "response.output_text.done", **ref, "text": reply},
            {"type": "response.content_part.done", **ref, "part": part},
        ]
    elif isinstance(reply, FunctionCall):
        iid = f"fc_{uuid.uuid4().hex}"
        arguments = json.dumps(reply.arguments)
        item = {
            "id": iid,
            "type": "function_call",
            "status": "completed",
            "name": reply.name,
            "arguments": arguments,
            "call_id": reply.call_id,
        }
        ref = {"item_id": iid, "output_index": 0}  # a function call has no content part
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": item | {"status": "in_progress"} | {"arguments": ""},
            },
            {"type": "response.function_call_arguments.delta", **ref, "delta": arguments},
            {"type": "response.function_call_arguments.done", **ref, "arguments": arguments},
        ]
    else:
        item = {"id": f"cmp_{uuid.uuid4().hex}", "type": "compaction", "encrypted_content": reply.encrypted_content}
        events.append({"type": "response.output_item.added", "output_index": 0, "item": item})
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
    events.append(
        {"type": "response.completed", "response": base | {"status": "completed", "output": [item], "usage": usage}}
    )
    return [_sse(event | {"sequence_number": next(counter)}) for event in events]


@dataclass
class FakeResponses:
    """``POST /v1/responses`` streams ``answer(body)``'s reply (by default: a ``Compaction`` for a remote
    compaction request, ``SUMMARY`` for a local one, else ``reply``) with ``usage(body)`` input tokens (default
    100); a WebSocket upgrade on any path is recorded and refused with ``websocket_status``; anything else 404.
    Every request lands in ``seen``."""

    reply: str = "Hello from the fake Responses API."
    answer: Callable[[dict[str, Any]], Reply] | None = None
    usage: Callable[[dict[str, Any]], int] | None = None
    websocket_status: int = 404
    seen: list[Seen] = field(default_factory=list)

    def _default(self, body: dict[str, Any]) -> Reply:
        if is_remote_compaction(body):
            return Compaction()
        if is_local_compaction(body):
            return SUMMARY
        return self.reply

    @property
    def turns(self) -> list[Seen]:
        """The ``POST /v1/responses`` requests, in arrival order."""
        return [s for s in self.seen if s.method == "POST" and s.path == "/v1/responses" and not s.websocket]

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        seen = Seen(request.method, request.url.path, request.url.query, dict(request.headers), raw)
        with contextlib.suppress(ValueError):
            seen.body = json.loads(raw) if raw else None
        self.seen.append(seen)
        if request.method == "POST" and request.url.path == "/v1/responses" and isinstance(seen.body, dict):
            reply = (self.answer or self._default)(seen.body)
            tokens = self.usage(seen.body) if self.usage else 100
            events = sse_response(reply, str(seen.body.get("model") or MODEL), tokens)
            return StreamingResponse(iter(events), media_type="text/event-stream")
        return JSONResponse({"error": {"message": "no route", "type": "invalid_request_error"}}, 404)

    async def _websocket(self, websocket: WebSocket) -> None:
        headers = dict(websocket.headers)
        self.seen.append(Seen("GET", websocket.url.path, websocket.url.query, headers, b"", websocket=True))
        status = self.websocket_status
        await websocket.send_denial_response(JSONResponse({"error": {"message": "no websocket"}}, status))

    @property
    def app(self) -> Starlette:
        methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]
        routes = [Route("/{path:path}", self._handle, methods=methods), WebSocketRoute("/{path:path}", self._websocket)]
        return Starlette(routes=routes)
