"""The direct path: chat completions sent straight to a deployment that speaks OpenAI's format, over one pooled
HTTP client, without ``litellm.acompletion``'s per-call machinery (~4-10 ms of CPU per call, more with long
transcripts).

LiteLLM stays the authority on the provider: ``endpoint`` asks its ``get_llm_provider`` once per deployment
(cached) for the provider, the provider's model name, its base URL and its key. What is sent is what LiteLLM
would send for these deployments (``proxy.upstream.client.Upstream._kwargs`` already forwards the client's body
field for field through ``extra_body``): ``POST {base}/chat/completions`` with the client's fields, the
provider's model name, ``Authorization: Bearer <key>`` and the deployment's ``extra_headers``. Everything else
is shared with the LiteLLM path: the deployment order, fallbacks, cooldowns and retries (``Upstream._call``),
the resend of a request that never left (``Upstream._send``), the error boundary
(``proxy.upstream.errors.map_litellm_exceptions`` reads ``proxy.upstream.relay.StatusError`` as it reads the
OpenAI SDK's errors), the stream reader and its truncation check (``proxy.upstream.stream.sse_chunks``) and
the answer's checks (``proxy.upstream.rounds``). The client is the one the native Messages and Responses calls
use (``proxy.upstream.relay._client``): keep-alive pools per event loop, the call's connect and read timeouts,
no retries, the environment's proxy settings (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, as LiteLLM's
transport honours them).

Which deployments (``endpoint``): LiteLLM's provider is one of ``PROVIDERS`` (OpenAI itself, OpenAI-compatible
servers behind ``openai/`` or ``hosted_vllm/`` with an ``api_base``, and hosted providers whose requests LiteLLM
sends unchanged but for the URL and key), a base URL and a key are known, the deployment sets no parameter
outside ``PARAMS`` (``organization``, ``api_version``, a deployment-level ``temperature``... are LiteLLM's to
apply), and its ``model_info.lcm_direct`` is not false. Every other deployment is called through LiteLLM.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.upstream import pool
from proxy.upstream.relay import read_error, read_object

# Set to False to send every chat call through LiteLLM (the test suite runs both ways: tests/upstream/conftest.py).
ENABLED = True
KEY = "lcm_direct"  # the call's keyword naming its ``Endpoint``: never passed to LiteLLM
DEFAULT_OPENAI_BASE = "https://api.openai.com/v1"
# LiteLLM providers whose chat requests LiteLLM sends to ``{base}/chat/completions`` with a Bearer key and the body
# as given (checked against what litellm 1.106 puts on the wire). Not: fireworks_ai (rewrites the model name),
# openrouter (adds headers and a body field), perplexity and novita (add headers), github_copilot, chatgpt and
# azure_ai (their own authentication), and any provider not listed.
PROVIDERS = frozenset(
    {"openai", "hosted_vllm", "lm_studio", "deepseek", "together_ai", "xai", "cerebras", "deepinfra", "nebius",
     "sambanova", "moonshot"}
)  # fmt: skip
# The call's parameters the direct path honours (the deployment's, the proxy's and the client's); a call with any
# other goes through LiteLLM, which knows what it means.
PARAMS = frozenset(
    {"model", "api_base", "api_key", "custom_llm_provider", "extra_headers", "headers", "timeout", "max_retries",
     "num_retries", "drop_params", "stream", "stream_options", "messages", "extra_body", KEY}
)  # fmt: skip
READ_BYTES = 1 << 16


@dataclass(frozen=True)
class Endpoint:
    """Where a deployment's chat requests go: the provider's model name, the URL, the key (None: none sent)."""

    model: str
    url: str
    key: str | None
    headers: tuple[tuple[str, str], ...] = ()  # the organization and project, when the environment names them


def endpoint(litellm: Any, kwargs: Mapping[str, Any]) -> Endpoint | None:
    """The direct endpoint of the call ``kwargs`` describes, or None when LiteLLM must make it."""
    if not ENABLED or not PARAMS.issuperset(kwargs):
        return None
    point = _endpoint(
        litellm, str(kwargs["model"]), kwargs.get("custom_llm_provider"), kwargs.get("api_base"), kwargs.get("api_key")
    )
    if point is None:
        return None
    # The OpenAI SDK inside LiteLLM names the organization and project the environment gives (read per call, as
    # it does): sent the same way.
    organization = litellm.organization or os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
    project = os.environ.get("OPENAI_PROJECT_ID")
    extra = {"openai-organization": organization, "openai-project": project}
    return dataclasses.replace(point, headers=tuple((k, str(v)) for k, v in extra.items() if v))


@functools.lru_cache(maxsize=256)
def _endpoint(
    litellm: Any, model: str, provider: str | None, api_base: str | None, api_key: str | None
) -> Endpoint | None:
    """LiteLLM's resolution, asked once per deployment (its environment is read once too)."""
    try:
        name, provider, key, base = litellm.get_llm_provider(
            model=model, custom_llm_provider=provider, api_base=api_base
        )
    except Exception:
        return None  # LiteLLM's own call raises the error the client should see
    if provider not in PROVIDERS:
        return None
    base, key = api_base or base, api_key or key
    if provider == "openai":  # LiteLLM's defaults for OpenAI itself
        base = base or litellm.api_base or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
        base = base or DEFAULT_OPENAI_BASE
        key = key or litellm.api_key or litellm.openai_key or os.environ.get("OPENAI_API_KEY")
    if not base or not key:
        return None  # LiteLLM refuses a keyless call in its own words
    return Endpoint(str(name), str(base).rstrip("/") + "/chat/completions", str(key))


def _body(kwargs: Mapping[str, Any], model: str) -> bytes:
    body: dict[str, Any] = {**(kwargs.get("extra_body") or {}), "model": model}
    if kwargs.get("stream"):
        body["stream"] = True
        if kwargs.get("stream_options") is not None:
            body["stream_options"] = kwargs["stream_options"]
    else:
        body.pop("stream", None)
    return orjson.dumps(body)


async def send(kwargs: Mapping[str, Any], limit: int, upstream: str) -> pool.Answer | dict[str, Any]:
    """POST the call to its endpoint. Streamed: the response, open, its status below 400. Not streamed: the
    answer's JSON object, read within ``limit`` bytes. An error status raises ``StatusError``."""
    point: Endpoint = kwargs[KEY]
    stream = bool(kwargs.get("stream"))
    headers = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
    if point.key:
        headers["authorization"] = f"Bearer {point.key}"
    headers.update(point.headers)
    for extra in (kwargs.get("headers"), kwargs.get("extra_headers")):
        if isinstance(extra, Mapping):
            headers.update({str(k).lower(): str(v) for k, v in extra.items()})
    response = await pool.send(point.url, _body(kwargs, point.model), headers, kwargs["timeout"])
    if response.status_code >= 400:
        raise await read_error(response)
    if stream:
        return response
    return await read_json(response, limit, upstream)


async def read_json(response: pool.Answer, limit: int, upstream: str) -> dict[str, Any]:
    """A non-streamed answer, within ``limit`` bytes; a 502 naming the upstream when it is not a JSON object."""
    return await read_object(response, limit, upstream, "a chat completion")
