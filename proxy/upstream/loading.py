"""LiteLLM, imported once (on first use: it costs seconds and may reach for the network) and configured for an
offline, quiet, low-overhead proxy; and which deployments it would call through the OpenAI protocol (those the
proxy forwards field for field, ``proxy.upstream.client``)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from proxy.upstream.relay import bound_error_body

_litellm: Any = None


def load_litellm() -> Any:
    """Import LiteLLM once, configured for an offline, quiet, low-overhead proxy."""
    global _litellm
    if _litellm is not None:
        return _litellm
    # Without these LiteLLM downloads a price list from GitHub at import (5 s x 3 timeouts offline) and
    # tokenizers from HuggingFace on first use.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    import litellm

    tokenizers = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(tokenizers))
    litellm.disable_hf_tokenizer_download = True
    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners on stdout
    litellm.telemetry = False
    litellm.drop_params = False
    # The embedding call reads max_retries=0 as "unset" and falls back to this (2): no hidden retries.
    litellm.DEFAULT_MAX_RETRIES = 0  # type: ignore[attr-defined]
    _skip_cost_tracking(litellm)
    _bound_error_bodies()
    # LiteLLM logs every call at INFO, through a handler of its own and again through the root logger: two
    # lines per call in two formats. Its warnings and errors are what an operator needs, in our format.
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.WARNING)
        logger.propagate = True
    _litellm = litellm
    return litellm


def _no_cost(*args: Any, **kwargs: Any) -> None:
    return None


def _skip_cost_tracking(litellm: Any) -> None:
    """LiteLLM prices every response (and again when a stream ends) against its model map: ~1 ms of CPU per
    call here, for a figure this proxy never reads. Every pricing path goes through the module attribute
    ``litellm.response_cost_calculator``; a stand-in that prices nothing leaves ``response_cost`` unset.
    ``tests/upstream/test_upstream_unit.py`` fails if a LiteLLM upgrade moves the pricing elsewhere."""
    litellm.response_cost_calculator = _no_cost


def _bound_error_bodies() -> None:
    """Every httpx client LiteLLM builds for its OpenAI-compatible (and Azure) calls gets the response hook
    ``bound_error_body``: a multi-MB error body is cut before LiteLLM's exception mapping and failure logging
    scan it on the event loop. ``tests/upstream/test_upstream_bounds.py`` fails if a LiteLLM upgrade moves this."""
    from litellm.llms.openai.common_utils import BaseOpenAILLM

    build = BaseOpenAILLM._get_async_http_client
    if getattr(build, "bounds_error_bodies", False):
        return

    def hooked(*args: Any, **kwargs: Any) -> Any:
        client = build(*args, **kwargs)
        if isinstance(client, httpx.AsyncClient) and bound_error_body not in client.event_hooks["response"]:
            client.event_hooks["response"].append(bound_error_body)
        return client

    hooked.bounds_error_bodies = True  # type: ignore[attr-defined]
    BaseOpenAILLM._get_async_http_client = staticmethod(hooked)  # type: ignore[method-assign]


@contextmanager
def without_success_logging() -> Iterator[None]:
    """Mark the call as one of LiteLLM's internal calls: it then schedules no asynchronous success-logging task
    (a standard logging payload built per call for callbacks that this proxy never registers; ~0.5 ms of
    CPU). Callbacks cannot be configured through lcm-proxy, so nothing is lost."""
    from litellm._internal_context import is_internal_call

    token = is_internal_call.set(True)
    try:
        yield
    finally:
        is_internal_call.reset(token)


@functools.lru_cache(maxsize=256)
def _is_passthrough_model(model: str, custom_llm_provider: str | None, api_base: str | None) -> bool:
    litellm = load_litellm()
    try:
        _, provider, _, _ = litellm.get_llm_provider(
            model=model, custom_llm_provider=custom_llm_provider, api_base=api_base
        )
    except Exception:
        return False
    return provider == "openai" or provider in litellm.openai_compatible_providers


def is_passthrough(params: dict[str, Any]) -> bool:
    return _is_passthrough_model(str(params["model"]), params.get("custom_llm_provider"), params.get("api_base"))
