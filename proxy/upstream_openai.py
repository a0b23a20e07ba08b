"""Calls LiteLLM does not make, made with the OpenAI SDK itself: to OpenAI-compatible providers only.

``Upstream.call`` sends them exactly as LiteLLM's (the same deployment order, timeouts, retry policy and
error boundary); each function here takes the call's keyword arguments, the provider's own model name and a
client of the proxy's (no retries, the call's timeouts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.errors import UpstreamError

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
