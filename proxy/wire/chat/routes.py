"""Route handlers: ``/v1/chat/completions``, ``/v1/models``, ``/healthz``.

Handlers translate between HTTP and the layers below and contain no model-specific logic. Every failure
leaves as OpenAI error JSON: ``ProxyError`` with its own status, the engine's errors as ``to_proxy_error``
maps them, anything unexpected as a 500 that OpenAI SDKs are told not to retry (``x-should-retry: false``),
so a proxy bug is not sent three times. The application's exception handlers answer for the handlers here;
only what must add headers (``chat_completions``) or answer inside a stream (the relays) catches them itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy import __version__
from proxy.engine.engine import Budget, Preparation, Prepared
from proxy.engine.errors import ContextTooLong
from proxy.engine.recall import clip_to_tokens
from proxy.errors import InternalError, InvalidRequestError, UpstreamError
from proxy.relay.summarizer import UpstreamSummarizer
from proxy.relay.toolloop import RecallLoop, with_recall_tools
from proxy.scopes import user_scope
from proxy.types import ChatBody, Chunk
from proxy.upstream.errors import describe_upstream, is_context_length_error
from proxy.upstream.rounds import DEFAULT_SOURCE, Round
from proxy.upstream.routing import ResolvedModel
from proxy.wire.auth import request_user
from proxy.wire.chat.validation import validate_chat_request
from proxy.wire.http import REPORTED, JSONResponse, error_response, read_json_body, to_proxy_error
from proxy.wire.sse import DONE, sse_event

if TYPE_CHECKING:
    from proxy.wire.state import AppState


class Answer:
    """The answer the client received, once complete, handed to ``record`` (which stores it as the
    conversation's newest message) before the response ends: once a client has its answer, so has the store."""

    def __init__(self, record: Callable[[Any], Awaitable[None]] | None = None) -> None:
        self.record = record
        self.message: Any = None

    async def keep(self, message: Any) -> None:
        self.message = message
        if self.record is not None:
            await self.record(message)

    async def keep_result(self, result: dict[str, Any]) -> None:
        """A non-streamed answer: kept when it has exactly one choice (with several there is no one answer)."""
        choices = result.get("choices")
        if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
            await self.keep(choices[0].get("message"))


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


@dataclass
class _Call:
    """One chat request on its way through: who asked, for which model, and what the engine made of it."""

    state: AppState
    tenant: str  # the scope: the key's tenant, or an end user within it (``proxy.wire.auth``)
    target: ResolvedModel
    body: ChatBody  # as the client sent it
    key: str | None
    asked_at: float  # when the request arrived: of several answers to one transcript, the latest asked stays
    gone: Callable[[], Awaitable[bool]] | None = None  # whether the client hung up (``Request.is_disconnected``)
    summarizer: UpstreamSummarizer | None = None
    budget: Budget | None = None

    async def begin(self, budget: Budget) -> Preparation:
        return await self.state.engine.begin(
            self.tenant,
            self.body["messages"],
            budget,
            self.summarizer,
            conversation_key=self.key,
            model=self.body["model"],
            tools_offered=self.state.policy.offers_recall_tools(self.target),
        )

    def after(self, prepared: Prepared | None) -> BackgroundTask | None:
        """The compaction the request calls for, once its response is sent."""
        if prepared is None or prepared.compaction not in ("scheduled", "deferred"):
            return None
        return BackgroundTask(self.state.engine.after_response, prepared, self.summarizer)

    def answer(self, prepared: Prepared | None, body: ChatBody) -> Answer | None:
        """Where the relayed answer goes: the request's stored conversation, when there is one answer."""
        if prepared is None or prepared.conversation_id is None or body.get("n") not in (None, 1):
            return None
        engine, tenant = self.state.engine, self.tenant

        async def record(message: Any) -> None:
            if self.gone is not None and await self.gone():
                # Nobody received it: storing it would put an answer in the conversation that its client never
                # saw (the client's retry, or its next request, carries the one it did see).
                log.info("the answer of %s was not stored: the client hung up", prepared.conversation_id)
                return
            try:
                await engine.record_answer(tenant, prepared, message, self.asked_at)
            except Exception as error:  # the client gets its answer anyway; its next request stores it
                log.warning(
                    "the relayed answer of %s was not stored: %s", prepared.conversation_id, type(error).__name__
                )

        return Answer(record)


def _prepared_headers(prepared: Prepared, headers: dict[str, str]) -> None:
    if prepared.conversation_id is not None:
        headers[CONVERSATION_HEADER] = prepared.conversation_id
    headers["x-lcm-tokens-sent"] = str(prepared.tokens_sent)
    headers["x-lcm-tokens-forwarded"] = str(prepared.tokens_forwarded)
    headers["x-lcm-compaction"] = prepared.compaction
    # What was actually sent: summaries, summaries and messages that did not fit, recalled excerpts.
    headers["x-lcm-summaries"] = str(len(prepared.sent.summaries))
    headers["x-lcm-evicted"] = str(len(prepared.sent.evicted) + prepared.sent.dropped)
    headers["x-lcm-recalled"] = str(len(prepared.sent.recalled))


async def chat_completions(request: Request) -> Response:
    state = _state(request)
    headers: dict[str, str] = {}
    # When the request arrived, before its body: a slow upload abandoned for a retry must not count as the
    # later of the two (its answer would replace the one the client got).
    arrived = time.time()
    try:
        tenant = state.auth.tenant_for(request)
        settings = state.config.general_settings
        body = validate_chat_request(await read_json_body(request, settings.max_body_bytes, settings.body_read_timeout))
        scope = user_scope(tenant, request_user(request, body.get("user")))  # the end user's, when it names one
        call = _Call(state, scope, state.router.resolve(body["model"]), body, _conversation_key(request), arrived)
        call.gone = request.is_disconnected
        prepared: Prepared | None = None
        if state.config.lcm_settings.enabled:
            await state.upstream.windows.ready(call.target)  # the server's own window, when it is being asked
            call.summarizer = state.policy.summarizer_for(call.target)
            call.budget = state.policy.budget_for(call.target, body)
            try:
                started = await call.begin(call.budget)
            except ContextTooLong as error:
                if error.conversation_id is not None:
                    headers[CONVERSATION_HEADER] = error.conversation_id
                raise
            if started.compacting is not None and body.get("stream") and started.request is not None:
                # A streamed request waits a moment for its inline compaction, so that a short one still sends
                # every header; past that it gets the headers known now, keep-alive comments while it waits, and
                # the final figures in an SSE comment before its first chunk (``_after_compaction``).
                finishing = asyncio.ensure_future(started.finish())
                finishing.add_done_callback(_retrieved)  # a body never iterated does not leave its error unread
                if not await _finished_within(finishing, STREAM_HEADER_GRACE_SECONDS):
                    headers[CONVERSATION_HEADER] = started.request.conversation.id
                    headers["x-lcm-tokens-sent"] = str(started.request.ingested.tokens_sent)
                    headers["x-lcm-compaction"] = "inline"
                    return StreamingResponse(
                        _after_compaction(call, finishing),
                        media_type="text/event-stream",
                        headers={**SSE_HEADERS, **headers},
                    )
                prepared = finishing.result()
            else:
                prepared = await started.finish()
            _prepared_headers(prepared, headers)
        try:
            return await _forward(call, prepared, headers)
        except UpstreamError as error:
            retry = await _compacted_retry(call, prepared, error)
            if retry is None:
                raise
            _prepared_headers(retry, headers)
            return await _forward(call, retry, headers)
    except REPORTED as error:
        # Once stored, the conversation exists whatever the upstream did: the client still learns its id
        # (and the token figures), so a retry or a look at /lcm/ can name it.
        return error_response(to_proxy_error(error), headers)


CONTEXT_RETRY_SHARE = 0.75  # of what was refused, for the one retry when the refusal did not state the window


async def _compacted_retry(call: _Call, prepared: Prepared | None, error: UpstreamError) -> Prepared | None:
    """The upstream said the context is too long although it fit the proxy's count (a tokenizer that counts
    higher, a server started with a smaller window than configured): compact to a smaller budget and try once
    more. A refusal that stated the server's window taught it (``proxy.upstream.windows``): the retry, and every later
    request, is budgeted for that window. Otherwise the retry gets three quarters of what was refused. None
    when there is nothing to retry."""
    if prepared is None or prepared.conversation_id is None or call.budget is None:
        return None
    if not is_context_length_error(error):
        return None
    before = call.budget
    if error.deployment is not None:  # the server's count of what it refused, against the proxy's
        counted = prepared.tokens_forwarded + before.tools
        call.state.upstream.windows.learn_margin(error.deployment, error.message, counted)
    budget = call.state.policy.budget_for(call.target, call.body)
    if budget.window >= before.window and budget.margin <= before.margin:
        # Three quarters of what the server refused, turned back into a window (never above the old one).
        refused = before.output_reserve + prepared.tokens_forwarded * before.margin + before.tools
        budget = replace(before, window=int(min(before.window, refused) * CONTEXT_RETRY_SHARE))
    log.warning(
        "the upstream of model %s refused %d tokens as too long for its context: compacting to a window of %d (%s), "
        "token margin %g, and retrying once",
        call.target.alias,
        prepared.tokens_forwarded,
        budget.window,
        budget.window_source if budget.window_source != before.window_source else "set model_info.max_input_tokens",
        budget.margin,
    )
    call.budget = budget
    try:
        return await (await call.begin(budget)).finish()
    except ContextTooLong:
        return None  # not even the newest message fits the smaller budget: the upstream's own error stands


KEEPALIVE_SECONDS = 5.0
# How long a streamed request waits for its inline compaction before sending its headers: a compaction done by
# then sends every X-LCM header; a longer one sends its figures in an SSE comment (``figures_comment``).
STREAM_HEADER_GRACE_SECONDS = 1.0


async def _finished_within(task: asyncio.Future[Prepared], seconds: float) -> bool:
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()  # the compaction itself goes on in the background
        raise
    return bool(done)


def _retrieved(task: asyncio.Future[Prepared]) -> None:
    if not task.cancelled():
        task.exception()


def figures_comment(prepared: Prepared) -> bytes:
    """The X-LCM figures a stream's headers could not carry (they went out before its inline compaction was
    done), as one SSE comment block: a ``: name: value`` line each, which SSE clients (the OpenAI SDKs among
    them) ignore."""
    figures: dict[str, str] = {}
    _prepared_headers(prepared, figures)
    return "".join(f": {name}: {value}\n" for name, value in figures.items()).encode() + b"\n"


async def _after_compaction(call: _Call, finishing: asyncio.Future[Prepared]) -> AsyncIterator[bytes]:
    """The body of a streamed response whose headers went out before its inline compaction finished: SSE
    comments (ignored by clients) until the context is assembled, then the final figures (``figures_comment``),
    then the upstream's stream."""
    prepared: Prepared | None = None
    try:
        while not (await asyncio.wait({finishing}, timeout=KEEPALIVE_SECONDS))[0]:
            yield b": lcm-proxy is compacting this conversation\n\n"
        prepared = finishing.result()
        try:
            response = await _forward(call, prepared, {})
        except UpstreamError as error:
            retry = await _compacted_retry(call, prepared, error)
            if retry is None:
                raise
            prepared = retry
            response = await _forward(call, prepared, {})
        assert isinstance(response, StreamingResponse)
        told, prepared = prepared, None
        yield figures_comment(told)
        async for chunk in response.body_iterator:
            yield chunk if isinstance(chunk, bytes) else str(chunk).encode()
        if response.background is not None:
            await response.background()  # a deferred sweep resumes in the background
    except REPORTED as error:
        if prepared is not None:  # as a non-streamed error response's headers carry them
            yield figures_comment(prepared)
        yield sse_event(to_proxy_error(error).to_json())
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error after an inline compaction")
        yield sse_event(InternalError("Internal error in lcm-proxy while streaming.").to_json())
    finally:
        finishing.cancel()  # the compaction itself goes on in the background


async def _forward(call: _Call, prepared: Prepared | None, headers: dict[str, str]) -> Response:
    """Send the request upstream (with the recall loop when offered). From here the upstream is busy with a
    user's request: background summaries there give way to it until the answer is done."""
    state, target = call.state, call.target
    body = call.body
    if prepared is not None and prepared.messages is not body["messages"]:
        body = {**body, "messages": prepared.messages}
    single = body.get("n") in (None, 1)
    answer = call.answer(prepared, body)
    background = call.after(prepared)
    leave = state.priority.enter(state.priority.key(target))
    try:
        # The recall loop answers for one choice: with n > 1 each choice could call tools of its own, so such
        # requests are forwarded without the recall tools.
        recall = prepared is not None and prepared.recall and prepared.conversation_id is not None
        if recall and call.summarizer is not None and single:
            assert prepared is not None
            return await _with_recall(call, prepared, body, headers, background, leave, answer)
        if body.get("stream"):
            # Open the upstream stream before answering, so that an early upstream failure becomes a real
            # HTTP status instead of an error event inside a 200.
            stream = await state.upstream.open_stream(target, body)
            relay = _relay(
                stream,
                lambda delta: state.policy.learn_tool_calls(target, delta),
                leave,
                answer,
                describe_upstream(target),
            )
            return _streaming(relay, headers, background, leave)
        try:
            result = await state.upstream.complete(target, body)
        finally:
            leave()
        for choice in result.get("choices") or []:
            state.policy.learn_tool_calls(target, choice.get("message") if isinstance(choice, dict) else None)
        if answer is not None:
            await answer.keep_result(result)
        return JSONResponse(result, headers=headers, background=background)
    except BaseException:
        leave()
        raise


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
    call: _Call,
    prepared: Prepared,
    body: ChatBody,
    headers: dict[str, str],
    background: BackgroundTask | None,
    leave: Callable[[], None],
    answer: Answer | None,
) -> Response:
    """Offer the recall tools and run the tool loop (the client sees one ordinary answer)."""
    state, target = call.state, call.target
    assert prepared.conversation_id is not None and call.summarizer is not None
    summarizer = call.summarizer
    window = state.policy.budget_for(target, body)
    result_cap = max(500, (window.window - window.output_reserve) // 4)  # a tool result never floods the window
    # The request's own length bounds what it may recall: a re-send of an earlier point sees no more than it sent.
    scope = await state.recall.scope(call.tenant, prepared.conversation_id, prepared.transcript_length)

    async def run_tool(name: str, arguments: str) -> str:
        return clip_to_tokens(await state.recall.run(scope, name, arguments, summarizer), result_cap)

    client_tools = body.get("tools")
    loop = RecallLoop(state.upstream, target, run_tool, state.config.lcm_settings.max_tool_rounds, prepared.room)
    offered = with_recall_tools(body)
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = await loop.open_stream(offered, client_tools, include_usage)
        relay = _relay(chunks, None, leave, answer, describe_upstream(target))
        return _streaming(relay, headers, background, leave)
    try:
        result = await loop.complete(offered, client_tools)
    finally:
        leave()
    if answer is not None:
        await answer.keep_result(result)
    return JSONResponse(result, headers=headers, background=background)


async def _relay(
    stream: AsyncIterable[Chunk],
    on_delta: Callable[[Any], None] | None = None,
    leave: Callable[[], None] | None = None,
    answer: Answer | None = None,
    source: str = DEFAULT_SOURCE,
) -> AsyncIterator[bytes]:
    """Relay chunks as SSE. After the first byte the status is sent, so errors become an error event.
    ``on_delta`` sees each choice's delta (to learn which models make structured tool calls); ``leave`` runs
    when the stream is over, however it ends; ``answer`` keeps what the client received when the stream
    reached its end, before ``[DONE]``. Every chunk is read as the recall loop reads it (``source`` names the
    upstream): an answer the ``Round`` finds malformed (two calls under one id, a call without a name) ends
    with ``upstream_bad_stream`` in place of the chunk that showed it, as it is a 502 when not streamed."""
    collected = Round(source)
    try:
        async for chunk in stream:
            if on_delta is not None:
                for choice in chunk.get("choices") or []:
                    on_delta(choice.get("delta") if isinstance(choice, dict) else None)
            collected.add(chunk)
            yield sse_event(chunk)
    except REPORTED as error:
        yield sse_event(to_proxy_error(error).to_json())
        return
    except Exception:
        log.exception("unexpected error while streaming")
        yield sse_event(InternalError("Internal error in lcm-proxy while streaming.").to_json())
        return
    finally:
        if leave is not None:
            leave()
    if answer is not None and collected.finish_reason is not None:
        await answer.keep(collected.message())
    yield DONE


async def list_models(request: Request) -> Response:
    state = _state(request)
    state.auth.tenant_for(request)  # an AuthenticationError is answered by the application's handler
    data = [
        {"id": name, "object": "model", "created": state.started_at, "owned_by": "lcm-proxy"}
        for name in state.router.public_names()
    ]
    return JSONResponse({"object": "list", "data": data})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})
