"""The upstream error boundary: every exception of a call to the provider becomes one ``UpstreamError``.

LiteLLM, the OpenAI SDK, httpx and aiohttp each raise their own classes, and LiteLLM re-raises the provider's
error as a class of its own choosing (a 503 as ``BadRequestError``, a context-window refusal as a
``ContextWindowExceededError`` that has dropped the provider's JSON). So errors are recognised by what the
whole chain of causes carries (status, the provider's body, the transport's failure), not by the top class.
This module never imports LiteLLM: it reads exceptions by their attributes and class names.

What reaches the client, and why:

* The provider's own status, message, ``type``, ``code`` and ``param``, each redacted. The body is taken from
  whichever exception in the chain still holds it. An integer ``code`` (llama.cpp and vLLM repeat the HTTP
  status there) is kept as its string: OpenAI's error shape types ``code`` as a string.
* A body LiteLLM could not read as a chat completion (not JSON, ``choices`` not a list, ``function: null``)
  arrives as a LiteLLM 500 that no HTTP response ever had: it is the upstream's fault, a 502
  ``upstream_bad_response`` naming the upstream, never a 500 that blames the proxy (and never LiteLLM's text,
  which holds a Python traceback and the upstream's body).
* Connection failures and timeouts name the model alias, never the deployment's ``api_base``.
* What an upstream wrote is bounded before anything reads it: an error body is read up to
  ``ERROR_BODY_BYTES`` where the proxy reads it itself, and each field is cut to ``MAX_ERROR_FIELD_CHARS``
  before it is redacted (redaction scans the whole text: ~1 s per MB).
* A 429's (or 503's) ``Retry-After``, in seconds or as an HTTP date, becomes the error's ``retry_after``
  (at most ``MAX_RETRY_AFTER`` seconds), which the client's response carries as its ``retry-after`` header.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from proxy.errors import (
    InvalidRequestError,
    ProxyError,
    UpstreamConnectionError,
    UpstreamContextLengthError,
    UpstreamError,
    UpstreamTimeoutError,
)
from proxy.redaction import redact_credentials
from proxy.upstream.routing import ResolvedModel

log = logging.getLogger("lcm_proxy.upstream")

DEFAULT_UPSTREAM = "the upstream provider"
ERROR_BODY_BYTES = 8 << 20  # what the proxy reads of an upstream error body it reads itself (parsed off the loop)
MAX_ERROR_FIELD_CHARS = 4000  # what a client is told of each field of the upstream's error (message, type...)
TRUNCATED = " [truncated]"
MAX_RETRY_AFTER = 600  # seconds: a longer Retry-After is relayed as this
# What providers say when the prompt is longer than their window (lower case). The class LiteLLM picks
# (``ContextWindowExceededError``) is the first sign; these cover errors LiteLLM did not classify.
CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
CONTEXT_LENGTH_PHRASES = (
    "maximum context length",  # OpenAI, vLLM
    "prompt is too long",  # Anthropic
    "exceeds the available context size",  # llama.cpp
    "context length exceeded",
    "context_length_exceeded",
)


def describe_upstream(target: ResolvedModel) -> str:
    """Names the upstream in what a client is told: "the upstream provider for model 'local'". Never its
    ``api_base``: a deployment's host, port and path are the operator's, not the client's (the operator's log
    names them, see ``proxy.upstream.balancer.deployment_of``)."""
    return f"{DEFAULT_UPSTREAM} for model '{target.alias}'"


def capital(text: str) -> str:
    return text[:1].upper() + text[1:]


_capital = capital


def is_context_length_error(error: UpstreamError) -> bool:
    """Whether the provider refused the request as longer than its context window (so compacting to a
    smaller budget and trying again can help)."""
    if isinstance(error, UpstreamContextLengthError):
        return True
    if isinstance(error, UpstreamConnectionError | UpstreamTimeoutError):
        return False
    if error.code in CONTEXT_LENGTH_CODES or error.type in CONTEXT_LENGTH_CODES:
        return True
    message = error.message.lower()
    return any(phrase in message for phrase in CONTEXT_LENGTH_PHRASES)


# --- reading an exception chain ----------------------------------------------------------------------------


def walk_causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def is_timeout(exc: BaseException) -> bool:
    names = {"Timeout", "APITimeoutError", "ReadTimeout", "ServerTimeoutError"}
    return any(
        type(e).__name__ in names or isinstance(e, asyncio.TimeoutError | TimeoutError | httpx.TimeoutException)
        for e in walk_causes(exc)
    )


def _is_connection_failure(exc: BaseException) -> bool:
    """The connection failed: it could not be opened, or broke (httpx's transport errors other than timeouts, as
    the OpenAI SDK reads them: calls the proxy sends itself raise them unwrapped)."""
    names = {"APIConnectionError", "ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError"}
    return any(
        isinstance(e, httpx.TransportError | ConnectionError) or type(e).__name__ in names for e in walk_causes(exc)
    )


def _failed_before_sending(exc: BaseException) -> bool:
    """LiteLLM failed on the request's own data before sending anything (an ``AttributeError`` on a field of
    the wrong type) and reported it as a connection error. Nothing went wrong with the upstream: no other
    deployment would do better, and no deployment should be blamed for it."""
    chain = list(walk_causes(exc))
    transport = any(
        isinstance(e, httpx.TransportError | OSError) or type(e).__name__ in _AIOHTTP_TRANSPORT for e in chain
    )
    decoding = any(isinstance(e, json.JSONDecodeError | UnicodeDecodeError) for e in chain)
    internal = any(isinstance(e, AttributeError | TypeError | KeyError | ValueError | IndexError) for e in chain)
    return internal and not transport and not decoding


_AIOHTTP_TRANSPORT = frozenset(
    {"ClientConnectorError", "ClientConnectionError", "ClientOSError", "ServerDisconnectedError"}
)


def is_cut_off(exc: BaseException) -> bool:
    """The connection broke while a response body was being read (reset, incomplete chunked body)."""
    return any(
        (isinstance(e, httpx.TransportError) and not isinstance(e, httpx.TimeoutException))
        or type(e).__name__ in ("ClientPayloadError", "ServerDisconnectedError")
        for e in walk_causes(exc)
    )


def request_not_sent(exc: BaseException) -> bool:
    """Writing the request failed: a pooled keep-alive connection that the upstream closed just as it was
    reused (a busy event loop widens that window). The upstream received no complete request."""
    return any(
        isinstance(e, httpx.WriteError) or type(e).__name__ == "ClientConnectionResetError" for e in walk_causes(exc)
    )


def _answered_with_an_error_status(exc: BaseException) -> bool:
    """Some exception in the chain comes from a real HTTP error response (the OpenAI SDK's own
    ``APIStatusError``, httpx's ``HTTPStatusError``), not from LiteLLM failing to read a successful one.
    (LiteLLM's classes subclass the SDK's: only the SDK's module counts.)"""
    return any(
        isinstance(e, httpx.HTTPStatusError)
        or (type(e).__module__.split(".")[0] == "openai" and "APIStatusError" in _class_names(e))
        for e in walk_causes(exc)
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _upstream_fields(exc: BaseException) -> tuple[str, str | None, str | None, str | None]:
    """The upstream's own error message, type, code and param, from whichever exception in the chain still
    holds its JSON body (LiteLLM's context-window and 503 classes keep only the message)."""
    for e in walk_causes(exc):
        body = getattr(e, "body", None)
        err = body.get("error", body) if isinstance(body, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"], _text(err.get("type")), _text(err.get("code")), _text(err.get("param"))
    message = str(getattr(exc, "message", None) or exc)
    # LiteLLM prefixes messages with its class and provider: "litellm.BadRequestError: OpenAIException - ...".
    if " - " in message and message.startswith("litellm."):
        message = message.split(" - ", 1)[1]
    return message, None, None, None


def redact_upstream_message(message: str, credentials: Iterable[str] = ()) -> str:
    """The one redaction of upstream text (error messages, mid-stream error events). Providers echo the
    credential they were sent, whole or in part ("Incorrect API key provided: sk-upstr**********6789"); it
    must reach neither the client nor the log. Masks the call's credentials, the environment's, partial
    echoes of either, and anything shaped like a key."""
    return redact_credentials(message, credentials)


# --- translation -------------------------------------------------------------------------------------------


def translate_exception(
    exc: BaseException, timeout: float | None = None, credentials: Iterable[str] = (), upstream: str = DEFAULT_UPSTREAM
) -> ProxyError:
    """``upstream`` names the provider in the errors the proxy words itself (see ``describe_upstream``)."""
    if isinstance(exc, ProxyError):
        return exc
    status = getattr(exc, "status_code", None)
    if is_timeout(exc) or status == 408:
        limit = f" within {timeout:g} s" if timeout else ""
        return UpstreamTimeoutError(f"{_capital(upstream)} did not respond{limit}.")
    has_response = getattr(exc, "response", None) is not None and getattr(exc, "body", None) is not None
    if not has_response and _is_connection_failure(exc):
        if _failed_before_sending(exc):
            return InvalidRequestError(
                f"The request could not be sent to {upstream}: its fields did not fit the provider's call"
                f" ({type(list(walk_causes(exc))[-1]).__name__}). Check the types of the optional fields.",
                code="upstream_request_invalid",
            )
        return UpstreamConnectionError(f"Could not connect to {upstream}.")
    if status == 500 and not _answered_with_an_error_status(exc):
        return UpstreamError(
            f"{_capital(upstream)} sent a malformed response: not a chat completion that could be read.",
            status=502,
            code="upstream_bad_response",
        )
    # Every field the provider wrote reaches the client: each is redacted, not only the message.
    message, kind, code, param = (
        redact_upstream_message(_bounded(field), credentials) if field is not None else None
        for field in _upstream_fields(exc)
    )
    message = message or "The upstream provider reported an error."
    if isinstance(status, int) and 400 <= status < 600:
        error = UpstreamError(message, status=status, type=kind or "upstream_error", code=code, param=param)
        # LiteLLM's class says so, or (a call the proxy sent itself: the direct path) the provider's own words do.
        too_long = any("ContextWindowExceededError" in _class_names(e) for e in walk_causes(exc))
        if too_long or (status == 400 and is_context_length_error(error)):
            error = UpstreamContextLengthError(message, status=status, type=error.type, code=code, param=param)
        wait = retry_after(exc)
        if wait is not None and status in (429, 503):
            error.retry_after = wait  # type: ignore[attr-defined]
        return error
    return UpstreamError(f"Upstream call failed: {message}", status=502)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_FIELD_CHARS else text[: MAX_ERROR_FIELD_CHARS - len(TRUNCATED)] + TRUNCATED


def retry_after(exc: BaseException) -> int | None:
    """The upstream's ``Retry-After`` (seconds, or an HTTP date turned into seconds from now), from whichever
    exception in the chain kept the response's headers; at most ``MAX_RETRY_AFTER``, None when absent or
    unreadable."""
    for e in walk_causes(exc):
        for headers in (
            getattr(getattr(e, "response", None), "headers", None),
            getattr(e, "litellm_response_headers", None),
            getattr(e, "headers", None),
        ):
            value = _header(headers, "retry-after")
            if value is not None:
                return parse_retry_after(value)
    return None


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    try:
        value = headers.get(name)
    except Exception:
        return None
    return value if isinstance(value, str) else None


def parse_retry_after(value: str) -> int | None:
    value = value.strip()
    if value.isdigit():
        return min(int(value), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = math.ceil((when - datetime.now(UTC)).total_seconds())
    return min(max(seconds, 0), MAX_RETRY_AFTER)


@contextmanager
def map_litellm_exceptions(
    timeout: float | None = None, credentials: Iterable[str] = (), upstream: str = DEFAULT_UPSTREAM
) -> Iterator[None]:
    try:
        yield
    except (ProxyError, asyncio.CancelledError):
        raise
    except Exception as exc:
        translated = translate_exception(exc, timeout, credentials, upstream)
        # Only the translated (redacted) message: the exception itself holds the provider's raw text.
        log.info("upstream error %s: %s", translated.status, translated.message)
        raise translated from exc
