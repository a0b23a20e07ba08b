"""Route handlers: ``/v1/chat/completions``, ``/v1/models``, ``/healthz``.

Handlers translate between HTTP and the layers below and contain no model-specific logic. Every failure
leaves here as OpenAI error JSON: ``ProxyError`` with its own status, anything unexpected as a 500 that
OpenAI SDKs are told not to retry (``x-should-retry: false``), so a proxy bug is not sent three times.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy import __version__
from proxy.engine.engine import Preparation, Prepared
from proxy.engine.recall import clip_to_tokens
from proxy.errors import InternalError, InvalidRequestError, ProxyError
from proxy.routing import ResolvedModel
from proxy.summarizer import UpstreamSummarizer
from proxy.toolloop import RecallLoop, with_recall_tools
from proxy.types import ChatBody, Chunk
from proxy.wire.http import JSONResponse, error_response, read_json_body
from proxy.wire.sse import DONE, sse_event
from proxy.wire.validation import validate_chat_request

if TYPE_CHECKING:
    from proxy.app import AppState

log = logging.getLogger("lcm_proxy.wire")

CONVERSATION_HEADER = "x-lcm-conversation-id"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _state(request: Request) -> AppState:
    return request.app.state.lcm  # type: ignore[no-any-return]


def _conversation_key(request: Request) -> str | None:
    key = request.headers.get(CONVERSATION_HEADER)
    if key is None:
        return None
    key = key.strip()
    if not key or len(key) > 200 or not key.isprintable():
        raise InvalidRequestError(
            f"Invalid {CONVERSATION_HEADER} header: expected 1-200 printable characters.",
            param=CONVERSATION_HEADER,
            code="invalid_value",
        )
    return key


async def chat_completions(request: Request) -> Response:
    state = _state(request)
    headers: dict[str, str] = {}
    try:
        tenant = state.auth.tenant_for(request)
        body = validate_chat_request(await read_json_body(request, state.config.general_settings.max_body_bytes))
        target = state.router.resolve(body["model"])
        key = _conversation_key(request)
        background: BackgroundTask | None = None
        prepared: Prepared | None = None
        summarizer: UpstreamSummarizer | None = None
        if state.config.lcm_settings.enabled:
            summarizer = state.summarizer_for(target)
            budget = state.budget_for(target, body)
            started = await state.engine.begin(
                tenant,
                body["messages"],
                budget,
                summarizer,
                conversation_key=key,
                model=body["model"],
                tools_offered=state.offers_recall_tools(target),
            )
            if started.compacting is not None and body.get("stream") and started.request is not None:
                # A streamed request gets its headers at once, and keep-alive comments while it waits.
                headers[CONVERSATION_HEADER] = started.request.conversation.id
                headers["x-lcm-compaction"] = "inline"
                return StreamingResponse(
                    _after_compaction(state, target, body, started, summarizer, tenant),
                    media_type="text/event-stream",
                    headers={**SSE_HEADERS, **headers},
                )
            prepared = await started.finish()
            if prepared.messages is not body["messages"]:
                body = {**body, "messages": prepared.messages}
            if prepared.conversation_id is not None:
                headers[CONVERSATION_HEADER] = prepared.conversation_id
            headers["x-lcm-tokens-sent"] = str(prepared.tokens_sent)
            headers["x-lcm-tokens-forwarded"] = str(prepared.tokens_forwarded)
            headers["x-lcm-compaction"] = prepared.compaction
            # What was actually sent: summaries, summaries and messages that did not fit, recalled excerpts.
            headers["x-lcm-summaries"] = str(len(prepared.sent.summaries))
            headers["x-lcm-evicted"] = str(len(prepared.sent.evicted) + prepared.sent.dropped)
            headers["x-lcm-recalled"] = str(len(prepared.sent.recalled))
            if prepared.compaction in ("scheduled", "deferred"):
                background = BackgroundTask(state.engine.after_response, prepared, summarizer)
        # From here the upstream is busy with a user's request: background summaries there give way to it.
        leave = state.priority.enter(state.priority.key(target))
        try:
            return await _forward(state, target, body, headers, background, prepared, summarizer, tenant, leave)
        except BaseException:
            leave()
            raise
    except ProxyError as error:
        # Once stored, the conversation exists whatever the upstream did: the client still learns its id
        # (and the token figures), so a retry or a look at /lcm/ can name it.
        return error_response(error, headers)


KEEPALIVE_SECONDS = 5.0


async def _after_compaction(
    state: AppState,
    target: ResolvedModel,
    body: ChatBody,
    started: Preparation,
    summarizer: UpstreamSummarizer,
    tenant: str,
) -> AsyncIterator[bytes]:
    """The body of a streamed response whose headers went out before its inline compaction finished: SSE
    comments (ignored by clients) until the context is assembled, then the upstream's stream."""
    finishing = asyncio.ensure_future(started.finish())
    try:
        while not (await asyncio.wait({finishing}, timeout=KEEPALIVE_SECONDS))[0]:
            yield b": lcm-proxy is compacting this conversation\n\n"
        prepared = finishing.result()
        if prepared.messages is not body["messages"]:
            body = {**body, "messages": prepared.messages}
        leave = state.priority.enter(state.priority.key(target))
        try:
            response = await _forward(state, target, body, {}, None, prepared, summarizer, tenant, leave)
        except BaseException:
            leave()
            raise
        assert isinstance(response, StreamingResponse)
        async for chunk in response.body_iterator:
            yield chunk if isinstance(chunk, bytes) else str(chunk).encode()
        if prepared.compaction in ("scheduled", "deferred"):
            await state.engine.after_response(prepared, summarizer)  # a deferred sweep resumes in the background
    except ProxyError as error:
        yield sse_event(error.to_json())
    except Exception:
        log.exception("unexpected error after an inline compaction")
        yield sse_event(InternalError("Internal error in lcm-proxy while streaming.").to_json())
    finally:
        finishing.cancel()  # the compaction itself goes on in the background


