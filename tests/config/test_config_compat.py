"""A real LiteLLM proxy config is read, not refused key by key: what maps is used, every other LiteLLM key is
ignored with one warning naming it, and a key that is neither ours nor LiteLLM's is still an error."""

from __future__ import annotations

import inspect
import os
import textwrap
import typing
from pathlib import Path

import pytest

from proxy.config.litellm_compat import model_key_warnings
from proxy.config.litellm_keys import LITELLM_GENERAL_SETTINGS, LITELLM_SECTIONS
from proxy.config.loading import load_config, parse_config
from proxy.errors import ConfigError

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
    assert general.drop_params is True and general.routing_strategy == "simple-shuffle"
    # environment_variables answer the file's own os.environ/ references.
    assert config.model_list[0].litellm_params.api_key == "sk-from-the-config-file"
    assert config.warnings == [
        "router_settings.routing_strategy: 'usage-based-routing-v2' is not implemented by lcm-proxy; simple-shuffle"
        " is used instead",
        "litellm_settings: ignored (a LiteLLM proxy setting that lcm-proxy does not use): success_callback",
        "router_settings: ignored (a LiteLLM proxy setting that lcm-proxy does not use): redis_host",
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
        ({"master_key": ""}, "general_settings.api_keys[0].key: String should have at least 1 character"),
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


# --- router_settings and litellm_settings that mean something here ------------------------------------------

ROUTED = {
    "model_list": [
        {"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o", "api_base": "http://127.0.0.1:1/v1"}},
        {"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o", "api_base": "http://127.0.0.1:2/v1"}},
        {"model_name": "mini", "litellm_params": {"model": "openai/gpt-4o-mini"}},
    ]
}


def test_router_and_litellm_settings_map_onto_general_settings() -> None:
    config = parse_config(
        {
            **ROUTED,
            "litellm_settings": {"num_retries": 3, "request_timeout": 45, "drop_params": True, "allowed_fails": 4},
            "router_settings": {
                "routing_strategy": "least-busy",
                "num_retries": 2,
                "timeout": 30,
                "fallbacks": [{"gpt-4o": ["mini"]}],
                "cooldown_time": 60,
                "model_group_alias": {"gpt-4": "gpt-4o"},
            },
        }
    )
    general = config.general_settings
    assert (general.routing_strategy, general.fallbacks) == ("least-busy", [{"gpt-4o": ["mini"]}])
    # The router's own settings win over the module's, as in LiteLLM.
    assert (general.upstream_retries, general.request_timeout) == (2, 30)
    assert (general.allowed_fails, general.cooldown_time, general.drop_params) == (4, 60, True)
    assert general.model_group_alias == {"gpt-4": "gpt-4o"}
    assert config.warnings == [
        "litellm_settings.num_retries: router_settings.num_retries (2) is used instead",
        "litellm_settings.request_timeout: router_settings.timeout (30) is used instead",
    ]


def test_general_settings_of_its_own_win_over_litellms() -> None:
    general = {"upstream_retries": 1, "request_timeout": 9, "routing_strategy": "simple-shuffle"}
    router = {"num_retries": 5, "timeout": 30, "routing_strategy": "least-busy"}
    config = parse_config({**ROUTED, "general_settings": general, "router_settings": router})
    assert config.general_settings.upstream_retries == 1 and config.general_settings.request_timeout == 9
    assert config.general_settings.routing_strategy == "simple-shuffle"
    assert config.warnings == []


@pytest.mark.parametrize(("retries", "used"), [(25, 10), (-1, 0)])
def test_num_retries_out_of_range_is_capped_with_a_warning(retries: int, used: int) -> None:
    config = parse_config({**ROUTED, "litellm_settings": {"num_retries": retries}})
    assert config.general_settings.upstream_retries == used
    assert config.warnings == [
        f"litellm_settings.num_retries: {retries} is outside general_settings.upstream_retries' range (0-10);"
        f" {used} is used"
    ]


