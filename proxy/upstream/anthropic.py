"""Anthropic's Messages API, called natively: the Messages door's requests to an Anthropic deployment go out as
Messages, never through the OpenAI format (LiteLLM still names the provider, its ``api_base`` and key).

* **What is sent.** The body the door built (the client's fields, the assembled ``system`` and ``messages``)
  with the deployment's model name; the client's ``anthropic-version`` and ``anthropic-beta`` verbatim (open
  lists: never filtered), its other ``anthropic-*`` and ``x-claude-code-*`` headers, its ``user-agent`` and
  ``x-app``; the deployment's key as ``x-api-key`` and its ``extra_headers``.
* **What comes back.** Non-streamed: the answer's JSON, read within ``max_upstream_response_bytes``.
  Streamed: ``MessagesStream``, the SSE events as they came (their bytes, relayed unchanged) each with its
  parsed data. An error status is read as ``proxy.upstream.relay.StatusError``, which the call's error
  boundary (``map_litellm_exceptions``) turns into an ``UpstreamError`` with the provider's type and message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from proxy.upstream.pool import Answer
from proxy.upstream.relay import post, read_object
from proxy.upstream.sse_events import EventStream

DEFAULT_BASE = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"
# Client headers an Anthropic upstream receives as they came (besides every ``anthropic-*`` and
# ``x-claude-code-*`` header).
FORWARDED = frozenset({"user-agent", "x-app"})
FORWARDED_PREFIXES = ("anthropic-", "x-claude-code-")
NOT_FORWARDED = frozenset({"anthropic-api-key"})  # never a client credential upstream


def client_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers an Anthropic upstream receives (names lower-cased, values verbatim)."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        name = name.lower()
        if name in NOT_FORWARDED:
            continue
        if name in FORWARDED or name.startswith(FORWARDED_PREFIXES):
            out[name] = value
    return out


def endpoint(litellm: Any, kwargs: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """(model name as the provider knows it, base URL, key) of the deployment ``kwargs`` describes."""
    model, _, key, base = litellm.get_llm_provider(
        model=kwargs["model"], custom_llm_provider=kwargs.get("custom_llm_provider"), api_base=kwargs.get("api_base")
    )
    base = kwargs.get("api_base") or base or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE
    key = kwargs.get("api_key") or key or os.environ.get("ANTHROPIC_API_KEY")
    return str(model), str(base), key


def is_anthropic(litellm: Any, kwargs: Mapping[str, Any]) -> bool:
    try:
        _, provider, _, _ = litellm.get_llm_provider(
            model=kwargs["model"],
            custom_llm_provider=kwargs.get("custom_llm_provider"),
            api_base=kwargs.get("api_base"),
        )
    except Exception:
        return False
    return bool(provider == "anthropic")


def _url(base: str, path: str) -> str:
    base = base.rstrip("/")
    return base + path if base.endswith("/v1") else base + "/v1" + path


async def send(litellm: Any, kwargs: Mapping[str, Any], path: str = "/messages") -> Answer:
    """POST ``kwargs["messages_body"]`` to the deployment; the response is open (streamed) and its status below
    400 (an error status raises ``StatusError``)."""
    model, base, key = endpoint(litellm, kwargs)
    body = {**kwargs["messages_body"], "model": model}
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    headers.update(kwargs.get("client_headers") or {})
    headers.setdefault("anthropic-version", DEFAULT_VERSION)
    if key:
        headers["x-api-key"] = key
    return await post(kwargs, _url(base, path), body, headers)


async def read_json(response: Answer, limit: int, upstream: str) -> dict[str, Any]:
    """A non-streamed answer, within ``limit`` bytes; a 502 naming the upstream when it is not a JSON object."""
    return await read_object(response, limit, upstream, "a Messages answer")


# What an event of each type must hold for a reader (the door's accumulator, the SDKs) to use it.
SHAPES: dict[str, tuple[tuple[str, type], ...]] = {
    "message_start": (("message", dict),),
    "content_block_start": (("index", int), ("content_block", dict)),
    "content_block_delta": (("index", int), ("delta", dict)),
    "content_block_stop": (("index", int),),
    "message_delta": (("delta", dict),),
}


class MessagesStream(EventStream):
    """An open Messages stream: its events, each parsed once and checked (``SHAPES``); closed exactly once."""

    SHAPES = SHAPES
