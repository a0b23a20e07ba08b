"""Token counting with tiktoken, offline.

LiteLLM ships tiktoken's encoding files; pointing ``TIKTOKEN_CACHE_DIR`` at them before the first
``get_encoding`` keeps a fresh process from trying to download them. The folder is found without importing
LiteLLM (the engine must not depend on it). If no encoding can be loaded, a character estimate is used.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

# Rough prices of non-text parts, close to what OpenAI bills: an image at "auto" detail, a file per byte.
IMAGE_TOKENS = 765
MESSAGE_OVERHEAD = 4
EXACT_LIMIT_CHARS = 400_000
SAMPLE_CHARS = 100_000


def _bundled_tiktoken_dir() -> str | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return str(folder) if folder.is_dir() else None


@lru_cache(maxsize=1)
def _encoding() -> Any:
    bundled = _bundled_tiktoken_dir()
    if bundled and "TIKTOKEN_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = bundled
    try:
        import tiktoken

        return tiktoken.get_encoding("o200k_base")
    except Exception:
        return None


def count_text(text: str) -> int:
    if not text:
        return 0
    encoding = _encoding()
    if encoding is None:
        return (len(text) + 3) // 4
    if len(text) > EXACT_LIMIT_CHARS:
        # Huge payloads: extrapolate from a sample instead of tokenizing megabytes on the request path.
        sample = len(encoding.encode(text[:SAMPLE_CHARS], disallowed_special=()))
        return sample * len(text) // SAMPLE_CHARS
    return len(encoding.encode(text, disallowed_special=()))


def at_least(text: str, threshold: int) -> bool:
    """Whether ``text`` has at least ``threshold`` tokens, without tokenizing all of a huge string."""
    if len(text) < threshold:  # a token is at least one character
        return False
    # Tokens are rarely longer than ~8 characters; a prefix of 8x the threshold decides nearly every case.
    return count_text(text[: threshold * 8]) >= threshold


def count_value(value: Any) -> int:
    """Tokens of a message's content (string or parts) or of any JSON-ish value."""
    if isinstance(value, str):
        return count_text(value)
    if isinstance(value, list):
        return sum(count_value(v) for v in value)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "image_url":
            return IMAGE_TOKENS
        if kind in ("file", "input_audio"):
            payload = value.get(kind)
            data = (payload.get("file_data") or payload.get("data") or "") if isinstance(payload, dict) else ""
            return max(1, len(str(data)) * 3 // 4 // 16)  # decoded bytes / 16: a rough, stable estimate
        return sum(count_value(v) for k, v in value.items() if k not in ("type", "id", "index"))
    return 0


def count_message(message: dict[str, Any]) -> int:
    tokens = MESSAGE_OVERHEAD + count_value(message.get("content"))
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            tokens += count_value({k: v for k, v in call.items() if k != "type"}) + 3
    return tokens


def count_messages(messages: list[dict[str, Any]]) -> int:
    return sum(count_message(m) for m in messages) + 3
