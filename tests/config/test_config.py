"""YAML configuration: LiteLLM-compatible model_list, env references, errors that name the key path."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.config.lcm import LcmSettings
from proxy.config.loading import load_config, parse_config
from proxy.engine import budget
from proxy.errors import ConfigError, NotFoundError
from proxy.upstream.routing import ModelRouter
from tests.support import REPO

# A model_list copied from LiteLLM proxy's documentation, with its usual extras, pasted unchanged.
LITELLM_MODEL_LIST = """
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: azure/my_azure_deployment
      api_base: os.environ/AZURE_API_BASE
      api_key: "os.environ/AZURE_API_KEY"
      api_version: "2025-01-01-preview"
      rpm: 6
    model_info:
      id: my-unique-id
      mode: chat
      base_model: azure/gpt-4o
      input_cost_per_token: 0.0000025
      max_input_tokens: 128000
  - model_name: bedrock-claude-v1
    litellm_params:
      model: bedrock/anthropic.claude-instant-v1
      aws_region_name: us-west-2
      timeout: 30
      stream_timeout: 60
      tpm: 100000
  - model_name: "*"
    litellm_params:
      model: "openai/*"
      api_key: os.environ/OPENAI_API_KEY
  - model_name: "anthropic/*"
    litellm_params:
      model: "anthropic/*"
      api_key: os.environ/ANTHROPIC_API_KEY
