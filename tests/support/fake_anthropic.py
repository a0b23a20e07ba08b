"""A fake of Anthropic's Messages API: a real Starlette app, served on loopback by the tests.

It answers ``POST /v1/messages`` (a query string such as ``?beta=true`` is accepted and recorded in ``path``)
streamed or not, and ``POST /v1/messages/count_tokens``, in Anthropic's shapes, from a script of ``AReply``
objects (first in, first out), else ``responder(body)``, else an echo of the last user text (or, for Claude
Code's compaction prompt, a fake ``<analysis>``/``<summary>`` answer). Every request is recorded as it arrived.

It is as strict as the real API where a gateway in front of it can break things; each of these is a 400
``invalid_request_error`` worded like the API's:

- a body field sent without its beta in ``anthropic-beta`` (``BETA_FOR_FIELD``; a beta without its field is
  fine): ``context_management`` -> ``context-management-2025-06-27``, ``output_config`` -> ``effort-2025-11-24``,
  a tool's ``strict`` -> ``structured-outputs-2025-11-13``, a tool's ``defer_loading`` ->
  ``advanced-tool-use-2025-11-20``, ``thinking.block_binding`` -> ``thinking-binding-controls-2026-08-01``;
- more than 4 ``cache_control`` blocks (system, tools, message blocks, tool_result contents, the top-level one);
- a replayed ``thinking`` block whose signature the fake did not issue for that text, or that was issued for
  another conversation prefix: the signature is base64 of the SHA-256 of the canonical ``system`` + earlier
  ``messages`` followed by an HMAC (fixed secret) over that digest and the thinking text. The canonical prefix
  ignores ``cache_control`` markers, string-vs-block spelling of text and thinking blocks (so a moving
  breakpoint or dropped old thinking blocks keep later ones valid), but includes every system block, the first
  (Claude Code's per-session billing line) too. With ``thinking.block_binding.prefix_mismatch_behavior:
  "drop_block"`` and its beta a mismatched block is ignored instead (counted in ``dropped_thinking``);
  ``redacted_thinking`` blocks are accepted whatever their data (the fake never issues them);
- roles not alternating user/assistant from a user message, a ``tool_use`` not answered by a ``tool_result``
  at the start of the next user message, a ``tool_result`` answering no ``tool_use`` of the message before;
- no ``max_tokens`` (``/v1/messages``), no ``model`` or ``messages``; a message with empty content (but a final
  assistant one) or an empty text block; an input over ``window`` tokens (``/v1/messages`` only).

Requests without ``x-api-key`` / ``authorization: Bearer`` get a 401, without ``anthropic-version`` a 400.

Tokens are counted as a quarter of the characters of each tool, system block and message block in canonical
JSON. Prompt caching is simulated: each answered request remembers its prefixes up to its ``cache_control``
breakpoints; a later request reads (``cache_read_input_tokens``) the longest remembered prefix it repeats, up
to its last breakpoint, writes (``cache_creation_input_tokens``) the rest up to that breakpoint, and
``input_tokens`` is what follows it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.fakes import Recorded

BETA_FOR_FIELD: dict[str, str] = {
    "context_management": "context-management-2025-06-27",
    "output_config": "effort-2025-11-24",
    "tools[].strict": "structured-outputs-2025-11-13",
    "tools[].defer_loading": "advanced-tool-use-2025-11-20",
    "thinking.block_binding": "thinking-binding-controls-2026-08-01",
}
BINDING_BETA = BETA_FOR_FIELD["thinking.block_binding"]
MAX_CACHE_CONTROLS = 4
COMPACTION_ANSWER = "<analysis>fake analysis</analysis>\n<summary>fake summary of the conversation</summary>"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_SECRET = b"lcm-proxy fake anthropic signing key"
_THINKING = ("thinking", "redacted_thinking")


@dataclass
class AReply:
    text: str = ""
    tool_uses: list[dict[str, Any]] = field(default_factory=list)  # each {"id", "name", "input"} (id optional)
    thinking: str | None = None  # a signed thinking block first
    status: int = 200
    error_type: str | None = None  # default from the status (529 -> overloaded_error...)
    error_message: str = ""
    stop_reason: str | None = None  # default "tool_use" with tool uses, else "end_turn"
    usage: dict[str, Any] | None = None  # overrides of the computed usage fields
    delay: float = 0.0  # seconds before answering (headers included)
    error_mid_stream: bool = False  # streaming: message_start and ping, then an ``event: error`` with this error
    headers: dict[str, str] | None = None  # extra response headers (``retry-after``...)


class Invalid(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.status, self.kind = message, status, kind


def canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def blocks(content: Any) -> list[dict[str, Any]]:
    """A ``system`` or message ``content`` as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _strip(block: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(out.get("content"), list):
        out["content"] = [_strip(b) for b in blocks(out["content"])]
    return out


def _has_cache(block: dict[str, Any]) -> int:
    inner = blocks(block.get("content")) if block.get("type") == "tool_result" else []
    return bool(block.get("cache_control")) + sum(_has_cache(b) for b in inner)


def _segments(body: dict[str, Any]) -> list[tuple[str, int, bool]]:
    """(canonical JSON, tokens, is a cache breakpoint) of each tool, system block and message block, in order."""
    parts = [(_strip(t), t) for t in body.get("tools") or [] if isinstance(t, dict)]
    parts += [(_strip(b), b) for b in blocks(body.get("system"))]
    for m in body.get("messages") or []:
        parts += [({"role": m.get("role"), "block": _strip(b)}, b) for b in blocks(m.get("content"))]
    segments = []
    for whole, block in parts:
        text = canon(whole)
        segments.append((text, max(1, (len(text) + 3) // 4), _has_cache(block) > 0))
    if body.get("cache_control") and segments:  # automatic caching: a breakpoint on the last block
        segments[-1] = (*segments[-1][:2], True)
    return segments


def count_tokens(body: dict[str, Any]) -> int:
    return sum(tokens for _, tokens, _ in _segments(body))


def prefix_digest(body: dict[str, Any], n: int) -> bytes:
    """What a thinking block in ``messages[n]`` is bound to: the system and the messages before it."""
    system = [_strip(b) for b in blocks(body.get("system"))]
    messages = [
        {
            "role": m.get("role"),
            "content": [_strip(b) for b in blocks(m.get("content")) if b.get("type") not in _THINKING],
        }
        for m in (body.get("messages") or [])[:n]
    ]
    return hashlib.sha256(canon({"system": system, "messages": messages}).encode()).digest()


def sign(digest: bytes, thinking: str) -> str:
    return base64.b64encode(digest + hmac.digest(_SECRET, digest + thinking.encode(), "sha256")).decode()


def signed_prefix(signature: Any, thinking: str) -> bytes | None:
    """The prefix digest a signature was issued for, or None if the fake never issued it for this text."""
    try:
        raw = base64.b64decode(str(signature), validate=True)
    except ValueError:
        return None
    digest, mac = raw[:32], raw[32:]
    good = len(raw) == 64 and hmac.compare_digest(mac, hmac.digest(_SECRET, digest + thinking.encode(), "sha256"))
    return digest if good else None


def _text(content: Any) -> list[str]:
    out = []
    for b in blocks(content):
        out += [str(b.get("text", ""))] if b.get("type") == "text" else []
        out += _text(b.get("content")) if b.get("type") == "tool_result" else []
    return out


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message (its text blocks and tool results, joined by newlines)."""
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            return "\n".join(_text(m.get("content")))
    return ""


def all_text(body: dict[str, Any]) -> str:
    """Every text of the system and the messages (thinking, tool inputs and results too), joined by newlines."""
    out = _text(body.get("system"))
    for m in body.get("messages") or []:
        for b in blocks(m.get("content")):
            kind = b.get("type")
            if kind == "thinking":
                out.append(str(b.get("thinking", "")))
            elif kind == "tool_use":
                out.append(canon(b.get("input", {})))
            else:
                out += _text([b])
    return "\n".join(out)


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _error(kind: str, message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(_error_body(kind, message), status_code=status, headers=headers)


def _pieces(text: str) -> list[str]:
    """A text as it streams: word by word, each word but the first with its leading space."""
    return [w if j == 0 else " " + w for j, w in enumerate(text.split(" ") if text else [])]


def _sse(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


class FakeAnthropic:
    def __init__(self, window: int | None = None) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[AReply] = deque()
        # Called with the request body when the script is empty; returns the reply (e.g. a scripted model).
        self.responder: Callable[[dict[str, Any]], AReply] | None = None
        self.window = window  # a counted input over this many tokens is refused as too long
        self.cache: set[str] = set()  # digests of the cached prefixes
        self.dropped_thinking = 0  # thinking blocks ignored under prefix_mismatch_behavior "drop_block"
        self._ids = itertools.count(1)
        routes = [("/v1/messages", self.messages), ("/v1/messages/count_tokens", self.count)]
        self.app = Starlette(routes=[Route(path, endpoint, methods=["POST"]) for path, endpoint in routes])

    def enqueue(self, *replies: AReply) -> None:
        self.script.extend(replies)

    @property
    def last(self) -> Recorded:
        return self.requests[-1]

    def reset(self) -> None:
        self.requests.clear()
        self.script.clear()
        self.responder = None
        self.cache.clear()
        self.dropped_thinking = 0

    # --- receiving and validating ---------------------------------------------------------------------------

    async def _receive(self, request: Request, *, counting: bool) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        self.requests.append(
            Recorded(body=body if isinstance(body, dict) else {}, headers=dict(request.headers), path=path)
        )
        headers = request.headers
        if not headers.get("x-api-key") and not headers.get("authorization", "").lower().startswith("bearer "):
            raise Invalid("x-api-key header is required", 401, "authentication_error")
        if not headers.get("anthropic-version"):
            raise Invalid("anthropic-version: header is required")
        if not isinstance(body, dict):
            raise Invalid("There was an error parsing the body of your request as JSON.")
        betas = {b.strip() for value in headers.getlist("anthropic-beta") for b in value.split(",") if b.strip()}
        self.validate(body, betas, counting=counting)
        return body

    def validate(self, body: dict[str, Any], betas: set[str], *, counting: bool = False) -> None:
        """Raise ``Invalid`` as the real API would answer 400 for this body and these betas."""
        for name in ("model", "messages") if counting else ("model", "max_tokens", "messages"):
            if name not in body:
                raise Invalid(f"{name}: Field required")

        def need(key: str, where: str) -> None:
            if BETA_FOR_FIELD[key] not in betas:
                raise Invalid(f"{where}: Extra inputs are not permitted")

        for key in ("context_management", "output_config"):
            if key in body:
                need(key, key)
        if isinstance(body.get("thinking"), dict) and "block_binding" in body["thinking"]:
            need("thinking.block_binding", "thinking.block_binding")
        for i, tool in enumerate(body.get("tools") or []):
            for key in ("strict", "defer_loading"):
                if isinstance(tool, dict) and key in tool:
                    need(f"tools[].{key}", f"tools.{i}.custom.{key}")

        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise Invalid("messages: at least one message is required")
        for n, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ("user", "assistant"):
                raise Invalid(f"messages.{n}.role: Input should be 'user' or 'assistant'")
            if n == 0 and role != "user":
                raise Invalid('messages: first message must use the "user" role')
            if n and messages[n - 1].get("role") == role:
                raise Invalid(
                    f'messages: roles must alternate between "user" and "assistant", but found multiple "{role}" roles in a row'
                )
            content = blocks(m.get("content"))
            if not content and not (role == "assistant" and n == len(messages) - 1):
                raise Invalid(
                    f"messages.{n}: all messages must have non-empty content except for the optional final assistant message"
                )
            if any(b.get("type") == "text" and not b.get("text") for b in content):
                raise Invalid("messages: text content blocks must be non-empty")
        found = bool(body.get("cache_control")) + sum(_has_cache(t) for t in body.get("tools") or [])
        found += sum(_has_cache(b) for b in blocks(body.get("system")))
        found += sum(_has_cache(b) for m in messages for b in blocks(m.get("content")))
        if found > MAX_CACHE_CONTROLS:
            raise Invalid(
                f"A maximum of {MAX_CACHE_CONTROLS} blocks with cache_control may be provided. Found {found}."
            )
        self._check_tools(messages)
        self._check_thinking(body, messages, counting=counting)
        if not counting and self.window is not None and (tokens := count_tokens(body)) > self.window:
            raise Invalid(f"prompt is too long: {tokens} tokens > {self.window} maximum")

    @staticmethod
    def _check_tools(messages: list[dict[str, Any]]) -> None:
        for n, m in enumerate(messages):
            content = blocks(m.get("content"))
            if m["role"] == "assistant":
                uses = [str(b.get("id")) for b in content if b.get("type") == "tool_use"]
                after = blocks(messages[n + 1].get("content")) if n + 1 < len(messages) else []
                leading = list(itertools.takewhile(lambda b: b.get("type") == "tool_result", after))
                missing = [u for u in uses if u not in {str(b.get("tool_use_id")) for b in leading}]
                if missing:
                    raise Invalid(
                        f"messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                        f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                        "in the next message."
                    )
                continue
            before = blocks(messages[n - 1].get("content")) if n else []
            uses_before = {str(b.get("id")) for b in before if b.get("type") == "tool_use"}
            for k, b in enumerate(content):
                if b.get("type") == "tool_result" and str(b.get("tool_use_id")) not in uses_before:
                    raise Invalid(
                        f"messages.{n}.content.{k}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{b.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                        "block in the previous message."
                    )

    def _check_thinking(self, body: dict[str, Any], messages: list[dict[str, Any]], *, counting: bool) -> None:
        thinking: dict[str, Any] = body["thinking"] if isinstance(body.get("thinking"), dict) else {}
        drop = (thinking.get("block_binding") or {}).get("prefix_mismatch_behavior") == "drop_block"
        for n, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            for k, b in enumerate(blocks(m.get("content"))):
                if b.get("type") != "thinking":
                    continue
                if not isinstance(b.get("signature"), str):
                    raise Invalid(f"messages.{n}.content.{k}.thinking.signature: Field required")
                digest = signed_prefix(b["signature"], str(b.get("thinking", "")))
                if digest is None:
                    raise Invalid(f"messages.{n}.content.{k}: Invalid `signature` in `thinking` block")
                if digest != prefix_digest(body, n):
                    if not drop:
                        raise Invalid(
                            f"messages.{n}.content.{k}: thinking block is bound to a different conversation prefix"
                        )
                    self.dropped_thinking += not counting

    # --- answering ------------------------------------------------------------------------------------------

    async def count(self, request: Request) -> Response:
        try:
            body = await self._receive(request, counting=True)
        except Invalid as e:
            return _error(e.kind, e.message, e.status)
        return JSONResponse({"input_tokens": count_tokens(body)})

    def _reply_for(self, body: dict[str, Any]) -> AReply:
        if self.script:
            return self.script.popleft()
        if self.responder is not None:
            return self.responder(body)
        text = last_user_text(body)
        if "<summary>" in text or text.lstrip().startswith("CRITICAL: Respond with TEXT ONLY"):
            return AReply(text=COMPACTION_ANSWER)
        return AReply(text=f"echo: {text[-200:]}")

    def _cache_usage(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """(input_tokens, cache_creation_input_tokens, cache_read_input_tokens); remembers this request's prefixes."""
        digest, total, points = str(body.get("model")).encode(), 0, []
        for text, tokens, breakpoint in _segments(body):
            digest = hashlib.sha256(digest + text.encode()).digest()
            total += tokens
            points.append((digest.hex(), total, breakpoint))
        breakpoints = [i for i, point in enumerate(points) if point[2]]
        if not breakpoints:
            return total, 0, 0
        last = breakpoints[-1]
        read = max((cum for key, cum, _ in points[: last + 1] if key in self.cache), default=0)
        created = points[last][1] - read
        self.cache.update(points[i][0] for i in breakpoints)
        return total - read - created, created, read

    def _message(self, body: dict[str, Any], reply: AReply) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.thinking is not None:
            signature = sign(prefix_digest(body, len(body["messages"])), reply.thinking)
            content.append({"type": "thinking", "thinking": reply.thinking, "signature": signature})
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for use in reply.tool_uses:
            tool_id = use.get("id") or f"toolu_fake{next(self._ids):06d}"
            content.append({"type": "tool_use", "id": tool_id, "name": use["name"], "input": use.get("input", {})})
        fresh, created, read = self._cache_usage(body)
        said = (reply.thinking or "") + reply.text + "".join(canon(use.get("input", {})) for use in reply.tool_uses)
        usage: dict[str, Any] = {
            "input_tokens": fresh,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": created, "ephemeral_1h_input_tokens": 0},
            "output_tokens": max(1, len(said) // 4),
            "service_tier": "standard",
        }
        usage.update(reply.usage or {})
        if "cache_creation" not in (reply.usage or {}):
            usage["cache_creation"]["ephemeral_5m_input_tokens"] = usage["cache_creation_input_tokens"]
        return {
            "id": f"msg_fake{next(self._ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn"),
            "stop_sequence": None,
            "usage": usage,
        }

    async def messages(self, request: Request) -> Response:
        try:
            body = await self._receive(request, counting=False)
        except Invalid as e:
            return _error(e.kind, e.message, e.status)
        reply = self._reply_for(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        kind = reply.error_type or ERROR_TYPES.get(reply.status, "api_error")
        if reply.status != 200 and not (reply.error_mid_stream and body.get("stream")):
            return _error(kind, reply.error_message, reply.status, reply.headers)
        message = self._message(body, reply)
        if not body.get("stream"):
            return JSONResponse(message, headers=reply.headers)
        return StreamingResponse(
            self._events(message, reply, kind), media_type="text/event-stream", headers=reply.headers
        )

    @staticmethod
    async def _events(message: dict[str, Any], reply: AReply, kind: str):  # type: ignore[no-untyped-def]
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        yield _sse("message_start", {"type": "message_start", "message": start})
        yield _sse("ping", {"type": "ping"})
        if reply.error_mid_stream:
            yield _sse("error", _error_body(kind, reply.error_message))
            return
        empty: dict[str, Any]
        deltas: list[dict[str, Any]]
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                empty = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
            elif block["type"] == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"])]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            else:
                empty, whole = {**block, "input": {}}, json.dumps(block["input"])
                half = max(1, len(whole) // 2)
                deltas = [{"type": "input_json_delta", "partial_json": p} for p in (whole[:half], whole[half:])]
            yield _sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": empty})
            for delta in deltas:
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": i})
        final = {k: v for k, v in usage.items() if k not in ("cache_creation", "service_tier")}
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        yield _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": final})
        yield _sse("message_stop", {"type": "message_stop"})


ANTHROPIC_KEY = "sk-ant-upstream-secret-42"


def claude_models(anthropic_url: str, upstream_url: str, window: int = 200_000) -> list[dict[str, Any]]:
    """Two models for a proxy's config: ``claude-sonnet-4-5`` served natively by a ``FakeAnthropic`` at
    ``anthropic_url``, ``local-claude`` by the fake OpenAI-compatible upstream at ``upstream_url`` (translated)."""
    return [
        {
            "model_name": "claude-sonnet-4-5",
            "litellm_params": {
                "model": "anthropic/claude-sonnet-4-5",
                "api_base": anthropic_url,
                "api_key": ANTHROPIC_KEY,
            },
            "model_info": {"max_input_tokens": window, "supports_function_calling": True},
        },
        {
            "model_name": "local-claude",
            "litellm_params": {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": "sk-local"},
            "model_info": {"max_input_tokens": window, "supports_function_calling": True},
        },
    ]
