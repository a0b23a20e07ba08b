"""Embeddings without parsing them: the upstream's answer relayed as it came, within a byte cap.

An OpenAI-sized batch (2,048 inputs x 1,536 floats) is 65 MB of JSON. LiteLLM and the OpenAI SDK parse it into
Python objects on the event loop (5.7 s in which nothing else runs, several GB of objects for larger answers),
only for the proxy to serialise it again. The proxy need not read it:

* to an OpenAI-compatible deployment whose call needs nothing LiteLLM adds (``relayable``), the request is
  sent with httpx exactly as the OpenAI SDK would send it (the client's fields, ``extra_body`` merged last,
  the deployment's key and extra headers), and the answer's bytes are streamed to the client chunk by chunk
  (``Relayed``), never held whole: an answer declared or found larger than ``max_upstream_response_bytes``
  is a 502 naming the model;
* to any other provider, LiteLLM's synchronous call and the serialisation of its answer run in a worker
  thread (``Upstream._embedding``).

An error answer is read up to ``ERROR_BODY_BYTES``; its JSON is parsed in a worker thread and becomes an
exception that ``proxy.upstream.errors.translate_exception`` reads as it reads the OpenAI SDK's.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from proxy.errors import UpstreamError
from proxy.upstream import pool
from proxy.upstream.errors import ERROR_BODY_BYTES, MAX_ERROR_FIELD_CHARS, TRUNCATED, capital
from proxy.upstream.pool import Answer

CHUNK_BYTES = 1 << 16
# litellm_params a relayed call honours; a deployment with any other (api_version, organization, aws_...) is
# called through LiteLLM, which knows what they mean.
RELAYABLE_PARAMS = frozenset(
    {"model", "api_base", "api_key", "custom_llm_provider", "extra_headers", "headers", "timeout", "max_retries",
     "num_retries", "drop_params", "stream", "client"}
)  # fmt: skip
NOT_BODY = frozenset({"extra_body", "allowed_openai_params"})
# The client's fields of an embeddings call (``proxy.wire.passthrough.routes.EMBEDDINGS``).
EMBEDDING_FIELDS = frozenset({"input", "dimensions", "encoding_format", "user", "extra_body", "allowed_openai_params"})


def relayable(kwargs: Mapping[str, Any], call_fields: frozenset[str]) -> bool:
    """Whether a relayed call can honour every deployment parameter ``kwargs`` carries (``call_fields`` are the
    client's, which go in the body)."""
    return all(k in RELAYABLE_PARAMS or k in call_fields for k in kwargs)


class StatusError(httpx.HTTPStatusError):
    """An upstream error answer, read within ``ERROR_BODY_BYTES``: its status, its JSON body (None when it had
    none that could be read) and its headers, where ``translate_exception`` looks for them."""

    def __init__(self, response: Answer, body: Any) -> None:
        # An aiohttp answer (``proxy.upstream.pool``) too: what is read of it is its status and its headers.
        super().__init__(f"upstream answered {response.status_code}", request=response.request, response=response)  # type: ignore[arg-type]
        self.status_code = response.status_code
        self.body = body if body is not None else {"error": {"message": f"HTTP {response.status_code}"}}


def too_large(upstream: str, limit: int) -> UpstreamError:
    return UpstreamError(
        f"{capital(upstream)} sent a response larger than max_upstream_response_bytes ({limit} bytes).",
        status=502,
        code="upstream_response_too_large",
    )


def not_json(upstream: str) -> UpstreamError:
    return UpstreamError(
        f"{capital(upstream)} sent a malformed response: not a JSON object.", status=502, code="upstream_bad_response"
    )


@dataclass
class Relayed:
    """An upstream answer being relayed: its status and content type, and its bytes as they arrive."""

    status: int
    media_type: str
    length: int | None
    chunks: AsyncIterator[bytes]


# One client per event loop and timeouts: a pooled connection belongs to the loop that opened it.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[float | None, float | None], Any]] = (
    weakref.WeakKeyDictionary()
)


def _client(read: float | None, connect: float | None) -> httpx.AsyncClient:
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    if (read, connect) not in clients:
        if len(clients) >= 64:  # timeouts come from the config: a handful
            clients.clear()
        clients[read, connect] = httpx.AsyncClient(timeout=httpx.Timeout(read, connect=connect), follow_redirects=False)
    client: httpx.AsyncClient = clients[read, connect]
    return client


async def post(kwargs: Mapping[str, Any], url: str, body: dict[str, Any], headers: dict[str, str]) -> Answer:
    """A native call's POST (Messages, Responses): ``body`` as JSON to ``url`` with ``headers`` and the
    deployment's own ``headers`` / ``extra_headers`` over them, on the pooled client with the call's timeouts;
    the response open (streamed) and its status below 400 (an error status raises ``StatusError``)."""
    headers = dict(headers)
    for extra in (kwargs.get("headers"), kwargs.get("extra_headers")):
        if isinstance(extra, Mapping):
            headers.update({str(k).lower(): str(v) for k, v in extra.items()})
    response = await pool.send(url, orjson.dumps(body), headers, kwargs["timeout"])
    if response.status_code >= 400:
        raise await read_error(response)
    return response


async def read_object(response: Answer, limit: int, upstream: str, what: str) -> dict[str, Any]:
    """A native call's non-streamed answer, within ``limit`` bytes; a 502 naming the upstream when it is not a
    JSON object (``what``: the kind of answer expected, for the message)."""
    data = bytearray()
    try:
        async for chunk in response.aiter_raw(1 << 16):
            data += chunk
            if len(data) > limit:
                raise too_large(upstream, limit)
    finally:
        await response.aclose()
    try:
        answer = orjson.loads(bytes(data))
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise UpstreamError(
            f"{capital(upstream)} sent a malformed response: not {what} that could be read.",
            status=502,
            code="upstream_bad_response",
        )
    return answer


