"""Token counts: every field of a message that reaches the model, and each model family's margin over o200k."""

from __future__ import annotations

from typing import Any

import pytest

from proxy import tokens
from proxy.config.loading import parse_config
from proxy.engine.budget import Budget
from proxy.upstream.routing import ModelRouter
from tests.support.transcripts import CODE


def test_a_legacy_function_call_counts_its_arguments() -> None:
    message = {"role": "assistant", "content": None, "function_call": {"name": "write_file", "arguments": CODE}}
    assert tokens.count_message(message) >= tokens.count_text(CODE) + tokens.count_text("write_file")


@pytest.mark.parametrize("field", ["name", "tool_call_id", "refusal", "reasoning_content", "thinking"])
def test_every_string_field_counts(field: str) -> None:
    text = "a field that the provider sends to the model " * 40
    bare = {"role": "assistant", "content": "ok"}
    assert tokens.count_message({**bare, field: text}) == tokens.count_message(bare) + tokens.count_text(text)


def test_role_is_only_the_overhead() -> None:
    assert tokens.count_message({"role": "user", "content": "hello"}) == tokens.MESSAGE_OVERHEAD + 1


def test_tool_call_ids_and_arguments_count() -> None:
    call_id = "call_" + "Zx9Qv7Lm" * 12
    call = {"id": call_id, "type": "function", "function": {"name": "read", "arguments": CODE}}
    counted = tokens.count_message({"role": "assistant", "content": None, "tool_calls": [call]})
    assert counted >= tokens.count_text(CODE) + tokens.count_text(call_id) + tokens.count_text("read")


def test_content_parts_are_counted_as_before() -> None:
    parts = [{"type": "text", "text": CODE}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    message = {"role": "user", "content": parts}
    assert tokens.count_message(message) == tokens.MESSAGE_OVERHEAD + tokens.count_text(CODE) + tokens.IMAGE_TOKENS


@pytest.mark.parametrize(
    ("model", "api_base", "margin"),
    [
        ("openai/gpt-4o", None, 1.0),
        ("gpt-4o-mini", None, 1.0),
        ("openai/gpt-4.1", None, 1.0),
        ("openai/gpt-5-mini", None, 1.0),
        ("openai/o3-mini", None, 1.0),
        ("o1", None, 1.0),
        ("azure/gpt-4o", "https://example.openai.azure.com", 1.0),
        ("openai/gpt-4-turbo", None, 1.02),
        ("openai/gpt-3.5-turbo", None, 1.02),
        ("openai/a-future-model", None, 1.02),
        ("azure/my-deployment", "https://example.openai.azure.com", 1.02),
        ("anthropic/claude-sonnet-4-5", None, 1.15),
        ("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", None, 1.15),
        ("gemini/gemini-2.5-pro", None, 1.25),
        ("openai/gemma-3-270m", "http://127.0.0.1:8080/v1", 1.25),
        ("openai/qwen2.5-0.5b", "http://127.0.0.1:8080/v1", 1.1),
        ("ollama/llama3", None, 1.1),
        ("groq/llama-3.3-70b-versatile", None, 1.1),
        ("ollama/llama2", None, 1.35),
        ("ollama/mistral", None, 1.35),
        ("mistral/open-mistral-nemo", None, 1.15),
        ("deepseek/deepseek-chat", None, 1.15),
        ("openai/local-model", "http://127.0.0.1:8080/v1", 1.1),
        ("hosted_vllm/some-org/some-model", "http://10.0.0.2:8000/v1", 1.1),
    ],
)
def test_family_margins(model: str, api_base: str | None, margin: float) -> None:
    found, source = tokens.token_margin(model, api_base)
    assert found == margin
    assert "model_info.token_margin" in source  # the setting that changes it


def test_a_configured_margin_wins() -> None:
    assert tokens.token_margin("anthropic/claude-sonnet-4-5", None, 1.4) == (1.4, "model_info.token_margin")
    assert tokens.token_margin("openai/gpt-4o", None, 1.0) == (1.0, "model_info.token_margin")


def _router(model_info: dict[str, Any]) -> ModelRouter:
    deployment = {"model_name": "m", "litellm_params": {"model": "openai/m"}, "model_info": model_info}
    return ModelRouter(parse_config({"model_list": [deployment]}).model_list)


def test_model_info_token_margin_reaches_the_resolved_model() -> None:
    assert _router({"token_margin": 1.3}).resolve("m").token_margin == 1.3
    assert _router({}).resolve("m").token_margin is None


@pytest.mark.parametrize("bad", [0.9, 3.5, "much"])
def test_model_info_token_margin_is_validated(bad: Any) -> None:
    with pytest.raises(Exception, match="token_margin"):
        _router({"token_margin": bad})


def test_the_margin_divides_the_window_less_the_reserve() -> None:
    """The reserve is the provider's tokens (off before the division); schemas and instructions are counted
    with o200k like the messages (off after it)."""
    plain = Budget(window=10_000, output_reserve=1000, tools=100)
    assert plain.for_messages(50) == 10_000 - 1000 - 100 - 50
    claude = Budget(window=10_000, output_reserve=1000, tools=100, margin=1.2, margin_source="Claude default")
    assert claude.counted_room == 7500
    assert claude.for_messages(50) == 7500 - 100 - 50
    assert "token margin 1.2 (Claude default)" in claude.arithmetic(50)
    assert "token margin" not in plain.arithmetic(50)


def test_only_a_requested_reserve_that_crowds_out_every_message_is_named() -> None:
    huge = Budget(window=8000, output_reserve=2**31, tools=0, reserve_source="max_tokens")
    assert huge.reserve_leaves_no_room(20)
    default = Budget(window=8000, output_reserve=2**31, tools=0, reserve_source="lcm_settings.default_output_reserve")
    assert not default.reserve_leaves_no_room(20)
    fits = Budget(window=8000, output_reserve=7000, tools=0, reserve_source="max_tokens")
    assert not fits.reserve_leaves_no_room(20)  # room left: a too-long message is the messages' problem
    schemas = Budget(window=8000, output_reserve=100, tools=9000, reserve_source="max_tokens")
    assert not schemas.reserve_leaves_no_room(20)  # the schemas alone overflow: lowering max_tokens cannot help
