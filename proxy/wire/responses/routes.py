"""The Responses door: ``POST /v1/responses`` (stream and not) and ``GET /v1/responses/{id}``, for OpenAI's
SDKs and Codex.

A request is validated (``validation``); its items are put together: a ``previous_response_id`` chain's items
first (``issued``), then a compaction checkpoint expanded back into the stored messages it stands for
(``expand``); it is named (``codex.conversation_key``), prepared by the engine as one turn
(``proxy.relay.turn``) in the Responses dialect and sent (``calls``). Codex's own compactions, local and
remote, are answered here from the stored conversation, with no model call. Every failure is OpenAI's error
shape; once a stream has started, a ``response.failed`` event.

Streams are relayed event by event, renumbered and under the proxy's response id (``stream``). When the
upstream has not answered within ``PING_AFTER`` seconds (a local model reading a long prompt), the stream starts
with the proxy's own events until it does (``stream.late``).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from proxy import tokens
from proxy.dialects.responses import RESPONSES
from proxy.engine.engine import Prepared
from proxy.engine.errors import ContextTooLong
from proxy.errors import InvalidRequestError, NotFoundError
from proxy.relay.turn import Call, prepared_headers
from proxy.scopes import user_scope
from proxy.types import Message, Messages
from proxy.wire.auth import request_user
from proxy.wire.http import REPORTED, JSONResponse, compaction_after, error_response, read_json_body, to_proxy_error
from proxy.wire.responses import codex
from proxy.wire.responses.calls import client_headers
from proxy.wire.responses.events import Numbering, shell, sse, whole
from proxy.wire.responses.issued import Issued
from proxy.wire.responses.stream import Guarded, failed_stream, late, relay, streaming
from proxy.wire.responses.turn import Turn, expand
from proxy.wire.responses.validation import validate_request

if TYPE_CHECKING:
    from proxy.wire.state import AppState

PING_AFTER = 5.0
DIGEST_TOKENS = 8000  # the most a digest answering Codex's local compaction takes


def _state(request: Request) -> AppState:
    return request.app.state.lcm  # type: ignore[no-any-return]


async def create_response(request: Request) -> Response:
    state = _state(request)
    headers: dict[str, str] = {}
    arrived = time.time()
    body: dict[str, Any] = {}
    try:
        tenant = state.auth.tenant_for(request)
        settings = state.config.general_settings
        body = validate_request(await read_json_body(request, settings.max_body_bytes, settings.body_read_timeout))
        scope = user_scope(tenant, request_user(request, body.get("user")))
        target = state.router.resolve(body["model"])
        issued = Issued(state.engine.store, state.engine.history)
        own: Messages = body["input"]
        previous = body.get("previous_response_id")
        items = [*(await issued.chain(scope, previous)), *own] if previous else own
        key = codex.conversation_key(request.headers, body)
        reserved = tokens.count_text(body["instructions"]) if body.get("instructions") else 0
        call = Call(
            state, scope, target, body, key, arrived, dialect=RESPONSES, messages=items, recall_tools=False,
            reserved=reserved,
        )  # fmt: skip
        call.gone = request.is_disconnected
        call.link_key = codex.parent_key(request.headers)
        lcm = state.config.lcm_settings.enabled
        if lcm:  # with LCM off, a compaction item is the upstream's own, and the upstream's to judge
            call.messages = await expand(call, issued, items)
        if not call.transcript:
            raise InvalidRequestError("Invalid 'input': expected at least one item.", param="input")
        native = state.upstream.speaks_responses(target)
        turn = Turn(call, native, client_headers(request.headers), issued, own)
        if lcm and codex.is_trigger(call.transcript):
            return await _answer_compaction(turn, headers, remote=True)
        if lcm and codex.is_local_compaction(request.headers, call.transcript) and len(call.transcript) > 1:
            return await _answer_compaction(turn, headers, remote=False)
        prepared: Prepared | None = None
        if lcm:
            await state.upstream.windows.ready(target)
            prepared = await call.prepare(headers)
        return await _forward(turn, prepared, headers)
    except ContextTooLong as error:
        if body.get("stream"):
            return failed_stream(body, to_proxy_error(error), headers)
        return error_response(to_proxy_error(error), headers)
    except REPORTED as error:
        return error_response(to_proxy_error(error), headers)


async def _forward(turn: Turn, prepared: Prepared | None, headers: dict[str, str]) -> Response:
    call = turn.call
    state = call.state
    leave = state.priority.enter(state.priority.key(call.target))
    if not call.body.get("stream"):
        try:
            result, prepared = await turn.complete(prepared)
        finally:
            leave()
        response = await turn.finished(result, prepared)
        return JSONResponse(response, headers=headers, background=compaction_after(call, prepared))
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

        async def release() -> None:
            try:
                await opened.close()
            finally:
                leave()

        body = Guarded(relay(turn, opened, prepared, leave), release)
        return streaming(body, headers, compaction_after(call, prepared))

    async def abandon() -> None:
        opening.cancel()
        try:
            if opening.done() and not opening.cancelled() and opening.exception() is None:
                await opening.result()[0].close()
        finally:
            leave()

    return streaming(Guarded(late(turn, opening, leave), abandon), headers, compaction_after(call, prepared))


# --- Codex's own compaction --------------------------------------------------------------------------------


async def _answer_compaction(turn: Turn, headers: dict[str, str], remote: bool) -> Response:
    """Codex's compaction answered from the stored conversation, with no model call: remotely one ``compaction``
    item holding a checkpoint handle, locally a summary message (the digest and the checkpoint's marker). The
    conversation is brought up to date first (the trigger or the compaction prompt is not part of it)."""
    call = turn.call
    items = call.transcript
    call.messages = items[:-1]
    prepared = await call.prepare(headers)
    if prepared.conversation_id is None:
        if remote:
            raise InvalidRequestError(
                "lcm-proxy stores no conversation for this request, so it cannot compact it.", param="input"
            )
        call.messages = items
        return await _forward(turn, await call.prepare(headers), headers)
    handle = await turn.issued.checkpoint(call.scope, prepared.conversation_id, prepared.transcript_length)
    if remote:
        item: Message = {"type": "compaction", "id": "cmp_" + secrets.token_hex(24), "encrypted_content": handle}
        output_tokens = 0
    else:
        room = min(int(call.body.get("max_output_tokens") or DIGEST_TOKENS), DIGEST_TOKENS)
        text = codex.summary_text(await call.state.engine.digest(call.scope, prepared.conversation_id, room), handle)
        content = [{"type": "output_text", "text": text, "annotations": []}]
        item = {"type": "message", "id": "msg_" + secrets.token_hex(24), "status": "completed", "role": "assistant",
                "content": content}  # fmt: skip
        output_tokens = tokens.count_text(text)
    usage = {
        "input_tokens": prepared.tokens_forwarded, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prepared.tokens_forwarded + output_tokens,
    }  # fmt: skip
    response = {**shell(turn.id, turn.model, call.body, "completed"), "output": [item], "usage": usage}
    if turn.stores:
        await turn.issued.save(call.scope, response, turn.saved(prepared))
    headers["x-lcm-client-compaction"] = "answered"
    background = compaction_after(call, prepared)
    if not call.body.get("stream"):
        return JSONResponse(response, headers=headers, background=background)
    numbering = Numbering(turn.id, turn.model)

    async def events() -> AsyncIterator[bytes]:
        for data in whole(response, call.body):
            yield sse(numbering(data))

    return streaming(events(), headers, background)


# --- stored responses and the WebSocket probe -------------------------------------------------------------


async def get_response(request: Request) -> Response:
    state = _state(request)
    try:
        tenant = state.auth.tenant_for(request)
        scope = user_scope(tenant, request_user(request))
        wanted = request.path_params["response_id"]
        issued = Issued(state.engine.store, state.engine.history)
        found = await issued.stored(scope, wanted) if len(wanted) <= 200 else None
        if found is None:
            raise NotFoundError(f"Response with id '{wanted[:100]}' not found.", param="response_id")
        return JSONResponse(found)
    except REPORTED as error:
        return error_response(to_proxy_error(error))


async def no_websocket(websocket: WebSocket) -> None:
    """Responses over a WebSocket is not served: the upgrade is refused with a 426 (a 401 without a valid key),
    after which Codex uses HTTP requests at once (FIELD-NOTES; a 404 or 405 costs it one to seven more
    attempts, a 400 fails its turn)."""
    await websocket.send_denial_response(_upgrade_refused(websocket))


async def no_upgrade(request: Request) -> Response:
    """``GET /v1/responses`` without an upgrade the server took for one: the same answer."""
    return _upgrade_refused(request)


def _upgrade_refused(connection: HTTPConnection) -> Response:
    try:
        connection.app.state.lcm.auth.caller(connection)
    except REPORTED as error:
        return error_response(to_proxy_error(error))
    return JSONResponse(
        {"error": {"message": "lcm-proxy serves the Responses API over HTTP only: set supports_websockets = false.",
                   "type": "invalid_request_error", "param": None, "code": "websocket_not_supported"}},
        status_code=426,
        headers={"upgrade": "websocket", "connection": "close"},
    )  # fmt: skip


RESPONSES_ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses", no_upgrade, methods=["GET"]),
    WebSocketRoute("/v1/responses", no_websocket),
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
]
