"""Bearer authentication and the secure default bind address."""

from __future__ import annotations

import logging
from typing import Any

import openai
import pytest

from proxy.config.settings import GeneralSettings
from tests.support.fakes import FakeUpstream
from tests.support.proxies import UPSTREAM_KEY, AppProxy

KEYS = [{"key": "sk-proxy-alice-000000", "tenant": "alice"}, {"key": "sk-proxy-bob-1111111", "tenant": "bob"}]
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def module_keyed(module_app_factory: Any) -> AppProxy:
    """One proxy with keys for the module's checks of who may chat: a refused request stores nothing, and an
    accepted one a conversation no other check reads."""
    return module_app_factory(api_keys=KEYS)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"authorization": "Bearer wrong-key-123"}, 401),
        ({"authorization": "Basic c2stcHJveHk="}, 401),
        ({"authorization": "Bearer"}, 401),
        ({"authorization": "Bearer sk-proxy-alice-000000"}, 200),
        ({"authorization": "bearer sk-proxy-bob-1111111"}, 200),
        ({"x-api-key": "sk-proxy-bob-1111111"}, 200),
    ],
)
def test_chat_requires_a_configured_key(
    module_keyed: AppProxy, fake_upstream: FakeUpstream, headers: dict[str, str], status: int
) -> None:
    proxy = module_keyed
    response = proxy.client.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers, timeout=10)
    assert response.status_code == status, response.text
    if status == 401:
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["x-should-retry"] == "false"
        assert "wrong-key" not in response.text
        assert fake_upstream.requests == []


def test_models_requires_key_and_healthz_does_not(app_factory: Any) -> None:
    proxy = app_factory(api_keys=KEYS)
    assert proxy.client.get(f"{proxy.base_url}/models", timeout=10).status_code == 401
    assert proxy.client.get(f"{proxy.url}/healthz", timeout=10).json()["status"] == "ok"
    sdk = openai.OpenAI(
        base_url=proxy.base_url, api_key="sk-proxy-alice-000000", max_retries=0, http_client=proxy.client
    )
    assert [m.id for m in sdk.models.list()] == ["test-model", "unreachable"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=proxy.base_url, api_key="nope-nope-nope", max_retries=0, http_client=proxy.client
        ).models.list()


def test_bind_host_defaults() -> None:
    assert GeneralSettings().bind_host() == "127.0.0.1"
    assert GeneralSettings(api_keys=KEYS).bind_host() == "0.0.0.0"
    assert GeneralSettings(host="10.1.2.3").bind_host() == "10.1.2.3"


def test_keys_never_logged(app_factory: Any, fake_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = app_factory(api_keys=KEYS)
    proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        json=CHAT,
        headers={"authorization": "Bearer sk-proxy-alice-000000"},
    )
    proxy.client.post(
        f"{proxy.base_url}/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-guess-99999999"}
    )
    text = caplog.text
    assert "model test-model -> openai/fake-model" in text  # startup log happened and was captured
    for secret in ("sk-proxy-alice-000000", "sk-proxy-bob-1111111", "sk-guess-99999999", UPSTREAM_KEY):
        assert secret not in text
