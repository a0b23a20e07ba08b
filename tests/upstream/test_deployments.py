"""Several deployments of one model (model_list entries sharing a model_name): load balancing, the next
deployment and then the fallback models on a retryable failure before the first byte, cooldowns, and a budget
that holds for whichever deployment answers. Two real fake upstreams on loopback, real proxies, the real
``openai`` SDK."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.cli.check_config import model_report
from proxy.config.loading import parse_config
from proxy.relay.summarizer import UpstreamSummarizer
from proxy.relay.toolloop import RecallLoop
from proxy.upstream.balancer import Balancer
from proxy.upstream.client import Upstream
from proxy.upstream.routing import ModelRouter
from tests.support import REPO
from tests.support.cli import Served, free_port, main
from tests.support.deployments import answering, deployment, resolved, unavailable
from tests.support.fakes import FakeUpstream, Reply, wait_for
from tests.support.proxies import UPSTREAM_KEY, RunningProxy

UPSTREAM_LOG = "lcm_proxy.upstream"


def client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30)


def ask(sdk: openai.OpenAI, model: str, text: str, stream: bool = False) -> str:
    messages: Any = [{"role": "user", "content": text}]
    if not stream:
        return sdk.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
    chunks = sdk.chat.completions.create(model=model, messages=messages, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def balancer(proxy: RunningProxy) -> Balancer:
    return proxy.app.state.lcm.upstream.balancer  # type: ignore[no-any-return]


# --- failing over -------------------------------------------------------------------------------------------


def test_a_503_deployment_is_failed_over_to_the_next_for_plain_and_streamed_chat(
    proxy_factory: Any,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    second: FakeUpstream,
    second_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []
    fake_upstream.responder = answering(order, "A", unavailable)
    second.responder = answering(order, "B", lambda body: Reply(content="answered by B"))
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    # least-busy: with nothing in flight A (listed first) is always tried first; no cooldown: every time.
    proxy = proxy_factory(models=models, routing_strategy="least-busy", cooldown_time=0)
    sdk = client(proxy)
    caplog.set_level(logging.WARNING, logger=UPSTREAM_LOG)
    for i, stream in enumerate([False, True, False, True]):
        assert ask(sdk, "pair", f"question {i}", stream) == "answered by B"
    assert order == ["A:a-model", "B:b-model"] * 4
    assert [r.body["stream"] for r in second.requests if "stream" in r.body] == [True, True]
    switches = [r.getMessage() for r in caplog.records if r.name == UPSTREAM_LOG and r.levelno == logging.WARNING]
    a, b = (u.removeprefix("http://") for u in (upstream_url, second_url))
    switch = (
        f"model pair: openai/a-model at http://{a}/v1 failed before the first byte (503); trying openai/b-model at"
        f" http://{b}/v1"
    )
    assert switches == [switch] * 4
    assert UPSTREAM_KEY not in caplog.text and "question" not in caplog.text


def test_a_stream_that_fails_before_its_first_chunk_switches_and_never_after_it(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy", cooldown_time=0)
    # A 200 whose stream ends before any chunk: nothing reached the client, B answers.
    fake_upstream.enqueue(Reply(raw_sse=[b": keep-alive\n\n"]))
    assert ask(client(proxy), "pair", "before", stream=True) == "echo: before"
    assert len(second.requests) == 1
    # A stream cut after its first chunks: the client has part of A's answer, so no other deployment is asked.
    fake_upstream.enqueue(Reply(content="one two three", cut_after=1))
    with pytest.raises(openai.APIError):
        ask(client(proxy), "pair", "after", stream=True)
    assert len(fake_upstream.requests) == 2 and len(second.requests) == 1


def test_a_400_is_the_clients_answer_not_a_failover(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    fake_upstream.responder = lambda body: Reply(status=400, error_message="bad temperature", error_code="bad")
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy")
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            ask(client(proxy), "pair", f"hello {stream}", stream)
        assert "bad temperature" in str(info.value)
    assert len(fake_upstream.requests) == 2 and second.requests == []


def test_the_fallback_model_answers_when_every_deployment_failed(
    proxy_factory: Any,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    second: FakeUpstream,
    second_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []
    fake_upstream.responder = answering(order, "A", unavailable)
    second.responder = answering(
        order, "B", lambda body: unavailable(body) if body["model"] == "b-model" else Reply(content="from backup")
    )
    models = [
        deployment("pair", upstream_url, "a-model"),
        deployment("pair", second_url, "b-model"),
        deployment("backup", second_url, "backup-model"),
    ]
    proxy = proxy_factory(
        models=models, routing_strategy="least-busy", cooldown_time=0, fallbacks=[{"pair": ["backup"]}]
    )
    caplog.set_level(logging.WARNING, logger=UPSTREAM_LOG)
    assert ask(client(proxy), "pair", "first", stream=False) == "from backup"
    assert ask(client(proxy), "pair", "second", stream=True) == "from backup"
    assert order == ["A:a-model", "B:b-model", "B:backup-model"] * 2
    assert "trying fallback model backup: openai/backup-model at" in caplog.text


def test_upstream_retries_repeats_the_whole_chain(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    """One pass over the chain, each deployment tried once; ``upstream_retries: 1`` is one more pass."""
    order: list[str] = []
    fake_upstream.responder = answering(order, "A", unavailable)
    second.enqueue(Reply(status=503, error_message="busy"))  # B's first answer; then the responder
    second.responder = answering(order, "B", lambda body: Reply(content="second pass"))
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy", cooldown_time=0, upstream_retries=1)
    assert ask(client(proxy), "pair", "retry me") == "second pass"
    assert order == ["A:a-model", "A:a-model", "B:b-model"]  # B's scripted 503 came before its responder
    assert len(second.requests) == 2


def test_a_deployment_failing_allowed_fails_times_cools_down(
    proxy_factory: Any,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    second: FakeUpstream,
    second_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []
    fake_upstream.responder = answering(order, "A", unavailable)
    second.responder = answering(order, "B", lambda body: Reply(content="B"))
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy", allowed_fails=2, cooldown_time=600)
    caplog.set_level(logging.WARNING, logger=UPSTREAM_LOG)
    for i in range(4):
        assert ask(client(proxy), "pair", f"turn {i}") == "B"
    assert order == ["A:a-model", "B:b-model", "A:a-model", "B:b-model", "B:b-model", "B:b-model"]
    assert "model pair: deployment model_list[2]" in caplog.text
    assert "failed 2 times in a row; it is skipped for 600 s" in caplog.text


# --- sharing the requests -----------------------------------------------------------------------------------


def test_simple_shuffle_spreads_requests_over_both_deployments(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models)  # simple-shuffle: the default
    balancer(proxy).rng.seed(20240611)
    for i in range(12):
        ask(client(proxy), "pair", f"spread {i}")
    assert len(fake_upstream.requests) + len(second.requests) == 12
    assert fake_upstream.requests and second.requests


def test_simple_shuffle_weighs_by_rpm_as_litellm_does(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    """Only A sets rpm: B has no weight, so it is the second choice every time (LiteLLM picks by weight)."""
    models = [deployment("pair", upstream_url, "a-model", rpm=60), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models)
    for i in range(6):
        ask(client(proxy), "pair", f"weighed {i}")
    assert len(fake_upstream.requests) == 6 and second.requests == []


def test_least_busy_sends_to_the_idle_deployment_while_the_other_streams(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy")
    counts = balancer(proxy).in_flight
    fake_upstream.enqueue(Reply(content="held open", chunk_delay=60))  # the first chunk now, the rest in a minute
    held = client(proxy).chat.completions.create(
        model="pair", messages=[{"role": "user", "content": "a long answer"}], stream=True
    )
    first = next(iter(held))  # A's stream is open and relayed
    assert first.choices[0].delta.role == "assistant"
    assert counts.get("model_list[2]") == 1 and not counts.get("model_list[3]")
    assert ask(client(proxy), "pair", "meanwhile") == "echo: meanwhile"
    assert len(second.requests) == 1 and len(fake_upstream.requests) == 1
    held.close()  # the client leaves: the proxy closes A's stream, and A is idle again
    assert wait_for(lambda: counts.get("model_list[2]") == 0, timeout=10), counts
    assert ask(client(proxy), "pair", "now A again") == "echo: now A again"
    assert len(fake_upstream.requests) == 2


# --- the budget ---------------------------------------------------------------------------------------------


def test_the_budget_uses_the_smallest_window_of_the_group_and_its_fallbacks(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    models = [
        deployment("pair", upstream_url, "a-model", window=100000),
        deployment("pair", second_url, "b-model", window=4096),
        deployment("solo", upstream_url, "solo-model", window=100000),
        deployment("tiny", second_url, "tiny-model", window=2048),
    ]
    proxy = proxy_factory(models=models, fallbacks=[{"solo": ["tiny"]}])
    state = proxy.app.state.lcm
    assert state.policy.window_of(state.router.resolve("pair")) == (
        4096,
        "model_info.max_input_tokens of model_list[3], the smallest window among the 2 deployments that may answer",
    )
    assert state.policy.window_of(state.router.resolve("solo"))[0] == 2048  # a fallback may answer too
    assert state.policy.window_of(state.router.resolve("tiny")) == (2048, "model_info.max_input_tokens")
    # An answer of 5,000 tokens fits A's window, not B's: refused before any upstream call, B might answer it.
    with pytest.raises(openai.BadRequestError) as info:
        client(proxy).chat.completions.create(
            model="pair", messages=[{"role": "user", "content": "hi"}], max_tokens=5000
        )
    assert "context window 4096 (model_info.max_input_tokens of model_list[3]" in str(info.value)
    assert fake_upstream.requests == [] and second.requests == []


# --- every path goes through the same chain -----------------------------------------------------------------


def test_summarizer_recall_loop_and_other_calls_fail_over_too(
    fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    order: list[str] = []
    fake_upstream.responder = answering(order, "A", unavailable)
    second.responder = answering(order, "B", lambda body: Reply(content="B answers"))
    config = parse_config(
        {
            "model_list": [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")],
            "general_settings": {"routing_strategy": "least-busy", "cooldown_time": 0},
        }
    )
    target = ModelRouter(config.model_list).resolve("pair")

    async def run_tool(name: str, arguments: str) -> str:
        return "unused"

    async def every_path() -> list[str]:
        upstream = Upstream(config.general_settings)
        summarizer = UpstreamSummarizer(upstream, target, timeout=20)
        loop = RecallLoop(upstream, target, run_tool, max_rounds=2, room=10000)
        body = {"model": "pair", "messages": [{"role": "user", "content": "hi"}]}
        streamed = await loop.open_stream({**body, "stream": True}, None, include_usage=False)
        called = await upstream.call("acompletion", target, {"messages": body["messages"]})
        return [
            await summarizer.complete(system="s", user="u", max_tokens=50, temperature=0),
            await summarizer.summarize_text("a document", name="doc.txt", max_tokens=50),
            (await loop.complete(body, None))["choices"][0]["message"]["content"],
            "".join([c["choices"][0]["delta"].get("content") or "" async for c in streamed if c.get("choices")]),
            called.choices[0].message.content,
        ]

    assert asyncio.run(every_path()) == ["B answers"] * 5
    assert order == ["A:a-model", "B:b-model"] * 5


# --- the balancer and the report, on their own ----------------------------------------------------------------


def test_cooldown_ends_and_never_leaves_no_deployment_to_try() -> None:
    now = [1000.0]
    models = [deployment("m", "http://127.0.0.1:1", "a"), deployment("m", "http://127.0.0.1:2", "b")]
    target, config = resolved(models, routing_strategy="least-busy", allowed_fails=1, cooldown_time=30)
    order = Balancer(config.general_settings, clock=lambda: now[0])
    a, b = target.candidates()
    order.failed(a)
    assert order.order(target) == [b]  # a cools down
    order.failed(b)
    assert order.order(target) == [a, b]  # both cooling: both tried rather than none
    now[0] += 31
    order.succeeded(a)
    assert order.order(target) == [a, b]


def test_wildcard_entries_sharing_a_pattern_are_deployments_of_one_model() -> None:
    models = [
        {"model_name": "local/*", "litellm_params": {"model": "openai/*", "api_base": "http://127.0.0.1:1/v1"}},
        {"model_name": "local/*", "litellm_params": {"model": "openai/*", "api_base": "http://127.0.0.1:2/v1"}},
    ]
    target, _ = resolved(models, "local/qwen")
    assert [(c.alias, c.upstream_model, c.litellm_params["api_base"]) for c in target.candidates()] == [
        ("local/qwen", "openai/qwen", "http://127.0.0.1:1/v1"),
        ("local/qwen", "openai/qwen", "http://127.0.0.1:2/v1"),
    ]


def test_check_config_lists_each_models_deployments_and_fallbacks() -> None:
    models = [
        deployment("pair", "http://127.0.0.1:1", "a-model", rpm=60),
        deployment("pair", "http://127.0.0.1:2", "b-model", window=4096),
        deployment("backup", "http://127.0.0.1:3", "backup-model"),
    ]
    config = parse_config(
        {
            "model_list": models,
            "router_settings": {"routing_strategy": "least-busy", "fallbacks": [{"pair": ["backup"]}]},
        }
    )
    report = "\n".join(model_report(config, windows=lambda model: None))
    assert (
        "  model pair -> 2 deployments (least-busy; the next one on a failure)\n"
        "    deployment:  openai/a-model at http://127.0.0.1:1/v1 (rpm 60)\n"
        "    deployment:  openai/b-model at http://127.0.0.1:2/v1\n"
        "    fallbacks:   backup (tried in this order once all of pair failed)\n"
        "    window:      4,096 tokens (model_info.max_input_tokens of model_list[1], the smallest window among the 3"
        " deployments that may answer)"
    ) in report
    assert "  model backup -> openai/backup-model at http://127.0.0.1:3/v1\n    window:      100,000 tokens" in report
    assert UPSTREAM_KEY not in report


# --- LiteLLM's documented proxy config ---------------------------------------------------------------------

EXAMPLE = REPO / "config" / "litellm-proxy-example.yaml"
MASTER_KEY = "sk-master-key-from-the-environment-1"
SECRETS = {"ZEPHYR_API_KEY": "sk-zephyr-upstream-secret-9", "OPENAI_API_KEY": "sk-openai-upstream-secret-7"}


@pytest.fixture
def example_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "LCM_", "REDIS"))}
    return {**env, **SECRETS, "LITELLM_MASTER_KEY": MASTER_KEY, "XDG_DATA_HOME": str(tmp_path / "xdg")}


def test_litellms_documented_config_passes_check_config_with_warnings(example_env: dict[str, str]) -> None:
    result = main("check-config", str(EXAMPLE), env=example_env)
    assert result.returncode == 0, result.stderr
    assert "OK (5 warning(s))" in result.stdout
    assert (
        "  model zephyr-beta -> 2 deployments (simple-shuffle; the next one on a failure)\n"
        "    deployment:  openai/HuggingFaceH4/zephyr-7b-beta at http://127.0.0.1:8001/v1 (rpm 60)\n"
        "    deployment:  openai/HuggingFaceH4/zephyr-7b-beta at http://127.0.0.1:8002/v1 (rpm 600)\n"
        "    fallbacks:   gpt-4o (tried in this order once all of zephyr-beta failed)\n"
    ) in result.stdout
    assert "    aliases:     gpt-4 (router_settings.model_group_alias)\n" in result.stdout
    ignored = "ignored (a LiteLLM proxy setting that lcm-proxy does not use)"
    assert result.stderr.splitlines() == [
        "lcm-proxy: warning: litellm_settings.num_retries: router_settings.num_retries (2) is used instead",
        "lcm-proxy: warning: litellm_settings.request_timeout: router_settings.timeout (30) is used instead",
        f"lcm-proxy: warning: litellm_settings: {ignored}: set_verbose, success_callback, context_window_fallbacks",
        f"lcm-proxy: warning: router_settings: {ignored}: redis_host, redis_password, redis_port",
        f"lcm-proxy: warning: general_settings.alerting: {ignored}",
    ]


def test_litellms_documented_config_serves_and_takes_its_fallback_on_a_503(
    tmp_path: Path,
    example_env: dict[str, str],
    fake_upstream: FakeUpstream,
    upstream_url: str,
    second: FakeUpstream,
    second_url: str,
) -> None:
    """Both zephyr-beta deployments answer 503 (A, and B for that model): gpt-4o, its fallback, answers."""
    a, b = (u.removeprefix("http://") for u in (upstream_url, second_url))
    text = EXAMPLE.read_text().replace("127.0.0.1:8001", a).replace("127.0.0.1:8002", b).replace("127.0.0.1:8003", b)
    config = tmp_path / "litellm.yaml"
    config.write_text(text)
    fake_upstream.responder = unavailable
    second.responder = lambda body: Reply(content="gpt-4o answers") if body["model"] == "gpt-4o" else unavailable(body)
    port = free_port()
    served = Served(config, example_env, "--host", "127.0.0.1", "--port", str(port))
    try:
        served.wait_for("listening on")
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=MASTER_KEY, max_retries=0, timeout=30)
        assert ask(sdk, "zephyr-beta", "hello") == "gpt-4o answers"
        assert ask(sdk, "zephyr-beta", "hello again", stream=True) == "gpt-4o answers"
        with pytest.raises(openai.AuthenticationError):  # master_key is the proxy's key
            openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-wrong-key-000", max_retries=0
            ).models.list()
    finally:
        log = served.stop()
    assert [r.body["model"] for r in fake_upstream.requests] == ["HuggingFaceH4/zephyr-7b-beta"] * 2
    assert [r.body["model"] for r in second.requests] == ["HuggingFaceH4/zephyr-7b-beta", "gpt-4o"] * 2
    assert [r.headers["authorization"] for r in second.requests if r.body["model"] == "gpt-4o"] == [
        f"Bearer {SECRETS['OPENAI_API_KEY']}"
    ] * 2
    assert f"trying fallback model gpt-4o: openai/gpt-4o at http://{b}/v1" in log
    assert not any(secret in log for secret in [*SECRETS.values(), MASTER_KEY]), log


def test_a_streamed_legacy_completion_fails_over_too(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    """``/v1/completions`` with ``stream: true``: a 503 before the first chunk moves on to the next deployment,
    whose stream (its own timeouts and name) the client receives."""
    models = [deployment("pair", upstream_url, "a-model"), deployment("pair", second_url, "b-model")]
    proxy = proxy_factory(models=models, routing_strategy="least-busy", cooldown_time=0)
    fake_upstream.enqueue(Reply(status=503, error_message="busy"))
    second.enqueue(Reply(content="answered by B"))
    chunks = client(proxy).completions.create(model="pair", prompt="question", stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "answered by B"
    assert [r.path for r in fake_upstream.requests] == ["/v1/completions"]
    assert [r.path for r in second.requests] == ["/v1/completions"]
    assert not any(balancer(proxy).in_flight.values())  # the stream ended: nothing is left busy


def test_a_field_litellm_cannot_send_is_the_clients_400_and_blames_no_deployment(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, second: FakeUpstream, second_url: str
) -> None:
    """LiteLLM reports its own failure on a field of the wrong type (``encoding_format: 123``) as a connection
    error. It is the client's: a 400, no other deployment or fallback tried, no retry, no cooldown. (An
    ``organization`` makes these deployments LiteLLM's to call: embeddings to a plain OpenAI-compatible one are
    relayed without LiteLLM, see ``proxy.upstream.relay``.)"""
    models = [
        deployment("pair", upstream_url, "a-model", organization="org-1"),
        deployment("pair", second_url, "b-model", organization="org-1"),
        deployment("backup", second_url, "backup-model", organization="org-1"),
    ]
    proxy = proxy_factory(
        models=models, upstream_retries=2, fallbacks=[{"pair": ["backup"]}], allowed_fails=1, cooldown_time=600
    )
    body = {"model": "pair", "input": "x", "encoding_format": 123}
    response = httpx.post(f"{proxy.base_url}/embeddings", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "upstream_request_invalid"
    assert fake_upstream.requests == [] and second.requests == []
    assert not balancer(proxy)._cooling_until and not any(balancer(proxy)._failures.values())
