"""Small HTTP helpers shared by the routes: JSON bodies with a size cap, JSON and error responses, and the
one place where the engine's errors become HTTP errors (``to_proxy_error``)."""

from __future__ import annotations

import asyncio
import json
import json.scanner
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import orjson
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message

from proxy.engine import errors as engine
from proxy.engine.engine import Prepared
from proxy.errors import (
    ContextLengthExceeded,
    ConversationBusyError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    ProxyError,
    RequestTimeoutError,
    StoreBusyError,
    UpstreamError,
)
from proxy.relay.turn import Call
from proxy.store import errors as store

log = logging.getLogger("lcm_proxy.wire")

# How deeply JSON values may nest, counting the body itself as level 1. Everything after validation walks
# the body recursively (canonical form, token budget, deep copies, LiteLLM) and orjson refuses to serialise
# beyond 254 levels, so a request that parses (orjson reads up to 1024) could fail only after parsing, with a
# 500 or a dropped connection, sometimes after its messages were stored. 64 is far more than real requests
# use (a message part's image URL sits at level 6; each level of a tool's JSON Schema costs two, and OpenAI's
# structured outputs allow 10), and far below both orjson's limit and Python's recursion limit of 1000
# frames (a deep copy costs two to three frames per level).
MAX_DEPTH = 64

# What a client is told: the proxy's own HTTP errors, and the engine's and the store's, mapped by
# ``to_proxy_error``.
REPORTED = (ProxyError, engine.EngineError, store.StoreError)
Reported: TypeAlias = ProxyError | engine.EngineError | store.StoreError

# Engine or store error → (HTTP error, its ``code`` when the class has none). The most specific class listed wins.
_HTTP: dict[type[Exception], tuple[type[ProxyError], str | None]] = {
    engine.NotFound: (NotFoundError, None),
    engine.InvalidArgument: (InvalidRequestError, "invalid_value"),
    engine.ContextTooLong: (ContextLengthExceeded, None),
    engine.ConversationBusy: (ConversationBusyError, None),
    store.StoreBusy: (StoreBusyError, None),
    engine.SummarizerUnavailable: (UpstreamError, "summarizer_unavailable"),
}


def to_proxy_error(error: Reported) -> ProxyError:
    """The HTTP error a client gets for ``error``: the engine's errors keep their message and ``param``;
    one without a mapping (a damaged database, say) is an internal error, logged by class name."""
    if isinstance(error, ProxyError):
        return error
    for kind in type(error).__mro__:
        if kind in _HTTP:
            http, code = _HTTP[kind]
            return http(error.message, param=error.param, code=code)
    log.error("%s has no HTTP status: answered as an internal error", type(error).__name__)
    return InternalError("Internal error in lcm-proxy. The request was not forwarded.")


async def reported_error(request: Request, exc: Exception) -> Response:
    """The application's handler for both families (``REPORTED``): route handlers need no try/except for
    them. Streamed responses cannot use it once their first byte is out: they send ``to_proxy_error``'s
    JSON as an SSE event instead."""
    assert isinstance(exc, REPORTED)
    return error_response(to_proxy_error(exc))


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(error: ProxyError, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if not error.retryable:
        headers["x-should-retry"] = "false"
    retry_after = getattr(error, "retry_after", None)  # seconds, on errors that know when a retry can succeed
    if retry_after is not None:
        headers.setdefault("retry-after", str(retry_after))
    if getattr(error, "close_connection", False):  # a request whose body was not read to its end
        headers["connection"] = "close"
    return JSONResponse(error.to_json(), status_code=error.status, headers=headers)


def compaction_after(call: Call, prepared: Prepared | None) -> BackgroundTask | None:
    """The compaction a turn calls for, run once its response is sent (``Call.after``)."""
    compact = call.after(prepared)
    return BackgroundTask(compact) if compact is not None else None


def too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"Request body is larger than the configured limit of {limit} bytes.")


