"""Failing over, hardened (issue 22): a deployment that answers again leaves its cooldown at once, and the error
after every deployment and fallback failed names the model the client asked for, never an internal api_base.
Two real fake upstreams on loopback (the session's and ``tests/upstream/conftest.py``'s), real proxies."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from proxy.upstream.balancer import Balancer
from tests.support.deployments import answering, deployment, resolved, unavailable
from tests.support.fakes import FakeUpstream, Reply

# --- a recovered deployment leaves its cooldown -------------------------------------------------------------


def test_a_success_ends_the_deployments_cooldown() -> None:
    """Both deployments cooling (every one failed): a request tries both, and the one that answers is first
    again at once, not after ``cooldown_time``. ``succeeded`` cleared the failure count but not the cooldown."""
    now = [1000.0]
    models = [deployment("m", "http://127.0.0.1:1", "a"), deployment("m", "http://127.0.0.1:2", "b")]
    target, config = resolved(models, routing_strategy="least-busy", allowed_fails=1, cooldown_time=600)
    balancer = Balancer(config.general_settings, clock=lambda: now[0])
    a, b = target.candidates()
    balancer.failed(a)
    balancer.failed(b)
    assert balancer.order(target) == [a, b]  # every deployment cooling: all are tried rather than none
    balancer.failed(a)  # the next request: a fails again...
    balancer.succeeded(b)  # ...b answers
    assert balancer.order(target) == [b]  # a still cools down; b is back
    now[0] += 601
    assert balancer.order(target) == [a, b]  # a's cooldown over


def ask(base_url: str, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    return httpx.post(f"{base_url}/chat/completions", json=body, timeout=30)


def test_after_recovery_the_next_request_goes_to_the_recovered_deployment(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    order: list[str] = []
    b_down = [True]
    fake_upstream.responder = answering(order, "A", unavailable)  # A stays down
    second.responder = answering(order, "B", lambda body: unavailable(body) if b_down[0] else Reply(content="B"))
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy", allowed_fails=1, cooldown_time=600)
    assert ask(proxy.base_url, "pair").status_code == 503  # both fail: both cool down
    b_down[0] = False
    assert ask(proxy.base_url, "pair").json()["choices"][0]["message"]["content"] == "B"  # A first, then B
    assert order == ["A:a-model", "B:b-model", "A:a-model", "B:b-model"]
    del order[:]
    for _ in range(3):
        assert ask(proxy.base_url, "pair").status_code == 200
    assert order == ["B:b-model"] * 3  # the failing A is no longer tried first, for up to 600 s


# --- the error after the whole chain failed -----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_last_error_names_the_model_asked_for_and_its_failed_fallbacks(
    proxy_factory: Any,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    second: FakeUpstream,
    second_url: str,
    stream: bool,
) -> None:
    """The 502 named only the last fallback ("Could not connect to the upstream provider for model 'backup' at
    http://127.0.0.1:9/v1."): not the model the client asked for, and an internal address."""
    fake_upstream.responder = unavailable
    second.responder = unavailable
    models = [
        deployment("pair", upstream_url, "a-model"),
        deployment("pair", second_url, "b-model"),
        deployment("mini", second_url, "mini-model"),
        deployment("backup", "http://127.0.0.1:9", "backup-model"),  # nothing listens: a connection failure
    ]
    proxy = proxy_factory(models=models, cooldown_time=0, fallbacks=[{"pair": ["mini", "backup"]}])
    response = ask(proxy.base_url, "pair", stream)
    assert response.status_code == 502, response.text  # the last failure's status and code are kept
    error = response.json()["error"]
    assert error["code"] == "upstream_unreachable"
    assert error["message"].startswith("Model 'pair' failed, and so did its fallbacks 'mini' and 'backup'.")
    assert "from 'backup': Could not connect to the upstream provider for model 'backup'" in error["message"]
    assert "127.0.0.1" not in json.dumps(error) and "http" not in json.dumps(error)


def test_without_fallbacks_the_error_is_the_deployments_own(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    fake_upstream.responder = unavailable
    second.responder = unavailable
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, cooldown_time=0)
    response = ask(proxy.base_url, "pair")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "overloaded"  # the provider's own words, as before