async def _forward(
    state: AppState,
    target: ResolvedModel,
    body: ChatBody,
    headers: dict[str, str],
    background: BackgroundTask | None,
    prepared: Prepared | None,
    summarizer: UpstreamSummarizer | None,
    tenant: str,
    leave: Callable[[], None],
) -> Response:
    """Send the request upstream (with the recall loop when offered); ``leave`` runs once the answer is done."""
    # The recall loop answers for one choice: with n > 1 each choice could call tools of its own, so such
    # requests are forwarded without the recall tools.
    recall = prepared is not None and prepared.recall and prepared.conversation_id is not None
    if recall and summarizer is not None and body.get("n") in (None, 1):
        assert prepared is not None and prepared.conversation_id is not None
        return await _with_recall(
            state,
            tenant,
            prepared.conversation_id,
            target,
            body,
            summarizer,
            headers,
            background,
            prepared.room,
            prepared.transcript_length,
            leave,
        )
    if body.get("stream"):
        # Open the upstream stream before answering, so that an early upstream failure becomes a real
        # HTTP status instead of an error event inside a 200.
        stream = await state.upstream.open_stream(target, body)
        relay = _relay(stream, lambda delta: state.learn_tool_calls(target, delta), leave)
        return _streaming(relay, headers, background, leave)
    try:
        result = await state.upstream.complete(target, body)
    finally:
        leave()
    for choice in result.get("choices") or []:
        state.learn_tool_calls(target, choice.get("message") if isinstance(choice, dict) else None)
    return JSONResponse(result, headers=headers, background=background)


def _streaming(
    chunks: AsyncIterator[bytes], headers: dict[str, str], background: BackgroundTask | None, leave: Callable[[], None]
) -> StreamingResponse:
    response = StreamingResponse(
        chunks, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}, background=background
    )
    # The relay ends the request's turn when it finishes; should it never start (the client left before the
    # first byte), the response's collection does.
    weakref.finalize(response, leave)
    return response


async def _with_recall(
    state: AppState,
    tenant: str,
    conversation_id: str,
    target: ResolvedModel,
    body: ChatBody,
    summarizer: UpstreamSummarizer,
    headers: dict[str, str],
    background: BackgroundTask | None,
    room: int,
    transcript_length: int,
    leave: Callable[[], None],
) -> Response:
    """Offer the recall tools and run the tool loop (the client sees one ordinary answer)."""
    window = state.budget_for(target, body)
    result_cap = max(500, (window.window - window.output_reserve) // 4)  # a tool result never floods the window
    # The request's own length bounds what it may recall: a re-send of an earlier point sees no more than it sent.
    scope = await state.recall.scope(tenant, conversation_id, transcript_length)

    async def run_tool(name: str, arguments: str) -> str:
        return clip_to_tokens(await state.recall.run(scope, name, arguments, summarizer), result_cap)

    client_tools = body.get("tools")
    loop = RecallLoop(state.upstream, target, run_tool, state.config.lcm_settings.max_tool_rounds, room)
    offered = with_recall_tools(body)
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = await loop.open_stream(offered, client_tools, include_usage)
        return _streaming(_relay(chunks, None, leave), headers, background, leave)
    try:
        return JSONResponse(await loop.complete(offered, client_tools), headers=headers, background=background)
    finally:
        leave()


async def _relay(
    stream: AsyncIterable[Chunk], on_delta: Callable[[Any], None] | None = None, leave: Callable[[], None] | None = None
) -> AsyncIterator[bytes]:
    """Relay chunks as SSE. After the first byte the status is sent, so errors become an error event.
    ``on_delta`` sees each choice's delta (to learn which models make structured tool calls); ``leave`` runs
    when the stream is over, however it ends."""
    try:
        async for chunk in stream:
            if on_delta is not None:
                for choice in chunk.get("choices") or []:
                    on_delta(choice.get("delta") if isinstance(choice, dict) else None)
            yield sse_event(chunk)
    except ProxyError as error:
        yield sse_event(error.to_json())
        return
    except Exception:
        log.exception("unexpected error while streaming")
        yield sse_event(InternalError("Internal error in lcm-proxy while streaming.").to_json())
        return
    finally:
        if leave is not None:
            leave()
    yield DONE


async def list_models(request: Request) -> Response:
    state = _state(request)
    try:
        state.auth.tenant_for(request)
    except ProxyError as error:
        return error_response(error)
    data = [
        {"id": name, "object": "model", "created": state.started_at, "owned_by": "lcm-proxy"}
        for name in state.router.public_names()
    ]
    return JSONResponse({"object": "list", "data": data})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})
