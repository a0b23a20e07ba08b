"""Token counting with tiktoken, offline, and the margin by which a model's own tokenizer may count more.

LiteLLM ships tiktoken's encoding files; pointing ``TIKTOKEN_CACHE_DIR`` at them before the first
``get_encoding`` keeps a fresh process from trying to download them. The folder is found without importing
LiteLLM (the engine must not depend on it). If no encoding can be loaded, a character estimate is used.

Every model is counted with o200k: a message is counted once, when it is stored, and the same conversation
may be continued with another model. Other tokenizers count the same text differently (Claude's, Gemma's
and the older 32k SentencePiece vocabularies count code noticeably higher), so each model also has a
``token_margin``: how much more its own tokenizer may count than o200k. ``proxy.engine.budget.Budget``
divides the window by it, so "within budget" holds by the provider's count too.
"""

from __future__ import annotations

import importlib.util
import os
import re
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
    """Tokens of everything in ``message`` that can reach the model: every field but ``role`` (which the
    overhead stands for), so that a legacy ``function_call``, a ``name``, a ``refusal`` or a provider's own
    field such as ``reasoning_content`` is never free. Tool calls' ids count too: providers replay them."""
    tokens = MESSAGE_OVERHEAD
    for key, value in message.items():
        if key == "role":
            continue
        if key == "tool_calls" and isinstance(value, list):
            for call in value:
                if isinstance(call, dict):
                    tokens += count_value({k: v for k, v in call.items() if k != "type"}) + 3
                    tokens += count_value(call.get("id"))
            continue
        tokens += count_value(value)
    return tokens


def count_messages(messages: list[dict[str, Any]]) -> int:
    return sum(count_message(m) for m in messages) + 3


# (pattern on the LiteLLM model string, margin, family), first match wins. A family's margin covers what its
# tokenizer counts above o200k on code, the worst case, with room to spare; override per deployment with
# ``model_info.token_margin``.
FAMILY_MARGINS: tuple[tuple[re.Pattern[str], float, str], ...] = tuple(
    (re.compile(pattern), margin, family)
    for pattern, margin, family in (
        # o200k itself: the count is exact.
        (r"gpt-4o|gpt-4\.[15]|gpt-5|chatgpt|gpt-oss|codex|(^|/)o[134](-|$)", 1.0, "OpenAI o200k"),
        (r"gpt-4|gpt-3\.5|davinci|babbage", 1.02, "OpenAI cl100k"),
        (r"claude", 1.15, "Claude"),
        (r"gemini|gemma", 1.25, "Gemini/Gemma"),
        (r"nemo|ministral|pixtral|devstral|magistral|mistral-(small|medium)", 1.15, "Mistral Tekken"),
        # 32k SentencePiece vocabularies (Llama 2, Mistral 7B and Large, Mixtral, Phi-3) split code finely.
        (r"llama-?2(?![\d.])|codellama|mistral|mixtral|codestral|phi-?3", 1.35, "32k SentencePiece"),
        (r"deepseek", 1.15, "DeepSeek"),
        (r"qwen|qwq", 1.1, "Qwen"),
        (r"llama", 1.1, "Llama"),
    )
)
OPENAI_MARGIN = 1.02  # another OpenAI model: o200k or cl100k, which counts within a few percent of it
UNKNOWN_MARGIN = 1.1  # a model whose tokenizer is unknown, e.g. a local one behind an OpenAI-compatible api_base


def token_margin(model: str, api_base: str | None = None, configured: float | None = None) -> tuple[float, str]:
    """How much more than o200k the tokenizer of LiteLLM model ``model`` may count, and where that came from:
    ``configured`` (the deployment's ``model_info.token_margin``), else its family's default. An ``openai/``
    or ``azure/`` model of no known family is OpenAI's own unless its ``api_base`` is someone else's server."""
    if configured is not None:
        return configured, "model_info.token_margin"
    name = model.lower()
    for pattern, margin, family in FAMILY_MARGINS:
        if pattern.search(name):
            return margin, f"{family} default; set model_info.token_margin"
    provider = name.partition("/")[0] if "/" in name else "openai"
    official = api_base is None or "openai.com" in api_base or provider == "azure"
    if provider in ("openai", "azure") and official:
        return OPENAI_MARGIN, "OpenAI default; set model_info.token_margin"
    return UNKNOWN_MARGIN, "unknown tokenizer; set model_info.token_margin"
