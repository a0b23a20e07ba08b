"""The Responses door: ``POST /v1/responses`` (stream and not) and ``GET /v1/responses/{id}``, for OpenAI's
SDKs and Codex.

A request is validated (``validation``); its items are put together: a ``previous_response_id`` chain's items
first (``issued``), then a compaction checkpoint expanded back into the stored messages it stands for
(``expand``); it is named (``codex.conversation_key``), prepared by the engine as one turn
(``proxy.relay.turn``) in the Responses dialect and sent (``calls``). Codex's own compactions, local and
remote, are answered here from the stored conversation, with no model call. Every failure is OpenAI's error
shape; once a stream has started, a ``response.failed`` event.

Streams are relayed event by event, renumbered and under the proxy's response id (``events``). When the
upstream has not answered within ``PING_AFTER`` seconds (a local model reading a long prompt), the stream starts
with the proxy's own ``response.created`` and a ``response.in_progress`` every ``PING_SECONDS`` (Codex gives up
on a stream with no event for 300 s); the upstream's own opening events are then not relayed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from proxy import tokens
from proxy.dialects.responses import RESPONSES
from proxy.engine.engine import Prepared
from proxy.engine.errors import ContextTooLong
from proxy.errors import InternalError, InvalidRequestError, NotFoundError, UpstreamError
from proxy.relay.turn import CONVERSATION_HEADER, Call, compacted_retry, prepared_headers
from proxy.scopes import user_scope
from proxy.types import Message, Messages
from proxy.wire.auth import request_user
from proxy.wire.http import REPORTED, JSONResponse, error_response, read_json_body, to_proxy_error
from proxy.wire.responses import codex
from proxy.wire.responses.calls import Opened, client_headers, complete, open_stream, upstream_body
from proxy.wire.responses.events import ENDINGS, Numbering, Output, failure, shell, sse, whole
from proxy.wire.responses.issued import Issued, Saved, foreign, response_id
from proxy.wire.responses.validation import validate_request
from proxy.wire.streaming import ClosingStream

if TYPE_CHECKING:
    from proxy.wire.state import AppState

log = logging.getLogger("lcm_proxy.wire")

PING_AFTER = 5.0
PING_SECONDS = 10.0
DIGEST_TOKENS = 8000  # the most a digest answering Codex's local compaction takes
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _state(request: Request) -> AppState:
    return request.app.state.lcm  # type: ignore[no-any-return]


async def expand(call: Call, issued: Issued, items: Messages) -> Messages:
    """``items`` with their newest checkpoint (Codex's compaction item, or a summary ending in the proxy's marker)
    and what Codex kept before it replaced by the stored messages it stands for. A compaction item the proxy did
    not issue to this scope is refused (it must never reach an upstream); a marker that names nothing the
    scope was given is only text, and the search goes on to older items."""
    for found in codex.checkpoints(items):
        where = f"input[{found.at}].encrypted_content"
        point = await issued.point(call.scope, found.handle)
        history = await call.state.engine.history(call.scope, *point) if point is not None else None
        if history is not None:
            return codex.rebuilt(items, found, history)
        if found.item:
            raise foreign(where)
    return items


class Turn:
    """One Responses request between the door and the upstream."""

    def __init__(self, call: Call, native: bool, headers: dict[str, str], issued: Issued, own: Messages) -> None:
        self.call = call
        self.native = native  # the deployment speaks Responses (else it gets Chat Completions)
        self.headers = headers  # the client headers a Responses upstream receives
        self.issued = issued
        self.own = own  # the request's own input items (what a stored response keeps)
        self.id = response_id()
        self.model = str(call.body["model"])

    @property
    def stores(self) -> bool:
        return self.call.body.get("store") is not False

    def shift(self, prepared: Prepared | None) -> int:
        if prepared is None or self.call.state.config.lcm_settings.client_usage != "client":
            return 0
        return max(0, prepared.tokens_sent - prepared.tokens_forwarded)

    def out(self, prepared: Prepared | None) -> dict[str, Any]:
        return upstream_body(self.call.body, prepared.messages if prepared is not None else self.call.transcript)

    async def finished(self, response: dict[str, Any], prepared: Prepared | None) -> dict[str, Any]:
        """The response as the client gets it, stored and recorded."""
        body = self.call.body
        response = {**response, "id": self.id, "model": self.model, "store": self.stores}
        response["previous_response_id"] = body.get("previous_response_id")
        shift = self.shift(prepared)
        usage = response.get("usage")
        if shift and isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
            response["usage"] = {**usage, "input_tokens": usage["input_tokens"] + shift}
        if response.get("status") == "completed":
            output = [i for i in response.get("output") or [] if isinstance(i, dict)]
            record = self.call.answer_to(prepared)
            if record is not None and len(output) == 1:  # one item: the conversation's next message
                await record(output[0])
        if self.stores:
            await self.issued.save(self.call.scope, response, self.saved(prepared))
        return response

    def saved(self, prepared: Prepared | None) -> Saved:
        """Where the stored response's input is: its conversation's messages, or its own items."""
        items = self.call.transcript
        start = RESPONSES.instruction_count(items)
        previous = self.call.body.get("previous_response_id")
        if prepared is None or prepared.conversation_id is None:
            return Saved(None, 0, [], self.own, previous)
        return Saved(prepared.conversation_id, prepared.transcript_length, items[:start], [], previous)

    async def complete(self, prepared: Prepared | None) -> tuple[dict[str, Any], Prepared | None]:
        state, target = self.call.state, self.call.target
        try:
            return await complete(state, target, self.out(prepared), self.headers, self.native, self.id), prepared
        except UpstreamError as error:
            retry = await compacted_retry(self.call, prepared, error)
            if retry is None:
                raise
            return await complete(state, target, self.out(retry), self.headers, self.native, self.id), retry

    async def open(self, prepared: Prepared | None) -> tuple[Opened, Prepared | None]:
        state, target = self.call.state, self.call.target
        try:
            return await open_stream(state, target, self.out(prepared), self.headers, self.native, self.id), prepared
        except UpstreamError as error:
            retry = await compacted_retry(self.call, prepared, error)
            if retry is None:
                raise
            return await open_stream(state, target, self.out(retry), self.headers, self.native, self.id), retry


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
            prepared = await _prepare(call, headers)
        return await _forward(turn, prepared, headers)
    except ContextTooLong as error:
        if body.get("stream"):
            return _failed_stream(body, to_proxy_error(error), headers)
        return error_response(to_proxy_error(error), headers)
    except REPORTED as error:
        return error_response(to_proxy_error(error), headers)


async def _prepare(call: Call, headers: dict[str, str]) -> Prepared:
    budget = call.plan()
    try:
        prepared = await (await call.begin(budget)).finish()
    except ContextTooLong as error:
        if error.conversation_id is not None:
            headers[CONVERSATION_HEADER] = error.conversation_id
        raise
    prepared_headers(prepared, headers)
    return prepared


def _background(call: Call, prepared: Prepared | None) -> BackgroundTask | None:
    compact = call.after(prepared)
    return BackgroundTask(compact) if compact is not None else None


def _streaming(body: AsyncIterator[bytes], headers: dict[str, str], background: BackgroundTask | None) -> Response:
    return ClosingStream(
        body, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}, background=background
    )


def _failed_stream(request: dict[str, Any], error: Any, headers: dict[str, str]) -> Response:
    """A stream that ends at once in ``response.failed`` (Codex reads a context that cannot fit from it)."""
    numbering = Numbering(response_id(), str(request.get("model", "")))

    async def events() -> AsyncIterator[bytes]:
        response = shell(numbering.response_id, numbering.model, request)
        yield sse(numbering({"type": "response.created", "response": response}))
        failed = {**response, "status": "failed", "error": failure(error)}
        yield sse(numbering({"type": "response.failed", "response": failed}))

    return _streaming(events(), headers, None)


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
        return JSONResponse(response, headers=headers, background=_background(call, prepared))
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
        return _streaming(_relay(turn, opened, prepared, leave), headers, _background(call, prepared))
    return _streaming(_late(turn, opening, leave), headers, _background(call, prepared))


async def _relay(
    turn: Turn, opened: Opened, prepared: Prepared | None, leave: Callable[[], None], numbering: Numbering | None = None
) -> AsyncIterator[bytes]:
    """The upstream's events, renumbered under the proxy's id; the answer stored once the stream completed.
    With ``numbering`` the proxy's own opening events went out already: the upstream's are not relayed."""
    late = numbering is not None
    numbering = numbering or Numbering(turn.id, turn.model)
    output = Output()
    try:
        async for data in opened.events:
            output.feed(data)
            if late and data.get("type") in ("response.created", "response.in_progress"):
                continue
            if data.get("type") in ENDINGS:
                break
            yield sse(numbering(data))
        final = output.response()
        if final is None:
            cut = UpstreamError("The upstream's stream ended before its response.completed: the answer is incomplete.")
            yield _failed(numbering, turn, cut)
            return
        kind_ = "response.completed" if final.get("status", "completed") == "completed" else "response.incomplete"
        if final.get("status") == "failed":
            kind_ = "response.failed"
        final = await turn.finished(final, prepared)
        yield sse(numbering({"type": kind_, "response": final}))
    except REPORTED as error:
        yield _failed(numbering, turn, to_proxy_error(error))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error while relaying a Responses stream")
        yield _failed(numbering, turn, InternalError("Internal error in lcm-proxy while streaming."))
    finally:
        try:
            await opened.close()
        finally:
            leave()


def _failed(numbering: Numbering, turn: Turn, error: Any) -> bytes:
    response = {**shell(turn.id, turn.model, turn.call.body, "failed"), "error": failure(error)}
    return sse(numbering({"type": "response.failed", "response": response}))


async def _late(turn: Turn, opening: asyncio.Future[Any], leave: Callable[[], None]) -> AsyncIterator[bytes]:
    numbering = Numbering(turn.id, turn.model)
    relayed = False
    try:
        start = shell(turn.id, turn.model, turn.call.body)
        yield sse(numbering({"type": "response.created", "response": start}))
        while not (await asyncio.wait({opening}, timeout=PING_SECONDS))[0]:
            yield sse(numbering({"type": "response.in_progress", "response": start}))
        opened, prepared = opening.result()
        relayed = True
        async for chunk in _relay(turn, opened, prepared, leave, numbering):
            yield chunk
    except REPORTED as error:
        yield _failed(numbering, turn, to_proxy_error(error))
    finally:
        opening.cancel()
        if not relayed:
            leave()


# --- Codex's own compaction --------------------------------------------------------------------------------


async def _answer_compaction(turn: Turn, headers: dict[str, str], remote: bool) -> Response:
    """Codex's compaction answered from the stored conversation, with no model call: remotely one ``compaction``
    item holding a checkpoint handle, locally a summary message (the digest and the checkpoint's marker). The
    conversation is brought up to date first (the trigger or the compaction prompt is not part of it)."""
    call = turn.call
    items = call.transcript
    call.messages = items[:-1]
    prepared = await _prepare(call, headers)
    if prepared.conversation_id is None:
        if remote:
            raise InvalidRequestError(
                "lcm-proxy stores no conversation for this request, so it cannot compact it.", param="input"
            )
        call.messages = items
        return await _forward(turn, await _prepare(call, headers), headers)
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
    background = _background(call, prepared)
    if not call.body.get("stream"):
        return JSONResponse(response, headers=headers, background=background)
    numbering = Numbering(turn.id, turn.model)

    async def events() -> AsyncIterator[bytes]:
        for data in whole(response, call.body):
            yield sse(numbering(data))

    return _streaming(events(), headers, background)


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
