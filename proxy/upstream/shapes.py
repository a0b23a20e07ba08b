"""LiteLLM's response objects as OpenAI's wire JSON: what LiteLLM adds is dropped, what OpenAI sends is kept."""

from __future__ import annotations

from typing import Any

from proxy.types import Chunk, JSONObject

_NOISE_KEYS = ("provider_specific_fields", "citations")


def response_to_json(response: Any) -> JSONObject:
    """LiteLLM's ModelResponse as OpenAI's wire JSON."""
    data: JSONObject = response.model_dump(exclude_none=True)
    for key in _NOISE_KEYS:
        data.pop(key, None)
    for choice in data.get("choices", []):
        choice.pop("provider_specific_fields", None)
        message = choice.get("message")
        if isinstance(message, dict):
            extra = message.pop("provider_specific_fields", None) or {}
            if "refusal" in extra:
                message["refusal"] = extra["refusal"]
            message.setdefault("content", None)
    return data


def chunk_to_json(chunk: Any, include_usage: bool) -> Chunk | None:
    """One streamed chunk as OpenAI's wire JSON, or None when it must not be sent."""
    data: Chunk = chunk.model_dump(exclude_none=True)
    for key in _NOISE_KEYS:
        data.pop(key, None)
    usage = data.pop("usage", None)
    choices = data.get("choices", [])
    for choice in choices:
        choice.pop("provider_specific_fields", None)
        delta = choice.get("delta")
        if isinstance(delta, dict):
            delta.pop("provider_specific_fields", None)
    is_usage_chunk = usage is not None and all(not c.get("delta") and not c.get("finish_reason") for c in choices)
    if is_usage_chunk:
        if not include_usage:
            return None
        # OpenAI sends the usage chunk with an empty choices list; LiteLLM sends one empty choice.
        data["choices"] = []
        data["usage"] = usage
    return data
