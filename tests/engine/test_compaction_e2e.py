"""Compaction through the real proxy: headers, inline compaction, eviction, 400 for a tail that cannot fit,
identical streaming and non-streaming assembly, and the operator's compact/show commands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from tests.support.cli import main
from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy
from tests.support.sim import (
    MAX_TOKENS,
    WINDOW,
    ScriptedModel,
    check_tool_pairing,
    forwarded_tokens,
    is_summary_request,
    start_sim_proxy,
    without_recall,
)
from tests.support.transcripts import long_history


def post(proxy: RunningProxy, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": messages, "max_tokens": 400, **extra},
        timeout=60,
    )


def chat_requests(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests if not is_summary_request(r.body)]


def test_inline_compaction_when_over_the_hard_budget(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    model = ScriptedModel()
    fake_upstream.responder = model
    proxy = start_sim_proxy(proxy_factory, upstream_url)
    history = long_history(60)  # ~12k tokens for an 8k window
    response = post(proxy, history)
    assert response.status_code == 200, response.text
    assert response.headers["x-lcm-compaction"] == "inline"
    assert int(response.headers["x-lcm-tokens-forwarded"]) < int(response.headers["x-lcm-tokens-sent"])
    sent = chat_requests(fake_upstream)[-1]
    assert forwarded_tokens(sent) + 400 <= 8000
    assert sent["messages"][0] == history[0] and sent["messages"][-1] == history[-1]
    assert sent["messages"][1]["content"].startswith('<summary id="sum_')
    assert model.summary_calls > 0


def test_streaming_and_plain_requests_assemble_identically(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = ScriptedModel()
    proxy = start_sim_proxy(proxy_factory, upstream_url)
    history = long_history(60)
    assert post(proxy, history).status_code == 200
    plain = chat_requests(fake_upstream)[-1]["messages"]
    with httpx.stream(
        "POST",
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": history, "max_tokens": 400, "stream": True},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        assert r.headers["x-lcm-compaction"] in ("none", "scheduled")
        r.read()
    streamed = chat_requests(fake_upstream)[-1]["messages"]
    assert streamed == plain


def test_summarizer_down_evicts_and_still_answers(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = ScriptedModel(fail_summaries_with=401)
    proxy = start_sim_proxy(proxy_factory, upstream_url)
    history = long_history(60)
    response = post(proxy, history)
    assert response.status_code == 200, response.text
    assert response.headers["x-lcm-compaction"] == "evicted"
    sent = chat_requests(fake_upstream)[-1]
    assert forwarded_tokens(sent) + 400 <= 8000
    assert without_recall(sent["messages"][-1]) == history[-1]
    check_tool_pairing(sent["messages"])
    # What did not fit is reported as such (headers, admin view), not listed as if it had been sent.
    evicted = int(response.headers["x-lcm-evicted"])
    context = httpx.get(f"{proxy.url}/lcm/conversations/{response.headers['x-lcm-conversation-id']}/context").json()
    assert evicted > 0 and len(context["evicted"]) == evicted
    first_sent = min(i["seq"] for i in context["items"] if i["sent"])
    assert sent["messages"][1] == history[1 + first_sent]  # after the instructions, no summaries: raw from there
    assert context["tokens"] < context["stored_tokens"]


def test_a_large_tail_shrinks_and_only_the_newest_message_must_fit(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """The old rule refused a conversation whose protected tail (a message count) was larger than the budget,
    although the newest question was short. Now the tail shrinks; only the newest user message and what
    follows it must fit, and the refusal names the setting to change."""
    fake_upstream.responder = ScriptedModel()
    proxy = start_sim_proxy(proxy_factory, upstream_url)
    chunk = "word " * 2000  # each message under the huge-paste threshold, together over the window
    messages = [
        {"role": "user", "content": chunk},
        {"role": "assistant", "content": chunk},
        {"role": "user", "content": chunk},
        {"role": "assistant", "content": chunk},
        {"role": "user", "content": "ok?"},
    ]
    response = post(proxy, messages)
    assert response.status_code == 200, response.text
    sent = chat_requests(fake_upstream)[-1]
    assert forwarded_tokens(sent) <= WINDOW - MAX_TOKENS
    assert without_recall(sent["messages"][-1]) == messages[-1]

    fake_upstream.requests.clear()
    too_big = [*messages[:-1], {"role": "user", "content": chunk}]
    response = post(proxy, too_big, max_tokens=7000)  # leaves 1,000 tokens; the newest message needs 2,000
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "newest user message" in error["message"] and "max_tokens" in error["message"]
    assert chat_requests(fake_upstream) == []  # no doomed upstream call


def test_cli_compact_and_show(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.responder = ScriptedModel()
    proxy = start_sim_proxy(proxy_factory, upstream_url, context_threshold=0.99)
    history = long_history(12)  # under the budget: nothing compacted yet
    response = post(proxy, history)
    assert response.headers["x-lcm-compaction"] == "none"
    conversation = response.headers["x-lcm-conversation-id"]
    config = tmp_path / "cli.yaml"
    config.write_text(
        "model_list:\n"
        f"  - {{model_name: small, litellm_params: {{model: openai/small, api_base: '{upstream_url}/v1', api_key: k-12345678}}}}\n"
        f"general_settings: {{data_dir: '{proxy.config.general_settings.data_dir}'}}\n"
        "lcm_settings: {fresh_tail_count: 4, leaf_chunk_tokens: 1000}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    compact = main("compact", conversation, "--config", str(config), env=env)
    assert compact.returncode == 0, compact.stderr
    assert f"compacted {conversation} with small" in compact.stdout and "leaf" in compact.stdout
    show = main("show", conversation, "--config", str(config), env=env)
    assert show.returncode == 0
    assert "summary DAG" in show.stdout and " leaf d0 messages 0-" in show.stdout
    # The next request uses the compacted context.
    post(proxy, [*history, {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}])
    assert chat_requests(fake_upstream)[-1]["messages"][1]["content"].startswith('<summary id="sum_')


def test_a_small_window_without_max_tokens_still_serves(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """A 2,000-token local model and a client that sends no max_tokens: the default reserve (4096) is capped at
    a quarter of the window, so short requests are served instead of every one failing with a negative
    budget."""
    model = {
        "model_name": "tiny",
        "litellm_params": {"model": "openai/tiny", "api_base": f"{upstream_url}/v1", "api_key": "k-12345678"},
        "model_info": {"max_input_tokens": 2000},
    }
    proxy = proxy_factory(models=[model])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    # A client's own max_tokens still counts in full: 1,999 of 2,000 leaves no room, and says so.
    response = httpx.post(f"{proxy.base_url}/chat/completions", json={**body, "max_tokens": 1999}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
