"""A real LiteLLM proxy config is read, not refused key by key: what maps is used, every other LiteLLM key is
ignored with one warning naming it, and a key that is neither ours nor LiteLLM's is still an error."""

from __future__ import annotations

import inspect
import os
import textwrap
import typing
from pathlib import Path

import pytest

from proxy.config import load_config, parse_config
from proxy.config_compat import model_key_warnings
from proxy.errors import ConfigError
from proxy.litellm_keys import LITELLM_GENERAL_SETTINGS, LITELLM_SECTIONS

# Shaped like LiteLLM's documented proxy config (docs.litellm.ai, "Proxy Config.yaml").
LITELLM_CONFIG = """
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_key: os.environ/OPENAI_API_KEY
      rpm: 60
litellm_settings:
  drop_params: true
  success_callback: ["langfuse"]
  request_timeout: 45
router_settings:
  routing_strategy: usage-based-routing-v2
  redis_host: os.environ/REDIS_HOST
general_settings:
  master_key: sk-1234567890abcdef
  database_url: sqlite:///{data}
  alerting: ["slack"]
  proxy_batch_write_at: 60
environment_variables:
  OPENAI_API_KEY: sk-from-the-config-file
  SLACK_WEBHOOK_URL: https://hooks.example/x
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "litellm.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_litellm_proxy_config_loads_with_what_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("REDIS_HOST", raising=False)  # referenced only inside an ignored section
    config = load_config(_write(tmp_path, LITELLM_CONFIG.format(data=tmp_path / "store")))
    general = config.general_settings
    assert [(k.key, k.tenant) for k in general.api_keys] == [("sk-1234567890abcdef", "master")]
    assert general.resolved_data_dir() == tmp_path / "store"
    assert general.request_timeout == 45
    # environment_variables answer the file's own os.environ/ references.
    assert config.model_list[0].litellm_params.api_key == "sk-from-the-config-file"
    assert config.warnings == [
        "litellm_settings: ignored (a LiteLLM proxy setting that lcm-proxy does not use): drop_params,"
        " success_callback",
        "router_settings: ignored (a LiteLLM proxy setting that lcm-proxy does not use): routing_strategy, redis_host",
        "general_settings.alerting: ignored (a LiteLLM proxy setting that lcm-proxy does not use)",
        "general_settings.proxy_batch_write_at: ignored (a LiteLLM proxy setting that lcm-proxy does not use)",
        "environment_variables.SLACK_WEBHOOK_URL: not referenced by any os.environ/SLACK_WEBHOOK_URL in this file;"
        " lcm-proxy does not export it to the process (set it in the environment instead)",
    ]


def test_the_real_environment_wins_over_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_KEY", "sk-from-the-environment")
    config = parse_config(
        {
            "model_list": [
                {"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "os.environ/UP_KEY"}}
            ],
            "environment_variables": {"UP_KEY": "sk-from-the-file"},
        }
    )
    assert config.model_list[0].litellm_params.api_key == "sk-from-the-environment"


@pytest.mark.parametrize(
    ("url", "data_dir"),
    [
        ("sqlite:////srv/lcm", "/srv/lcm"),
        ("sqlite:////srv/lcm/litellm.db", "/srv/lcm"),
        ("sqlite:///rel/dir", "rel/dir"),
    ],
)
def test_database_url_sqlite_is_the_data_directory(url: str, data_dir: str) -> None:
    model = {"model_name": "m", "litellm_params": {"model": "openai/m"}}
    config = parse_config({"model_list": [model], "general_settings": {"database_url": url}})
    assert config.general_settings.data_dir == Path(data_dir)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@db:5432/litellm", "postgresql://u:p@db:5432/litellm"),
        ("postgres://u@db/x", "postgres://u@db/x"),
        ("postgresql+psycopg://u@db/x", "postgresql://u@db/x"),  # SQLAlchemy's form loses its driver
    ],
)
def test_database_url_postgresql_selects_the_postgresql_store(url: str, expected: str) -> None:
    model = {"model_name": "m", "litellm_params": {"model": "openai/m"}}
    config = parse_config({"model_list": [model], "general_settings": {"database_url": url}})
    assert config.general_settings.database_url == expected
    assert config.general_settings.location().kind == "postgresql"
    assert "p@" not in config.general_settings.location().describe()  # no password in what is shown


@pytest.mark.parametrize(
    ("general", "expected"),
    [
        ({"database_url": "postgresql://"}, "general_settings.database_url: expected postgresql://USER"),
        ({"database_url": "mysql://db/x"}, "general_settings.database_url: expected postgresql://USER"),
        ({"database_url": "sqlite:////a", "data_dir": "/b"}, "general_settings.database_url: names another place"),
        ({"master_key": 1234}, "general_settings.master_key: expected a string"),
        ({"master_key": "short"}, "general_settings.api_keys[0].key: String should have at least 8 characters"),
        ({"alerting_treshold": 3}, "general_settings.alerting_treshold: unknown key"),  # neither ours nor LiteLLM's
    ],
)
def test_what_does_not_map_is_an_error(general: dict[str, object], expected: str) -> None:
    model = {"model_name": "m", "litellm_params": {"model": "openai/m"}}
    with pytest.raises(ConfigError) as info:
        parse_config({"model_list": [model], "general_settings": general})
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_a_master_key_also_listed_in_api_keys_is_not_a_duplicate() -> None:
    model = {"model_name": "m", "litellm_params": {"model": "openai/m"}}
    general = {"master_key": "sk-shared-key-1", "api_keys": [{"key": "sk-shared-key-1", "tenant": "ops"}]}
    config = parse_config({"model_list": [model], "general_settings": general})
    assert [(k.key, k.tenant) for k in config.general_settings.api_keys] == [("sk-shared-key-1", "ops")]


@pytest.fixture(scope="module")
def litellm_types() -> typing.Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm
    from litellm.proxy import _types as proxy_types
    from litellm.types import router, utils

    return litellm, proxy_types, router, utils


def test_the_litellm_key_lists_cover_the_installed_litellm(litellm_types: typing.Any) -> None:
    """A LiteLLM release that adds a general_settings key or a section must not turn it into an error here."""
    _litellm, proxy_types, _router, _utils = litellm_types
    missing = set(proxy_types.ConfigGeneralSettings.model_fields) - LITELLM_GENERAL_SETTINGS
    assert not missing
    sections = set(proxy_types.ConfigYAML.model_fields) - {"model_list", "general_settings"}
    assert sections <= LITELLM_SECTIONS


def test_no_real_litellm_key_is_taken_for_a_typo(litellm_types: typing.Any) -> None:
    litellm, _proxy_types, router, utils = litellm_types
    params = set(router.LiteLLM_Params.model_fields) | set(inspect.signature(litellm.completion).parameters)
    info = set(typing.get_type_hints(utils.ModelInfo)) | set(router.ModelInfo.model_fields)
    assert model_key_warnings(0, sorted(params), sorted(info)) == []


def test_litellms_pool_limit_sizes_the_postgresql_pool() -> None:
    model = {"model_name": "m", "litellm_params": {"model": "openai/m"}}
    general = {"database_url": "postgresql://u@db/x", "database_connection_pool_limit": 40}
    config = parse_config({"model_list": [model], "general_settings": general})
    assert config.warnings == []  # ours now, not an ignored LiteLLM key
    store, _ = config.general_settings.location().stores()
    assert store.pool_size == 40  # type: ignore[attr-defined]
