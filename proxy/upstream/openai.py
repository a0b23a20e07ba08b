"""Calls LiteLLM does not make, made with the OpenAI SDK itself: to OpenAI-compatible providers only.

``Upstream.call`` sends them exactly as LiteLLM's (the same deployment order, timeouts, retry policy and
error boundary); each function here takes the call's keyword arguments, the provider's own model name and a
client of the proxy's (no retries, the call's timeouts).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from proxy.errors import UpstreamError
from proxy.upstream.params import PLACEHOLDER_KEY

TRANSLATION_FIELDS = ("file", "prompt", "response_format", "temperature")


def unsupported(what: str, upstream: str) -> UpstreamError:
    """A provider that is not OpenAI-compatible, asked for a call only the OpenAI SDK makes: 501, not retried."""
    return UpstreamError(
        f"lcm-proxy forwards {what} to OpenAI-compatible providers only; {upstream} is not one.",
        status=501,
        code="unsupported_endpoint",
        type="invalid_request_error",
    )


async def translation(kwargs: dict[str, Any], model: str, client: Any) -> Any:
    """Audio translation into English (``/v1/audio/translations``): LiteLLM has no call for it."""
    fields = {k: kwargs[k] for k in TRANSLATION_FIELDS if k in kwargs}
    return await client.audio.translations.create(
        model=model, **fields, extra_body=kwargs.get("extra_body"), timeout=kwargs["timeout"]
    )


OpenAICall = Callable[[dict[str, Any], str, Any], Awaitable[Any]]
OPENAI_CALLS: dict[str, tuple[OpenAICall, str]] = {"atranslation": (translation, "audio translations")}


# LiteLLM calls that retry twice whatever ``max_retries`` says (and, for moderations, use a cached client with
# no timeout): to OpenAI-compatible providers they get a client of the proxy's (``no_retries_client``).
OWN_CLIENT_CALLS = frozenset({"amoderation", "aimage_generation"})


@functools.cache
def no_retries_client() -> Any:
    """An OpenAI client class that keeps ``max_retries`` at 0: LiteLLM sets it on a client it is given (to 2
    for moderations and images, whatever the call said)."""
    import openai

    class NoRetries(openai.AsyncOpenAI):
        @property
        def max_retries(self) -> int:
            return 0

        @max_retries.setter
        def max_retries(self, value: int) -> None:
            pass

    return NoRetries


def openai_client(kwargs: dict[str, Any]) -> Any:
    """An OpenAI client with no retries and the call's timeouts, one per api_base, key and timeout."""
    timeout: httpx.Timeout = kwargs["timeout"]
    return _client(kwargs.get("api_base"), kwargs.get("api_key"), timeout.read, timeout.connect)


@functools.lru_cache(maxsize=64)
def _client(api_base: str | None, api_key: str | None, read: float | None, connect: float | None) -> Any:
    timeout = httpx.Timeout(read, connect=connect)
    return no_retries_client()(api_key=api_key or PLACEHOLDER_KEY, base_url=api_base, max_retries=0, timeout=timeout)
