"""CORS: off by default; ``general_settings.cors_allow_origins`` lets listed origins' pages call the proxy, with
the headers OpenAI's SDKs send, and nothing changes for anyone else."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.config.loading import parse_config
from proxy.errors import ConfigError
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy

APP = "https://app.example.com"
SDK_HEADERS = "authorization, content-type, x-stainless-os, x-stainless-retry-count, openai-organization, x-lcm-user"
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


def preflight(proxy: AppProxy, origin: str, headers: str = SDK_HEADERS) -> httpx.Response:
    return proxy.client.options(
        f"{proxy.url}/v1/chat/completions",
        headers={"origin": origin, "access-control-request-method": "POST", "access-control-request-headers": headers},
        timeout=20,
    )


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def test_off_by_default_on_for_a_listed_origin(app_factory: Any, fake_upstream: FakeUpstream) -> None:
    default = app_factory()
    response = preflight(default, APP)
    assert response.status_code == 405 and cors_headers(response) == {}  # an ordinary OPTIONS request
    # A cross-origin request the browser did not have to ask about first is refused (proxy.wire.guard), and
    # its refusal carries no CORS header either: the page cannot even read it.
    answered = default.client.post(
        f"{default.base_url}/chat/completions", json=CHAT, headers={"origin": APP}, timeout=20
    )
    assert answered.status_code == 403 and cors_headers(answered) == {}

    proxy = app_factory(cors_allow_origins=[APP, "http://localhost:5173"])
    response = preflight(proxy, APP)
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == APP
    assert "POST" in response.headers["access-control-allow-methods"]
    allowed = {h.strip() for h in response.headers["access-control-allow-headers"].split(",")}
    assert {h.strip() for h in SDK_HEADERS.split(",")} <= allowed
    assert {"x-api-key", "x-lcm-conversation-id"} <= allowed
    answered = proxy.client.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers={"origin": APP}, timeout=20)
    assert answered.status_code == 200
    assert answered.headers["access-control-allow-origin"] == APP
    exposed = {h.strip() for h in answered.headers["access-control-expose-headers"].split(",")}
    assert "x-lcm-conversation-id" in exposed and "x-lcm-tokens-sent" in exposed


def test_other_origins_get_no_cors_headers(app_factory: Any, fake_upstream: FakeUpstream) -> None:
    proxy = app_factory(cors_allow_origins=[APP])
    response = preflight(proxy, "https://evil.example.com")
    assert response.status_code == 405 and cors_headers(response) == {}
    answered = proxy.client.post(
        f"{proxy.base_url}/chat/completions", json=CHAT, headers={"origin": "https://evil.example.com"}, timeout=20
    )
    assert answered.status_code == 403 and cors_headers(answered) == {}
    assert answered.json()["error"]["code"] == "cross_origin_request"


def test_a_header_outside_the_list_is_refused(app_factory: Any) -> None:
    proxy = app_factory(cors_allow_origins=[APP])
    response = preflight(proxy, APP, "authorization, x-something-else")
    assert response.status_code == 400
    assert "x-something-else" not in response.headers.get("access-control-allow-headers", "")


def test_any_origin(app_factory: Any, fake_upstream: FakeUpstream) -> None:
    proxy = app_factory(cors_allow_origins=["*"])
    response = preflight(proxy, "https://anywhere.example")
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "*"
    # Errors in OpenAI's shape reach the page too: a browser client can read why it failed.
    refused = proxy.client.post(
        f"{proxy.base_url}/embeddings", json={"model": "test-model"}, headers={"origin": "https://a.b"}, timeout=20
    )
    assert refused.status_code == 400 and refused.headers["access-control-allow-origin"] == "*"
    assert "x-should-retry" in refused.headers["access-control-expose-headers"]


@pytest.mark.parametrize("origin", ["https://app.example.com/", "app.example.com", "https://a.com/path", ""])
def test_entries_must_be_origins(tmp_path: Any, origin: str) -> None:
    raw = {
        "model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": "http://127.0.0.1:1"}}],
        "general_settings": {"data_dir": str(tmp_path), "cors_allow_origins": [APP, origin]},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert "general_settings.cors_allow_origins" in str(info.value) and "entry 1" in str(info.value)


def test_origins_are_compared_in_lower_case(tmp_path: Any) -> None:
    raw = {
        "model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": "http://127.0.0.1:1"}}],
        "general_settings": {"data_dir": str(tmp_path), "cors_allow_origins": ["HTTPS://App.Example.com:8443"]},
    }
    assert parse_config(raw).general_settings.cors_allow_origins == ["https://app.example.com:8443"]
