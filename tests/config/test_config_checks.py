"""Config mistakes a new user makes, caught before the first request: each is an error naming the key, or a
warning (near-miss keys LiteLLM would ignore, duplicate model names), never a silent fallback."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.config.loading import load_config, parse_config
from proxy.errors import ConfigError
from proxy.upstream.routing import ModelRouter, upstream_of

MODEL = {"model_name": "m", "litellm_params": {"model": "openai/m"}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.problems


def test_a_summary_model_no_request_could_reach_is_a_config_error() -> None:
    """It used to pass check-config and serve, then every request got a 404 naming ``model``."""
    found = problems({"model_list": [MODEL], "lcm_settings": {"summary_model": "summarizer"}})
    assert found == [
        "lcm_settings.summary_model: 'summarizer' is not a model_name in model_list (nor matched by a wildcard"
        " model_name)"
    ]
    # Resolved with the router's own rules: a wildcard entry serves it.
    wildcard = {"model_name": "openai/*", "litellm_params": {"model": "openai/*"}}
    config = parse_config({"model_list": [MODEL, wildcard], "lcm_settings": {"summary_model": "openai/gpt-4o-mini"}})
    assert ModelRouter(config.model_list).resolve("openai/gpt-4o-mini").upstream_model == "openai/gpt-4o-mini"
    assert problems({"model_list": [MODEL, wildcard], "lcm_settings": {"summary_model": "claude-3"}})


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        ("retrieval_tools: off", "retrieval_tools", "off"),
        ("retrieval_tools: no", "retrieval_tools", "off"),
        ("retrieval_tools: on", "retrieval_tools", "auto"),
        ("retrieval_tools: ALWAYS", "retrieval_tools", "always"),
        ("auto_recall: off", "auto_recall", "off"),
        ("auto_recall: yes", "auto_recall", "auto"),
        ("background_yields: off", "background_yields", "never"),
        ("background_yields: on", "background_yields", "auto"),
    ],
)
def test_unquoted_on_off_is_accepted(tmp_path: Path, line: str, key: str, expected: str) -> None:
    """YAML 1.1 reads an unquoted ``off`` as false: the setting's off value, not a type error."""
    path = write(
        tmp_path, f"model_list: [{{model_name: m, litellm_params: {{model: openai/m}}}}]\nlcm_settings:\n  {line}\n"
    )
    assert getattr(load_config(path).lcm_settings, key) == expected


def test_log_level_in_any_case() -> None:
    config = parse_config({"model_list": [MODEL], "general_settings": {"log_level": "INFO"}})
    assert config.general_settings.log_level == "info"
    assert problems({"model_list": [MODEL], "general_settings": {"log_level": "LOUD"}})[0].startswith(
        "general_settings.log_level: Input should be"
    )


def test_near_miss_keys_in_model_info_and_litellm_params_are_warnings() -> None:
    """LiteLLM allows extra keys there, so they stay allowed; a near miss of one that matters is a warning
    (``max_input_token`` silently left the window at 128,000)."""
    config = parse_config(
        {
            "model_list": [
                {
                    "model_name": "m",
                    "litellm_params": {"model": "openai/m", "api_bse": "http://h/v1", "api_version": "x", "rpm": 5},
                    "model_info": {"max_input_token": 4096, "input_cost_per_token": 0.1, "custom_field": 1},
                }
            ]
        }
    )
    assert config.warnings == [
        "model_list[0].litellm_params.api_bse: unknown key; did you mean api_base?",
        "model_list[0].model_info.max_input_token: unknown key; did you mean max_input_tokens?",
    ]
    assert config.model_list[0].model_info.max_input_tokens is None  # still a warning, not a guess
    assert parse_config({"model_list": [MODEL]}).warnings == []


def test_yaml_errors_name_the_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "model_list:\n  - model_name: m\n    litellm_params: {model: x\nlcm_settings: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert "<unicode string>" not in text
    assert f"{path}, line 4, column 13" in text, text


def test_a_model_name_with_two_wildcards_is_an_error() -> None:
    found = problems({"model_list": [{"model_name": "a*b*", "litellm_params": {"model": "openai/*"}}]})
    assert found == [
        "model_list[0].model_name: at most one '*' is allowed (it stands for the rest of the requested name)"
    ]


def test_duplicate_model_names_are_deployments_of_one_model_and_a_copy_warns() -> None:
    other = {"model_name": "m", "litellm_params": {"model": "openai/other"}}
    config = parse_config({"model_list": [MODEL, other, dict(MODEL)]})
    assert config.warnings == [
        "model_list[2]: the same deployment as model_list[0] (model_name 'm', the same litellm_params): it gets a"
        " second share of the requests"
    ]
    resolved = ModelRouter(config.model_list).resolve("m")
    assert [c.upstream_model for c in resolved.candidates()] == ["openai/m", "openai/other", "openai/m"]


def test_an_unknown_key_in_our_sections_names_the_likely_one() -> None:
    found = problems({"model_list": [MODEL], "lcm_settings": {"retrival_tools": "off"}})
    assert found == ["lcm_settings.retrival_tools: unknown key; did you mean retrieval_tools?"]


def test_the_upstream_named_in_logs_and_reports_carries_no_credential() -> None:
    config = parse_config(
        {
            "model_list": [
                {
                    "model_name": "m",
                    "litellm_params": {
                        "model": "openai/m",
                        "api_base": "https://user:pa55word@llm.example:8443/v1?key=sk-in-query#x",
                        "api_key": "sk-never-shown-123",
                    },
                },
                {"model_name": "v6", "litellm_params": {"model": "openai/v6", "api_base": "http://[::1]:8080/v1"}},
                {"model_name": "hosted", "litellm_params": {"model": "anthropic/claude-sonnet-4-5"}},
            ]
        }
    )
    assert [upstream_of(d) for d in config.model_list] == [
        "openai/m at https://llm.example:8443/v1",
        "openai/v6 at http://[::1]:8080/v1",
        "anthropic/claude-sonnet-4-5",
    ]