def bounded_receive(
    receive: Callable[[], Awaitable[Message]], limit: int, seconds: float
) -> Callable[[], Awaitable[Message]]:
    """``receive`` that refuses more than ``limit`` body bytes as they arrive (413), and a body that is not
    complete ``seconds`` after the first read (408): a total, so a client trickling a byte at a time holds its
    connection no longer than one that sends nothing."""
    size = 0
    deadline: float | None = None

    async def bounded() -> Message:
        nonlocal size, deadline
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + seconds
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise RequestTimeoutError(
                f"The request body did not arrive within {seconds:g} seconds (general_settings.body_read_timeout)."
            ) from None
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise too_large(limit)
        return message

    return bounded


async def read_json_body(request: Request, limit: int, timeout: float) -> Any:
    """Read and parse the body, refusing more than ``limit`` bytes before buffering them, and a body that has
    not arrived in full within ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    try:
        async for chunk in Request(request.scope, bounded_receive(request.receive, limit, timeout)).stream():
            chunks.append(chunk)
    except ClientDisconnect:
        # The client hung up mid-upload (its own timeout): nobody reads the answer, and it is not a proxy bug.
        raise InvalidRequestError(
            "The client closed the connection before the request body was complete.",
            status=499,
            code="client_closed_request",
        ) from None
    raw = b"".join(chunks)
    if not raw.strip():
        raise InvalidRequestError("The request body is empty; expected a JSON object.", code="invalid_body")
    if len(raw) > PARSE_ON_LOOP_BYTES:
        return await asyncio.to_thread(parse_json_in_steps, raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _unparsable(f"{exc.msg} at position {exc.pos}") from None


# A body up to this size is parsed by orjson on the event loop: it is the fastest parser there is, and ordinary
# requests, long conversations included, stay well below this. orjson holds the GIL for a whole parse (about
# 2.5 ms per MB), in which nothing else runs, not even in another thread; a larger body (a huge paste, a
# hostile upload) is parsed in a worker thread by a slower parser that lets other threads run between values.
PARSE_ON_LOOP_BYTES = 8 << 20


def _unparsable(reason: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"We could not parse the JSON body of your request ({reason}).",
        code="invalid_json",
    )


class _Refused(ValueError):
    pass


def _number(text: str) -> Any:
    try:
        return orjson.loads(text)  # orjson's reading of numbers: big integers become floats, 1e999 is refused
    except orjson.JSONDecodeError:
        raise _Refused(f"number {text[:40]} is out of range") from None


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON")


def _checked(value: str) -> str:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise _Refused("a string holds an unpaired surrogate escape") from None
    return value


def parse_json_in_steps(raw: bytes) -> Any:
    """``orjson.loads(raw)``, value by value in Python so that other threads (the event loop) keep running.

    It accepts what orjson accepts and returns the same values: strict UTF-8 without a byte order mark, no NaN
    or Infinity, no unpaired surrogate escapes, numbers read by orjson itself, the last of duplicate keys. One
    difference: values nested more than ~450 levels deep are refused (orjson reads 1024; validation allows 64).
    Strings are scanned by the standard library's C scanner, each in one step."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise _unparsable("a UTF-8 byte order mark is not supported")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _unparsable(f"invalid UTF-8 at position {exc.start}") from None
    scan_string = json.decoder.scanstring  # type: ignore[attr-defined]  # the C scanner, one call per string

    def parse_string(s: str, end: int, strict: bool) -> tuple[str, int]:
        value, end = scan_string(s, end, strict)
        return _checked(value), end

    def parse_object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        for key, _ in pairs:
            _checked(key)
        return dict(pairs)

    decoder = json.JSONDecoder(
        parse_float=_number, parse_int=_number, parse_constant=_constant, object_pairs_hook=parse_object_pairs
    )
    decoder.parse_string = parse_string  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise _unparsable(f"{exc.msg} at position {exc.pos}") from None
    except _Refused as exc:
        raise _unparsable(str(exc)) from None
    except RecursionError:
        raise _unparsable("values are nested too deeply") from None
