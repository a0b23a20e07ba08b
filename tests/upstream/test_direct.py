"""The direct path (``proxy.upstream.direct``): which deployments take it, what reaches a real loopback upstream,
and that ``model_info.lcm_direct: false`` keeps a deployment on LiteLLM. The rest of tests/upstream runs on
both paths (``chat_path`` in tests/upstream/conftest.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from proxy.config.settings import GeneralSettings
from proxy.errors import UpstreamConnectionError, UpstreamError
from proxy.upstream import direct, pool
from proxy.upstream.client import Upstream, load_litellm
from proxy.upstream.routing import ResolvedModel
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import AppProxy

BODY = {"model": "m", "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]}


@pytest.fixture(autouse=True)
def chat_path(monkeypatch: pytest.MonkeyPatch) -> str:
    """These tests are about the direct path: it is on (the conftest's fixture of the same name runs both)."""
    monkeypatch.setattr(direct, "ENABLED", True)
    return "direct"


def target(url: str, **params: Any) -> ResolvedModel:
    litellm_params = {"model": "openai/fake-model", "api_base": f"{url}/v1", "api_key": "sk-direct-123", **params}
    return ResolvedModel(alias="m", litellm_params=litellm_params, max_input_tokens=None, max_output_tokens=None)


class NoLiteLLM:
    """``litellm.acompletion`` replaced: a call that reaches it fails the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        litellm = load_litellm()
        real = litellm.acompletion

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(litellm, "acompletion", counted)


def test_a_chat_call_goes_straight_to_the_upstream(
    fake_upstream: FakeUpstream, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not through LiteLLM; the client's body as sent (no ``developer`` -> ``system``), the provider's model name,
    the deployment's key and extra headers; the upstream's answer as it sent it."""
    spy = NoLiteLLM(monkeypatch)
    upstream = Upstream(GeneralSettings(request_timeout=10))
    deployment = target(upstream_url, extra_headers={"X-Tenant": "t1"})
    answer = asyncio.run(upstream.complete(deployment, {**BODY, "temperature": 0.25, "stream": False}))
    assert spy.calls == 0
    assert answer["choices"][0]["message"]["content"] == "echo: hi"
    assert answer["system_fingerprint"] == "fp_fake" and answer["created"] == 1700000000
    sent = fake_upstream.last
    assert sent.body == {"model": "fake-model", "messages": BODY["messages"], "temperature": 0.25}
    assert sent.headers["authorization"] == "Bearer sk-direct-123"
    assert sent.headers["x-tenant"] == "t1"


def test_a_stream_goes_straight_to_the_upstream(
    fake_upstream: FakeUpstream, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = NoLiteLLM(monkeypatch)
    upstream = Upstream(GeneralSettings(request_timeout=10))
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}

    async def read() -> list[dict[str, Any]]:
        stream = await upstream.open_stream(target(upstream_url), body)
        return [chunk async for chunk in stream]

    chunks = asyncio.run(read())
    assert spy.calls == 0
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "echo: hi"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 18
    assert fake_upstream.last.body["stream"] is True
    assert fake_upstream.last.body["stream_options"] == {"include_usage": True}
    assert fake_upstream.last.headers["accept"] == "text/event-stream"


def test_lcm_direct_false_keeps_a_deployment_on_litellm(
    fake_upstream: FakeUpstream, upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = NoLiteLLM(monkeypatch)
    upstream = Upstream(GeneralSettings(request_timeout=10))
    deployment = ResolvedModel(**{**target(upstream_url).__dict__, "direct": False})
    answer = asyncio.run(upstream.complete(deployment, {**BODY}))
    assert spy.calls == 1 and answer["choices"][0]["message"]["content"] == "echo: hi"


def test_the_setting_reaches_the_deployment(app_factory: Any) -> None:
    """``model_info.lcm_direct: false`` in the YAML: that deployment's calls go through LiteLLM."""
    models = [
        {"model_name": "direct", "litellm_params": {"model": "openai/fake-model"}},
        {
            "model_name": "litellm",
            "litellm_params": {"model": "openai/fake-model"},
            "model_info": {"lcm_direct": False},
        },
    ]
    proxy: AppProxy = app_factory(models=models)
    router = proxy.app.state.lcm.router
    assert router.resolve("direct").direct is True
    assert router.resolve("litellm").direct is False


def test_calls_share_one_kept_alive_connection(upstream_url: str) -> None:
    """Keep-alive: consecutive calls of one event loop reuse one pooled connection, and shutdown closes it."""
    upstream = Upstream(GeneralSettings(request_timeout=10))

    async def three() -> tuple[int, bool]:
        for _ in range(3):
            await upstream.complete(target(upstream_url), dict(BODY))
        session = pool._sessions[asyncio.get_running_loop()]
        connections = sum(len(idle) for idle in session.connector._conns.values())  # type: ignore[union-attr]
        await pool.close()
        return connections, session.closed

    assert asyncio.run(three()) == (1, True)


def test_litellm_is_asked_once_per_deployment(upstream_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    litellm = load_litellm()
    asked: list[str] = []
    real = litellm.get_llm_provider

    def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("model", ""))
        return real(*args, **kwargs)

    monkeypatch.setattr(litellm, "get_llm_provider", counted)
    direct._endpoint.cache_clear()
    kwargs = {"model": "openai/once", "api_base": f"{upstream_url}/v1", "api_key": "k", "timeout": httpx.Timeout(5)}
    points = {direct.endpoint(litellm, kwargs) for _ in range(5)}
    assert points == {direct.Endpoint("once", f"{upstream_url}/v1/chat/completions", "k")}
    assert asked == ["openai/once"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"model": "openai/m", "api_base": "http://h:1/v1", "api_key": "k"}, "http://h:1/v1/chat/completions"),
        ({"model": "hosted_vllm/m", "api_base": "http://h:1", "api_key": "k"}, "http://h:1/chat/completions"),
        ({"model": "deepseek/deepseek-chat", "api_key": "k"}, "https://api.deepseek.com/beta/chat/completions"),
        ({"model": "together_ai/m", "api_key": "k"}, "https://api.together.ai/v1/chat/completions"),
        ({"model": "openai/gpt-4o", "api_key": "k"}, "https://api.openai.com/v1/chat/completions"),
        ({"model": "openai/gpt-4o"}, None),  # no key anywhere: LiteLLM says so in its words
        ({"model": "anthropic/claude-sonnet-4-5", "api_key": "k"}, None),  # translated by LiteLLM
        ({"model": "fireworks_ai/m", "api_key": "k"}, None),  # LiteLLM rewrites the model name
        ({"model": "openrouter/a/b", "api_key": "k"}, None),  # LiteLLM adds headers and a body field
        ({"model": "openai/m", "api_base": "http://h:1/v1", "api_key": "k", "organization": "o"}, None),
        ({"model": "openai/m", "api_base": "http://h:1/v1", "api_key": "k", "temperature": 0.2}, None),
        ({"model": "azure/m", "api_base": "http://h:1", "api_key": "k", "api_version": "v"}, None),
    ],
)
def test_which_deployments_take_the_direct_path(
    params: dict[str, Any], expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    direct._endpoint.cache_clear()
    point = direct.endpoint(load_litellm(), {**params, "timeout": httpx.Timeout(5), "max_retries": 0})
    assert (point.url if point else None) == expected
    direct._endpoint.cache_clear()


def test_the_switch_sends_everything_through_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "ENABLED", False)
    params = {"model": "openai/m", "api_base": "http://h:1/v1", "api_key": "k", "timeout": httpx.Timeout(5)}
    assert direct.endpoint(load_litellm(), params) is None