def _parse_error(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()
        return {"error": {"message": text}} if text else None


async def _read_capped(chunks: AsyncIterator[bytes], response: Answer) -> bytes:
    """At most ``ERROR_BODY_BYTES`` of an error answer (the rest is never read); the response is closed."""
    data = bytearray()
    try:
        async for chunk in chunks:
            data += chunk
            if len(data) >= ERROR_BODY_BYTES:
                del data[ERROR_BODY_BYTES:]
                break
    finally:
        await response.aclose()
    return bytes(data)


async def read_error(response: Answer) -> StatusError:
    """The error answer, read up to ``ERROR_BODY_BYTES`` and parsed off the loop."""
    raw = await _read_capped(response.aiter_raw(CHUNK_BYTES), response)
    return StatusError(response, await asyncio.to_thread(_parse_error, raw))


# --- error bodies of LiteLLM's calls -------------------------------------------------------------------------

SMALL_ERROR_BYTES = 16 << 10  # an error body up to this size reaches LiteLLM as it came


def _shrunk(value: Any, depth: int = 0) -> Any:
    """``value`` with every string cut to ``MAX_ERROR_FIELD_CHARS`` and every array to its first 16 items."""
    if isinstance(value, str):
        return value if len(value) <= MAX_ERROR_FIELD_CHARS else value[:MAX_ERROR_FIELD_CHARS] + TRUNCATED
    if depth > 8:
        return None
    if isinstance(value, dict):
        return {_shrunk(k, depth + 1): _shrunk(v, depth + 1) for k, v in list(value.items())[:64]}
    if isinstance(value, list):
        return [_shrunk(v, depth + 1) for v in value[:16]]
    return value


def _small_error(raw: bytes) -> bytes:
    try:
        return orjson.dumps(_shrunk(orjson.loads(raw)))
    except orjson.JSONDecodeError:
        text: str = _shrunk(raw.decode("utf-8", "replace"))
        return text.encode()


async def bound_error_body(response: httpx.Response) -> None:
    """An httpx response hook on the clients LiteLLM's OpenAI calls use: an error body is read up to
    ``ERROR_BODY_BYTES`` and, when it is large, replaced by its JSON with every string cut to
    ``MAX_ERROR_FIELD_CHARS`` (parsed in a worker thread). LiteLLM scans an error's whole text with its
    secret-redaction expressions several times (seconds per MB, on the event loop); after this it scans a few
    KB. The provider's status, headers, ``type``, ``code`` and the start of its message are kept."""
    if response.status_code < 400:
        return
    raw = await _read_capped(response.aiter_bytes(CHUNK_BYTES), response)
    if len(raw) > SMALL_ERROR_BYTES:
        raw = await asyncio.to_thread(_small_error, raw)
    response._content = raw  # what aread(), .content and .text return from now on (the stream is closed)


# --- the relay ---------------------------------------------------------------------------------------------


async def relay(
    path: str,
    kwargs: Mapping[str, Any],
    model: str,
    api_base: str,
    api_key: str | None,
    fields: frozenset[str],
    limit: int,
    upstream: str,
) -> Relayed:
    """POST the client's ``fields`` of ``kwargs`` to ``api_base + path`` and start relaying the answer: raises
    what the call's error boundary maps (httpx's errors, ``StatusError``), or an ``UpstreamError`` for an
    answer over ``limit`` bytes or one that does not open as a JSON object."""
    body: dict[str, Any] = {"model": model}
    body.update({k: v for k, v in kwargs.items() if k in fields and k not in NOT_BODY})
    body.update(kwargs.get("extra_body") or {})
    # identity: the bytes read are the bytes relayed, with the length the upstream declared
    headers = {"content-type": "application/json", "accept": "application/json", "accept-encoding": "identity"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    for extra in (kwargs.get("headers"), kwargs.get("extra_headers")):
        if isinstance(extra, Mapping):
            headers.update({str(k): str(v) for k, v in extra.items()})
    timeout: httpx.Timeout = kwargs["timeout"]
    client = _client(timeout.read, timeout.connect)
    request = client.build_request("POST", api_base.rstrip("/") + path, content=orjson.dumps(body), headers=headers)
    response = await client.send(request, stream=True)
    if response.status_code >= 400:
        raise await read_error(response)
    try:
        declared = response.headers.get("content-length")
        length = int(declared) if declared and declared.isdigit() else None
        if length is not None and length > limit:
            raise too_large(upstream, limit)
        chunks = response.aiter_raw(CHUNK_BYTES)
        first = b""
        async for chunk in chunks:  # the first bytes that are not white space say whether this is JSON at all
            first += chunk
            if first.strip() or len(first) > limit:
                break
        if not first.strip().startswith(b"{"):
            raise not_json(upstream)
    except BaseException:
        await response.aclose()
        raise
    media_type = response.headers.get("content-type") or "application/json"
    return Relayed(response.status_code, media_type, length, _rest(response, first, chunks, limit, upstream))


async def _rest(
    response: httpx.Response, first: bytes, chunks: AsyncIterator[bytes], limit: int, upstream: str
) -> AsyncIterator[bytes]:
    """The answer's bytes, the first ones included; past ``limit`` the relay stops (the client sees a cut
    answer, never a silently shortened one: its length was declared, or its chunked encoding is not ended)."""
    size = len(first)
    try:
        yield first
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise too_large(upstream, limit)
            yield chunk
    finally:
        await response.aclose()