@pytest.mark.parametrize("strategy", ["usage-based-routing", "latency-based-routing", "cost-based-routing"])
def test_other_litellm_routing_strategies_are_simple_shuffle_with_one_warning(strategy: str) -> None:
    config = parse_config({**ROUTED, "router_settings": {"routing_strategy": strategy}})
    assert config.general_settings.routing_strategy == "simple-shuffle"
    assert config.warnings == [
        f"router_settings.routing_strategy: {strategy!r} is not implemented by lcm-proxy; simple-shuffle is used"
        " instead"
    ]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"router_settings": {"routing_strategy": "least_busy"}},  # a typo, neither ours nor LiteLLM's
            "router_settings.routing_strategy: Input should be 'simple-shuffle' or 'least-busy'",
        ),
        (
            {"router_settings": {"fallbacks": [{"gpt-4o": ["mini", "gpt-4o-mni"]}]}},
            "router_settings.fallbacks[0].gpt-4o[1]: 'gpt-4o-mni' is not a model_name in model_list",
        ),
        (
            {"litellm_settings": {"fallbacks": [{"gpt4o": ["mini"]}]}},
            "litellm_settings.fallbacks[0]: 'gpt4o' is not a model_name in model_list",
        ),
        (
            {"router_settings": {"fallbacks": {"gpt-4o": ["mini"]}}},  # not LiteLLM's list of mappings
            "router_settings.fallbacks: Input should be a valid list",
        ),
        (
            {"router_settings": {"fallbacks": [{"gpt-4o": "mini"}]}},
            "router_settings.fallbacks[0].gpt-4o: Input should be a valid list",
        ),
        ({"router_settings": {"timeout": 0}}, "router_settings.timeout: Input should be greater than 0"),
        ({"general_settings": {"fallbacks": [{"mini": ["nope"]}]}}, "general_settings.fallbacks[0].mini[0]: 'nope'"),
    ],
)
def test_a_bad_mapped_value_is_an_error_naming_the_key_written(settings: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**ROUTED, **settings})
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_the_mapped_litellm_keys_are_litellms(litellm_types: typing.Any) -> None:
    """Each mapped key is one LiteLLM reads (a Router argument, a litellm module setting), and every routing
    strategy LiteLLM accepts is known here (an unknown one would be refused as a typo)."""
    from litellm import Router
    from litellm.router_utils.routing_groups import VALID_ROUTING_STRATEGIES

    from proxy.config.litellm_compat import MAX_UPSTREAM_RETRIES
    from proxy.config.litellm_keys import LITELLM_ROUTING_STRATEGIES, MAPPED_SETTINGS, ROUTING_STRATEGIES
    from proxy.config.settings import GeneralSettings

    litellm = litellm_types[0]
    router_args = set(inspect.signature(Router.__init__).parameters)
    for (section, key), ours in MAPPED_SETTINGS.items():
        assert key in router_args if section == "router_settings" else hasattr(litellm, key), (section, key)
        assert ours in GeneralSettings.model_fields
    assert set(VALID_ROUTING_STRATEGIES) <= LITELLM_ROUTING_STRATEGIES
    assert typing.get_args(GeneralSettings.model_fields["routing_strategy"].annotation) == ROUTING_STRATEGIES
    bounds = GeneralSettings.model_fields["upstream_retries"].metadata
    assert [b.le for b in bounds if hasattr(b, "le")] == [MAX_UPSTREAM_RETRIES]  # what num_retries is capped to


def test_drop_params_reaches_every_litellm_call() -> None:
    from proxy.config.settings import GeneralSettings
    from proxy.upstream.client import Upstream
    from proxy.upstream.routing import ModelRouter

    config = parse_config({**ROUTED, "litellm_settings": {"drop_params": True}})
    target = ModelRouter(config.model_list).resolve("mini")
    assert Upstream(config.general_settings).call_kwargs(target)[0]["drop_params"] is True
    assert "drop_params" not in Upstream(GeneralSettings()).call_kwargs(target)[0]