def test_errors_redact_the_key_and_keep_the_upstreams_fields(fake_upstream: FakeUpstream, upstream_url: str) -> None:
    fake_upstream.enqueue(Reply(status=401, error_message="Incorrect API key provided: sk-direct-123", error_code="k"))
    upstream = Upstream(GeneralSettings(request_timeout=10, upstream_retries=0))
    with pytest.raises(UpstreamError) as info:
        asyncio.run(upstream.complete(target(upstream_url), dict(BODY)))
    assert info.value.status == 401 and info.value.code == "k"
    assert "sk-direct-123" not in info.value.message


def test_a_cut_stream_is_truncated_not_finished(fake_upstream: FakeUpstream, upstream_url: str) -> None:
    fake_upstream.enqueue(Reply(content="one two three four", cut_after=2))
    upstream = Upstream(GeneralSettings(request_timeout=10))

    async def read() -> None:
        stream = await upstream.open_stream(target(upstream_url), {**BODY, "stream": True})
        async for _ in stream:
            pass

    with pytest.raises(UpstreamError) as info:
        asyncio.run(read())
    assert info.value.code == "upstream_stream_truncated"


def test_a_refused_connection_is_not_sent_again() -> None:
    """No hidden retries: a dead port fails once, as a connection error naming the model, not its api_base."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        upstream = Upstream(GeneralSettings(request_timeout=5, upstream_retries=0))
        with pytest.raises(UpstreamConnectionError) as info:
            asyncio.run(upstream.complete(target(url), dict(BODY)))
    assert "model 'm'" in info.value.message and "127.0.0.1" not in info.value.message
