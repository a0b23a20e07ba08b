"""The chat door's route: ``/v1/chat/completions`` (``proxy.wire.chat.forward`` takes a request upstream).

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
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.engine.engine import Prepared
from proxy.engine.errors import ContextTooLong
from proxy.errors import InternalError, InvalidRequestError, UpstreamError
from proxy.relay.turn import CONVERSATION_HEADER, Call, compacted_retry, prepared_headers
from proxy.scopes import user_scope
from proxy.wire.auth import request_user
from proxy.wire.chat.answer import SSE_HEADERS
from proxy.wire.chat.forward import forward
from proxy.wire.chat.validation import fingerprint, validate_chat_request
from proxy.wire.http import REPORTED, error_response, read_json_body, to_proxy_error
from proxy.wire.sse import sse_event
from proxy.wire.streaming import ClosingStream, aclose_iterator

if TYPE_CHECKING:
    from proxy.wire.state import AppState


log = logging.getLogger("lcm_proxy.wire")


def _state(request: Request) -> AppState:
    return request.app.state.lcm  # type: ignore[no-any-return]


def _conversation_key(request: Request) -> str | None:
    conversation_key = request.headers.get(CONVERSATION_HEADER)
    if conversation_key is None:
        return None
    conversation_key = conversation_key.strip()
    if not conversation_key or len(conversation_key) > 200 or not conversation_key.isprintable():
        raise InvalidRequestError(
            f"Invalid {CONVERSATION_HEADER} header: expected 1-200 printable characters.",
            param=CONVERSATION_HEADER,
            code="invalid_value",
        )
    return conversation_key


async def chat_completions(request: Request) -> Response:
    state = _state(request)
    headers: dict[str, str] = {}
    # When the request arrived, before its body: a slow upload abandoned for a retry must not count as the
    # later of the two (its answer would replace the one the client got).
    arrived = time.time()
    try:
        tenant = state.auth.tenant_for(request)
        settings = state.config.general_settings
        raw = await read_json_body(request, settings.max_body_bytes, settings.body_read_timeout)
        length = request.headers.get("content-length", "")
        size = int(length) if length.isdigit() else 0
        # The messages this tenant sent before are not checked again (a large body is measured off the loop).
        seen = await fingerprint(state.engine.seen, tenant, raw, size)
        body = validate_chat_request(raw, seen)
        scope = user_scope(tenant, request_user(request, body.get("user")))  # the end user's, when it names one
        call = Call(state, scope, state.router.resolve(body["model"]), body, _conversation_key(request), arrived)
        call.seen = seen
        call.gone = request.is_disconnected
        prepared: Prepared | None = None
        if state.config.lcm_settings.enabled:
            await state.upstream.windows.ready(call.target)  # the server's own window, when it is being asked
            budget = call.plan()
            try:
                started = await call.begin(budget)
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
                    return ClosingStream(
                        _after_compaction(call, finishing),
                        media_type="text/event-stream",
                        headers={**SSE_HEADERS, **headers},
                    )
                prepared = finishing.result()
            else:
                prepared = await started.finish()
            prepared_headers(prepared, headers)
        try:
            return await forward(call, prepared, headers)
        except UpstreamError as error:
            retry = await compacted_retry(call, prepared, error)
            if retry is None:
                raise
            prepared_headers(retry, headers)
            return await forward(call, retry, headers)
    except REPORTED as error:
        # Once stored, the conversation exists whatever the upstream did: the client still learns its id
        # (and the token figures), so a retry or a look at /lcm/ can name it.
        return error_response(to_proxy_error(error), headers)


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
    prepared_headers(prepared, figures)
    return "".join(f": {name}: {value}\n" for name, value in figures.items()).encode() + b"\n"


async def _after_compaction(call: Call, finishing: asyncio.Future[Prepared]) -> AsyncIterator[bytes]:
    """The body of a streamed response whose headers went out before its inline compaction finished: SSE
    comments (ignored by clients) until the context is assembled, then the final figures (``figures_comment``),
    then the upstream's stream."""
    prepared: Prepared | None = None
    try:
        while not (await asyncio.wait({finishing}, timeout=KEEPALIVE_SECONDS))[0]:
            yield b": lcm-proxy is compacting this conversation\n\n"
        prepared = finishing.result()
        try:
            response = await forward(call, prepared, {})
        except UpstreamError as error:
            retry = await compacted_retry(call, prepared, error)
            if retry is None:
                raise
            prepared = retry
            response = await forward(call, prepared, {})
        assert isinstance(response, StreamingResponse)
        told, prepared = prepared, None
        yield figures_comment(told)
        try:
            async for chunk in response.body_iterator:
                yield chunk if isinstance(chunk, bytes) else str(chunk).encode()
        finally:
            await aclose_iterator(response.body_iterator)  # closed early (the client left): the upstream's too
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