"""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "AZURE_API_BASE": "https://example.invalid",
        "AZURE_API_KEY": "az-secret",
        "OPENAI_API_KEY": "oa-secret",
        "ANTHROPIC_API_KEY": "an-secret",
    }.items():
        monkeypatch.setenv(name, value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_litellm_model_list_loads_unchanged(tmp_path: Path, env: None) -> None:
    config = load_config(write(tmp_path, LITELLM_MODEL_LIST))
    first = config.model_list[0]
    assert first.litellm_params.api_key == "az-secret"
    assert first.litellm_params.api_base == "https://example.invalid"
    assert first.model_info.max_input_tokens == 128000
    assert first.litellm_params.model_dump()["api_version"] == "2025-01-01-preview"


def test_wildcard_routing(tmp_path: Path, env: None) -> None:
    router = ModelRouter(load_config(write(tmp_path, LITELLM_MODEL_LIST)).model_list)
    assert router.resolve("gpt-4o").upstream_model == "azure/my_azure_deployment"
    assert router.resolve("gpt-4o").max_input_tokens == 128000
    assert router.resolve("anthropic/claude-3-haiku").upstream_model == "anthropic/claude-3-haiku"
    assert router.resolve("anthropic/claude-3-haiku").litellm_params["api_key"] == "an-secret"
    assert router.resolve("gpt-4.1-mini").upstream_model == "openai/gpt-4.1-mini"
    assert router.public_names() == ["gpt-4o", "bedrock-claude-v1"]


def test_without_wildcard_unknown_model_is_not_found() -> None:
    router = ModelRouter(
        parse_config({"model_list": [{"model_name": "a", "litellm_params": {"model": "openai/a"}}]}).model_list
    )
    with pytest.raises(NotFoundError) as info:
        router.resolve("b")
    assert info.value.code == "model_not_found" and info.value.param == "model"


def test_env_references_resolve_recursively(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K1", "sk-key-one-123")
    monkeypatch.setenv("PORT_ENV", "8123")
    config = parse_config(
        {
            "model_list": [
                {
                    "model_name": "m",
                    "litellm_params": {"model": "openai/m", "extra_headers": {"x": "os.environ/K1"}},
                }
            ],
            "general_settings": {
                "api_keys": [{"key": "os.environ/K1", "tenant": "t"}],
                "port": "os.environ/PORT_ENV",
            },
        }
    )
    assert config.general_settings.api_keys[0].key == "sk-key-one-123"
    assert config.general_settings.port == 8123
    assert config.model_list[0].litellm_params.model_dump()["extra_headers"] == {"x": "sk-key-one-123"}


def test_missing_env_variable_names_path_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "model_list": [
                    {
                        "model_name": "m",
                        "litellm_params": {"model": "m", "api_key": "os.environ/NOPE_NOT_SET"},
                    }
                ]
            }
        )
    assert info.value.problems == ["model_list[0].litellm_params.api_key: environment variable NOPE_NOT_SET is not set"]


MINIMAL = {"model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m"}}]}


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"lcm_settings": {"context_treshold": 0.5}}, "lcm_settings.context_treshold: unknown key"),
        ({"general_settings": {"prot": 1}}, "general_settings.prot: unknown key"),
        ({"lcm_setting": {}}, "lcm_setting: unknown key; did you mean lcm_settings?"),
        ({"general_settings": {"master_kee": "sk-12345678"}}, "general_settings.master_kee: unknown key"),
        ({"lcm_settings": {"context_threshold": 1.5}}, "lcm_settings.context_threshold: Input should be less than or equal to 1"),
        ({"lcm_settings": {"fresh_tail_count": "many"}}, "lcm_settings.fresh_tail_count: Input should be a valid integer"),
        ({"lcm_settings": {"retrieval_tools": "sometimes"}}, "lcm_settings.retrieval_tools: Input should be 'auto', 'always' or 'off'"),
        ({"general_settings": {"port": 70000}}, "general_settings.port: Input should be less than or equal to 65535"),
        ({"general_settings": {"api_keys": [{"key": "", "tenant": "a"}]}}, "general_settings.api_keys[0].key: String should have at least 1 character"),
        ({"general_settings": {"api_keys": [{"key": "longenough1", "tenant": "bad tenant"}]}}, "general_settings.api_keys[0].tenant: String should match pattern"),
        ({"model_list": []}, "model_list: List should have at least 1 item"),
        ({"model_list": [{"model_name": "m"}]}, "model_list[0].litellm_params: required key is missing"),
        ({"model_list": [{"model_name": "m", "litellm_params": {"model": "x"}, "extra": 1}]}, "model_list[0].extra: unknown key"),
        ({"model_list": [{"model_name": "m", "litellm_params": {"model": "x"}, "model_info": {"max_input_tokens": -5}}]}, "model_list[0].model_info.max_input_tokens: Input should be greater than 0"),
        ({"lcm_settings": {"tool_result_token_threshold": 30000, "large_file_token_threshold": 25000}}, "lcm_settings: tool_result_token_threshold must not exceed"),
    ],
)  # fmt: skip
def test_bad_config_names_the_key_path(patch: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, **patch})
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_yaml_syntax_error_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "model_list: [\n"))


def test_example_config_is_valid_and_has_defaults() -> None:
    config = load_config(REPO / "config" / "proxy.yaml")
    assert config.model_list[0].model_name == "local"
    assert config.lcm_settings == LcmSettings(context_threshold=0.75, fresh_tail_count=32)
    assert config.general_settings.bind_host() == "127.0.0.1"


def test_lcm_defaults_match_design() -> None:
    """docs/architecture.md's sizes are the large-model defaults; unset, each one scales down with a smaller window."""
    s = LcmSettings()
    assert (s.context_threshold, s.fresh_tail_count, s.leaf_min_fanout, s.condensed_min_fanout) == (0.75, 32, 8, 4)
    assert s.summary_model is None and s.auto_recall == "auto"
    large = budget.sizes(s, 120_000)
    assert (large.leaf_chunk, large.leaf_target, large.condensed_target) == (20000, 1200, 2000)
    assert (large.fallback, large.large_file, large.tool_result) == (512, 25000, 2000)
    small = budget.sizes(s, 1536)  # a 2,048-token model with a 512-token reserve
    # A 5,800-token paste is stubbed, not refused; summaries and chunks fit the window.
    assert small.large_file < 5800 and small.tool_result <= small.large_file
    assert small.leaf_target + small.condensed_target < small.context // 2
    assert small.leaf_chunk <= small.context and small.recall + small.context == small.limit
    assert small.target <= small.soft <= small.context
    # A value set in the configuration is used as it is.
    assert budget.sizes(LcmSettings(leaf_target_tokens=300), 1536).leaf_target == 300


def test_unset_variables_and_other_problems_are_reported_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """One run of check-config lists everything to fix: unset variables and unknown keys alike, without a
    second complaint about the reference left in an integer field."""
    monkeypatch.delenv("NOPE_KEY", raising=False)
    monkeypatch.delenv("NOPE_PORT", raising=False)
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "model_list": [
                    {"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "os.environ/NOPE_KEY"}}
                ],
                "general_settings": {"port": "os.environ/NOPE_PORT", "prot": 1},
                "lcm_settings": {"fresh_tail": 3},
            }
        )
    assert sorted(info.value.problems) == sorted(
        [
            "model_list[0].litellm_params.api_key: environment variable NOPE_KEY is not set",
            "general_settings.port: environment variable NOPE_PORT is not set",
            "general_settings.prot: unknown key; did you mean port?",
            "lcm_settings.fresh_tail: unknown key; did you mean fresh_tail_count?",
        ]
    )
