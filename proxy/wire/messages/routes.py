"""The Messages door: ``POST /v1/messages`` (stream and not; Claude Code posts ``/v1/messages?beta=true``),
``POST /v1/messages/count_tokens`` and ``HEAD /api/hello``, for Anthropic's SDKs and Claude Code.

A request is validated (``validation``), named (``claude_code.conversation_key``), prepared by the engine as one
turn (``proxy.relay.turn``) in the Messages dialect, shaped for the upstream (``shaping``) and sent
(``calls``). Claude Code's own compaction requests are answered here, from the stored conversation. Every
failure leaves in Anthropic's error shape; an upstream's error keeps its type and wording.

Streams: the upstream's events are relayed as they come and added up (``answer.Accumulator``) to store the
answer. An inline compaction is awaited before the response starts (``inline_compaction_seconds`` at most, far
below Claude Code's 300 s). When the upstream then has not answered within ``PING_AFTER`` seconds (a local model
reading a long prompt, a recall round), the stream starts with the proxy's own ``message_start`` and a ``ping`` every
``PING_SECONDS`` (Claude Code gives up on a stream silent for 300 s); the upstream's ``message_start`` is then
not relayed, and its usage joins the final ``message_delta``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy import tokens
from proxy.dialects import MESSAGES, count_messages
from proxy.engine.engine import Prepared
from proxy.engine.recall import clip_to_tokens
from proxy.errors import UpstreamError
from proxy.relay.turn import Call, compacted_retry, prepared_headers
from proxy.scopes import user_scope
from proxy.upstream.anthropic import client_headers
from proxy.wire.auth import request_user
from proxy.wire.http import REPORTED, JSONResponse, compaction_after, read_json_body, to_proxy_error
from proxy.wire.messages import claude_code
from proxy.wire.messages.answer import answer_message, event
from proxy.wire.messages.calls import Opened, Recall, complete, open_stream
from proxy.wire.messages.shaping import engine_transcript, outgoing, with_betas
from proxy.wire.messages.stream import late, relay, streaming, with_usage_shift
from proxy.wire.messages.validation import error_response, validate_count_request, validate_messages_request, worded

if TYPE_CHECKING:
    from proxy.wire.state import AppState

log = logging.getLogger("lcm_proxy.wire")

PING_AFTER = 5.0
DIGEST_TOKENS = 8000  # the most a digest answering a client's compaction takes


def _state(request: Request) -> AppState:
    return request.app.state.lcm  # type: ignore[no-any-return]


class Turn:
    """One Messages request between the door and the upstream."""

    def __init__(self, call: Call, native: bool, headers: dict[str, str], reminders: list[dict[str, Any]]) -> None:
        self.call = call
        self.native = native  # the deployment speaks Messages (else it gets Chat Completions)
        self.headers = headers  # the client headers an Anthropic upstream receives
        self.reminders = reminders

    def shift(self, prepared: Prepared | None) -> int:
        """What ``client_usage: client`` adds to the reported input tokens: what the proxy left out."""
        if prepared is None or self.call.state.config.lcm_settings.client_usage != "client":
            return 0
        return max(0, prepared.tokens_sent - prepared.tokens_forwarded)

    def shaped(self, prepared: Prepared | None) -> tuple[dict[str, Any], dict[str, str]]:
        body = self.call.body
        if self.native and claude_code.server_compacted(body["messages"]):
            prepared = None  # Anthropic's own compaction block: the API ignores what precedes it; sent as it came
        forwarded = prepared.messages if prepared is not None else engine_transcript(body)
        out, betas = outgoing(body, forwarded, self.reminders, anthropic=self.native)
        return out, with_betas(self.headers, betas)

    async def recall(self, prepared: Prepared | None) -> Recall | None:
        """The recall tools, when the engine offers them (summaries or stubs, a model that calls tools)."""
        call = self.call
        if prepared is None or not prepared.recall or prepared.conversation_id is None:
            return None
        summarizer, state = call.summarizer, call.state
        if summarizer is None:
            return None
        window = call.budget or call.fresh_budget()
        cap = max(500, (window.window - window.output_reserve) // 4)  # a tool result never floods the window
        scope = await state.recall.scope(call.scope, prepared.conversation_id, prepared.transcript_length)

        async def run_tool(name: str, arguments: str) -> str:
            return clip_to_tokens(await state.recall.run(scope, name, arguments, summarizer), cap)

        return Recall(run_tool, state.config.lcm_settings.max_tool_rounds, prepared.room)

    async def complete(self, prepared: Prepared | None) -> tuple[dict[str, Any], Prepared | None]:
        state, target = self.call.state, self.call.target
        try:
            shaped = self.shaped(prepared)
            return await complete(state, target, *shaped, self.native, await self.recall(prepared)), prepared
        except UpstreamError as error:
            retry = await compacted_retry(self.call, prepared, error)
            if retry is None:
                raise
            shaped = self.shaped(retry)
            return await complete(state, target, *shaped, self.native, await self.recall(retry)), retry

    def _input(self, prepared: Prepared | None) -> int:
        budget = self.call.budget
        return (prepared.tokens_forwarded if prepared else 0) + (budget.tools if budget else 0)

    async def open(self, prepared: Prepared | None) -> tuple[Opened, Prepared | None]:
        state, target = self.call.state, self.call.target
        try:
            recall = await self.recall(prepared)
            shaped = self.shaped(prepared)
            return await open_stream(state, target, *shaped, self.native, self._input(prepared), recall), prepared
        except UpstreamError as error:
            retry = await compacted_retry(self.call, prepared, error)
            if retry is None:
                raise
            recall, shaped = await self.recall(retry), self.shaped(retry)
            return await open_stream(state, target, *shaped, self.native, self._input(retry), recall), retry


async def create_message(request: Request) -> Response:
    state = _state(request)
    headers: dict[str, str] = {}
    arrived = time.time()
    try:
        tenant = state.auth.tenant_for(request)
        settings = state.config.general_settings
        body = validate_messages_request(
            await read_json_body(request, settings.max_body_bytes, settings.body_read_timeout)
        )
        scope = user_scope(tenant, request_user(request))
        target = state.router.resolve(body["model"])
        native = state.upstream.speaks_messages(target)
        key = claude_code.conversation_key(request.headers)
        reminders = claude_code.pinned(body["messages"])
        call = Call(
            state, scope, target, body, key, arrived, dialect=MESSAGES, messages=engine_transcript(body),
            reserved=sum(tokens.count_text(b["text"]) for b in reminders),
        )  # fmt: skip
        call.gone = request.is_disconnected
        call.link_key = claude_code.parent_key(request.headers)
        turn = Turn(call, native, client_headers(request.headers) if native else {}, reminders)
        lcm = state.config.lcm_settings.enabled
        if lcm and claude_code.is_compaction(request.headers, body) and len(body["messages"]) > 1:
            return await _answer_compaction(turn, headers)
        prepared: Prepared | None = None
        if lcm:
            await state.upstream.windows.ready(target)
            call.continues = claude_code.is_continuation(request.headers, body)
            prepared = await call.prepare(headers)
        return await _forward(turn, prepared, headers)
    except REPORTED as error:
        return error_response(worded(to_proxy_error(error)), headers)


async def _forward(turn: Turn, prepared: Prepared | None, headers: dict[str, str]) -> Response:
    call = turn.call
    state = call.state
    leave = state.priority.enter(state.priority.key(call.target))
    if not call.body.get("stream"):
        try:
            result, prepared = await turn.complete(prepared)
        finally:
            leave()
        record = call.answer_to(prepared)
        if record is not None:
            await record(answer_message(result))
        result = with_usage_shift(result, turn.shift(prepared))
        return JSONResponse(result, headers=headers, background=compaction_after(call, prepared))
    opening = asyncio.ensure_future(turn.open(prepared))
    try:
        done, _ = await asyncio.wait({opening}, timeout=PING_AFTER)
    except BaseException:
        opening.cancel()
        leave()
        raise
    if done:
        try:
            opened, prepared = opening.result()
        except BaseException:
            leave()
            raise
        if prepared is not None:
            prepared_headers(prepared, headers)
        body = relay(opened, call.answer_to(prepared), leave, shift=turn.shift(prepared))
        return streaming(body, headers, compaction_after(call, prepared))
    body = late(call.body["model"], opening, leave, lambda sent: (call.answer_to(sent), turn.shift(sent)))
    return streaming(body, headers, compaction_after(call, prepared))


# --- Claude Code's own compaction ------------------------------------------------------------------------


async def _answer_compaction(turn: Turn, headers: dict[str, str]) -> Response:
    """Answer Claude Code's request for a summary from the stored conversation, with no model call. The
    conversation is brought up to date first (its compaction prompt is not part of it)."""
    call = turn.call
    earlier = {**call.body, "messages": call.body["messages"][:-1]}
    call.messages = engine_transcript(earlier)
    prepared = await call.prepare(headers)
    if prepared.conversation_id is None:  # nothing stored to answer from: the model answers the whole request
        call.messages = engine_transcript(call.body)
        return await _forward(turn, await call.prepare(headers), headers)
    room = min(int(call.body["max_tokens"]), DIGEST_TOKENS)
    digest = await call.state.engine.digest(call.scope, prepared.conversation_id, room)
    text = (
        "<analysis>\nlcm-proxy answered this compaction from the conversation it stores; nothing of it is lost."
        f"\n</analysis>\n\n<summary>\n{digest}\n</summary>"
    )
    output = tokens.count_text(text)
    usage = {
        "input_tokens": prepared.tokens_forwarded, "output_tokens": output, "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    }  # fmt: skip
    message = {
        "id": "msg_lcm_" + secrets.token_hex(12), "type": "message", "role": "assistant",
        "model": call.body["model"], "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    headers["x-lcm-client-compaction"] = "answered"
    background = compaction_after(call, prepared)
    if not call.body.get("stream"):
        return JSONResponse(message, headers=headers, background=background)
    return streaming(_events_of(message), headers, background)


async def _events_of(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """A whole text answer as a Messages stream."""
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 1}}
    yield event({"type": "message_start", "message": start})
    for index, block in enumerate(message["content"]):
        yield event({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
        delta = {"type": "text_delta", "text": block["text"]}
        yield event({"type": "content_block_delta", "index": index, "delta": delta})
        yield event({"type": "content_block_stop", "index": index})
    usage = {k: v for k, v in message["usage"].items() if k != "cache_creation"}
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield event({"type": "message_delta", "delta": stop, "usage": usage})
    yield event({"type": "message_stop"})


# --- count_tokens and the probe ---------------------------------------------------------------------------


async def count_tokens(request: Request) -> Response:
    """What the proxy would forward, at most: the request's count, within the model's budget (the proxy keeps
    every forwarded context within it, so a client's meter never reaches a window the proxy keeps it under)."""
    state = _state(request)
    try:
        state.auth.tenant_for(request)
        settings = state.config.general_settings
        body = validate_count_request(
            await read_json_body(request, settings.max_body_bytes, settings.body_read_timeout)
        )
        target = state.router.resolve(body["model"])
        counted = count_messages(MESSAGES, engine_transcript(body))
        budget = state.policy.budget_for(target, body, recall_tools=False)
        counted += budget.tools
        lcm = state.config.lcm_settings
        if lcm.enabled and lcm.client_usage == "forwarded":
            counted = max(1, min(counted, budget.counted_room))
        return JSONResponse({"input_tokens": counted})
    except REPORTED as error:
        return error_response(to_proxy_error(error))


async def hello(request: Request) -> Response:
    """Claude Code's warm-up probe: an empty 200 to a caller with a valid key."""
    try:
        _state(request).auth.tenant_for(request)
    except REPORTED as error:
        return error_response(to_proxy_error(error))
    return Response(status_code=200)


MESSAGES_ROUTES = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/api/hello", hello, methods=["HEAD", "GET"]),
]
