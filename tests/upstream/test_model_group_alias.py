"""LiteLLM's ``router_settings.model_group_alias``, read from a real config file and used over HTTP: a request
for an alias is served by its target model group, and ``/v1/models`` lists the aliases not marked hidden.

LiteLLM (``Router._common_checks_available_deployment``, ``resolve_model_group_alias``) resolves an alias once,
before looking the name up among the model_names, in either form: ``{"gpt-4": "gpt-3.5-turbo"}`` or
``{"gpt-4": {"model": "gpt-3.5-turbo", "hidden": true}}`` (hidden: left out of the model list only)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config.loading import load_config
from proxy.errors import ConfigError
from proxy.upstream.routing import ModelRouter
from tests.support.fakes import FakeUpstream
from tests.support.proxies import UPSTREAM_KEY
from tests.support.servers import serve_in_thread

CONFIG = """
model_list:
  - model_name: gpt-3.5-turbo
    litellm_params: {{model: openai/small-model, api_base: "{url}/v1", api_key: {key}}}
  - model_name: gpt-4o
    litellm_params: {{model: openai/big-model, api_base: "{url}/v1", api_key: {key}}}
router_settings:
  model_group_alias: {aliases}
general_settings:
  data_dir: "{data}"
"""
ALIASES = '{"gpt-4": "gpt-3.5-turbo", "internal": {"model": "gpt-4o", "hidden": true}, "shown": {"model": "gpt-4o"}}'


def write_config(tmp_path: Path, upstream_url: str, aliases: str = ALIASES) -> Path:
    path = tmp_path / "litellm.yaml"
    text = CONFIG.format(url=upstream_url, key=UPSTREAM_KEY, data=tmp_path / "data", aliases=aliases)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def aliased_proxy(tmp_path: Path, upstream_url: str) -> Iterator[str]:
    config = load_config(write_config(tmp_path, upstream_url))
    with serve_in_thread(create_app(config)) as url:
        yield f"{url}/v1"


@pytest.mark.parametrize(
    ("asked", "served_by"),
    [("gpt-4", "small-model"), ("internal", "big-model"), ("shown", "big-model"), ("gpt-4o", "big-model")],
)
def test_a_request_for_an_alias_goes_to_its_target_group(
    aliased_proxy: str, fake_upstream: FakeUpstream, asked: str, served_by: str
) -> None:
    """It was a 404 model_not_found: the alias was dropped as "a LiteLLM setting lcm-proxy does not use"."""
    body: dict[str, Any] = {"model": asked, "messages": [{"role": "user", "content": "hello"}]}
    response = httpx.post(f"{aliased_proxy}/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert [r.body["model"] for r in fake_upstream.requests] == [served_by]
    streamed = httpx.post(f"{aliased_proxy}/chat/completions", json={**body, "stream": True}, timeout=30)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert fake_upstream.last.body["model"] == served_by


def test_the_model_list_shows_the_aliases_not_hidden(aliased_proxy: str, tmp_path: Path, upstream_url: str) -> None:
    warnings = load_config(write_config(tmp_path, upstream_url)).warnings
    assert not any("model_group_alias" in w for w in warnings), warnings  # used, not ignored
    response = httpx.get(f"{aliased_proxy}/models", timeout=30)
    assert [m["id"] for m in response.json()["data"]] == ["gpt-3.5-turbo", "gpt-4o", "gpt-4", "shown"]


def test_an_alias_resolves_once_and_wins_over_a_model_name(tmp_path: Path, upstream_url: str) -> None:
    """As in LiteLLM: the alias is looked up first, and its target is not looked up as an alias again."""
    aliases = '{"gpt-4o": "gpt-3.5-turbo", "gpt-3.5-turbo": "gpt-4o", "again": "gpt-4o"}'
    config = load_config(write_config(tmp_path, upstream_url, aliases))
    general = config.general_settings
    router = ModelRouter(config.model_list, general.fallbacks, general.model_group_alias)
    assert router.resolve("gpt-4o").upstream_model == "openai/small-model"
    assert router.resolve("gpt-3.5-turbo").upstream_model == "openai/big-model"
    assert router.resolve("again").upstream_model == "openai/big-model"  # again -> gpt-4o, not on to gpt-3.5-turbo
    assert router.resolve("again").alias == "again"  # errors and logs name the model the client asked for
    assert router.public_names() == ["gpt-3.5-turbo", "gpt-4o", "again"]


def test_fallbacks_of_an_alias_are_its_own_else_its_targets(tmp_path: Path, upstream_url: str) -> None:
    config = load_config(write_config(tmp_path, upstream_url, '{"gpt-4": "gpt-3.5-turbo", "big": "gpt-4o"}'))
    general = config.general_settings
    fallbacks = [{"gpt-3.5-turbo": ["gpt-4o"]}, {"big": ["gpt-3.5-turbo"]}]
    router = ModelRouter(config.model_list, fallbacks, general.model_group_alias)
    assert router.fallbacks_of("gpt-4") == ["gpt-4o"]
    assert [t[0].upstream_model for t in router.resolve("gpt-4").chain()] == ["openai/small-model", "openai/big-model"]
    assert router.fallbacks_of("big") == ["gpt-3.5-turbo"]


@pytest.mark.parametrize(
    ("aliases", "expected"),
    [
        ('{"gpt-5": "gpt-5-turbo"}', "router_settings.model_group_alias.gpt-5: 'gpt-5-turbo' is not a model_name"),
        ('{"gpt-5": {"hidden": true}}', "router_settings.model_group_alias: entry 'gpt-5': expected a model_name"),
        ('{"gpt-5": {"model": "gpt-4o", "hiden": true}}', "router_settings.model_group_alias: entry 'gpt-5'"),
        ('["gpt-4o"]', "router_settings.model_group_alias: Input should be a valid dictionary"),
    ],
)
def test_a_bad_alias_is_an_error_naming_it(tmp_path: Path, upstream_url: str, aliases: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path, upstream_url, aliases))
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_check_config_names_each_groups_aliases(tmp_path: Path, upstream_url: str) -> None:
    from proxy.cli.check_config import model_report

    lines = model_report(load_config(write_config(tmp_path, upstream_url)), windows=lambda model: 8192)
    aliases = [line.strip() for line in lines if line.strip().startswith("aliases:")]
    assert aliases == [
        "aliases:     gpt-4 (router_settings.model_group_alias)",
        "aliases:     internal (hidden from /v1/models), shown (router_settings.model_group_alias)",
    ]
