"""OpenAI's Responses API, called natively: the Responses door's requests to a deployment that speaks it go out
as Responses (``POST {api_base}/responses``), never through Chat Completions (LiteLLM still names the provider,
its ``api_base`` and key).

* **Which deployments.** ``is_responses``: LiteLLM's provider is ``openai`` or ``azure``, and either the model
  is spelt the way LiteLLM spells "call via the Responses API" (``openai/responses/gpt-5``), or the deployment's
  ``model_info`` says ``mode: responses``. The model_info reaches the call as ``kwargs["model_info"]``
  (``Upstream.speaks_responses`` puts ``ResolvedModel.mode`` there); a call without it is decided by the prefix.
* **What is sent.** The body the door built (``kwargs["responses_body"]``) with the provider's model name, the
  ``responses/`` prefix stripped; the client's headers the door chose (``kwargs["client_headers"]``, see
  ``client_headers``); the deployment's key (``Authorization: Bearer`` for OpenAI, ``api-key`` for Azure) and
  its ``extra_headers``. Azure: ``{api_base}/openai/v1/responses``, or ``/openai/responses?api-version=`` when
  the deployment names an ``api_version``.
* **What comes back.** Non-streamed: the answer's JSON, read within ``max_upstream_response_bytes``.
  Streamed: ``ResponsesStream``, the SSE events as they came (their bytes, relayed unchanged) each parsed and
  checked (``SHAPES``). The provider's own ``error`` and ``response.failed`` events are events like the others:
  the door relays them. An error status is read as ``proxy.upstream.relay.StatusError``, which the call's error
  boundary (``map_litellm_exceptions``) turns into an ``UpstreamError`` with the provider's type and message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from proxy.upstream.pool import Answer
from proxy.upstream.relay import post, read_object
from proxy.upstream.sse_events import EventStream, has_shape

PROVIDERS = frozenset({"openai", "azure"})
PREFIX = "responses/"  # LiteLLM's spelling of "this deployment is called with the Responses API"
MODE = "responses"  # model_info.mode of a deployment called with the Responses API
DEFAULT_BASE = "https://api.openai.com/v1"
# Client headers a Responses upstream receives as they came (besides every ``x-codex-*`` header): what Codex and
# the SDKs send to say who they are and which session a request belongs to (prompt caching keys on it).
FORWARDED = frozenset({"user-agent", "originator", "openai-beta", "session-id", "session_id", "conversation_id"})
FORWARDED_PREFIXES = ("x-codex-",)
NOT_FORWARDED = frozenset({"authorization", "api-key", "openai-organization", "openai-project"})


def client_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers a Responses upstream receives (names lower-cased, values verbatim); never a
    credential nor the client's own OpenAI organization or project."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        name = name.lower()
        if name in NOT_FORWARDED:
            continue
        if name in FORWARDED or name.startswith(FORWARDED_PREFIXES):
            out[name] = value
    return out


def _provider(litellm: Any, kwargs: Mapping[str, Any]) -> tuple[str, str, str | None, str | None]:
    model, provider, key, base = litellm.get_llm_provider(
        model=kwargs["model"], custom_llm_provider=kwargs.get("custom_llm_provider"), api_base=kwargs.get("api_base")
    )
    return str(model), str(provider), key, base


def is_responses(litellm: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether the deployment ``kwargs`` describes is called with Responses requests natively."""
    try:
        model, provider, _, _ = _provider(litellm, kwargs)
    except Exception:
        return False
    if provider not in PROVIDERS:
        return False
    info = kwargs.get("model_info")
    return model.startswith(PREFIX) or (isinstance(info, Mapping) and info.get("mode") == MODE)


def endpoint(litellm: Any, kwargs: Mapping[str, Any], path: str = "/responses") -> tuple[str, str, dict[str, str]]:
    """(model name as the provider knows it, the URL to post to, the key's header) of the deployment."""
    model, provider, key, base = _provider(litellm, kwargs)
    model = model.removeprefix(PREFIX)
    key = kwargs.get("api_key") or key
    base = kwargs.get("api_base") or base
    if provider == "azure":
        base = base or os.environ.get("AZURE_API_BASE") or ""
        key = key or os.environ.get("AZURE_API_KEY")
        version = kwargs.get("api_version")
        root = base.rstrip("/")
        if "/openai" not in root:
            root += "/openai" if version else "/openai/v1"
        url = root + path + (f"?api-version={version}" if version else "")
        return model, url, {"api-key": key} if key else {}
    base = base or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") or DEFAULT_BASE
    key = key or os.environ.get("OPENAI_API_KEY")
    return model, base.rstrip("/") + path, {"authorization": f"Bearer {key}"} if key else {}


async def send(litellm: Any, kwargs: Mapping[str, Any], path: str = "/responses") -> Answer:
    """POST ``kwargs["responses_body"]`` to the deployment; the response is open (streamed) and its status below
    400 (an error status raises ``StatusError``)."""
    model, url, auth = endpoint(litellm, kwargs, path)
    body = {**kwargs["responses_body"], "model": model}
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    headers["accept"] = "text/event-stream" if body.get("stream") else "application/json"
    headers.update(kwargs.get("client_headers") or {})
    headers.update(auth)
    return await post(kwargs, url, body, headers)


async def read_json(response: Answer, limit: int, upstream: str) -> dict[str, Any]:
    """A non-streamed answer, within ``limit`` bytes; a 502 naming the upstream when it is not a JSON object."""
    return await read_object(response, limit, upstream, "a Responses answer")


_ITEM = (("item", dict), ("output_index", int))
_PART = (("item_id", str), ("output_index", int), ("content_index", int), ("part", dict))
# What an event of each type must hold for a reader (the door's accumulator, Codex, the SDKs) to use it.
SHAPES: dict[str, tuple[tuple[str, type], ...]] = {
    "response.created": (("response", dict),),
    "response.in_progress": (("response", dict),),
    "response.completed": (("response", dict),),
    "response.incomplete": (("response", dict),),
    "response.failed": (("response", dict),),
    "response.queued": (("response", dict),),
    "response.output_item.added": _ITEM,
    "response.output_item.done": _ITEM,
    "response.content_part.added": _PART,
    "response.content_part.done": _PART,
    "response.output_text.done": (("item_id", str), ("output_index", int), ("text", str)),
    "response.function_call_arguments.done": (("item_id", str), ("output_index", int), ("arguments", str)),
    "response.custom_tool_call_input.done": (("item_id", str), ("output_index", int), ("input", str)),
}


class ResponsesStream(EventStream):
    """An open Responses stream: its events, each parsed once and checked (``SHAPES``, and every ``*.delta``
    event's ``delta`` a string: text, arguments, reasoning summaries, refusals); closed exactly once."""

    SHAPES = SHAPES
    END = b"[DONE]"  # not OpenAI's, but gateways in front of it send one

    def well_formed(self, data: dict[str, Any]) -> bool:
        if str(data.get("type", "")).endswith(".delta") and not isinstance(data.get("delta"), str):
            return False
        return has_shape(data, self.SHAPES)
