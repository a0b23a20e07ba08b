"""An upstream that refuses the context as too long (its tokenizer counts higher than the proxy's, or it runs
with a smaller window than configured) gets one more try, compacted to a smaller budget, and the client
its answer. A refusal the proxy makes itself names the conversation it stored."""

from __future__ import annotations

from typing import Any

from proxy.tokens import count_messages
from tests.support.fakes import FakeUpstream, Reply
from tests.support.sim import without_recall

WINDOW = 4000


def small_model(upstream_url: str) -> dict[str, Any]:
    return {
        "model_name": "small",
        "litellm_params": {"model": "openai/small", "api_base": f"{upstream_url}/v1", "api_key": "sk-x"},
        "model_info": {"max_input_tokens": WINDOW, "token_margin": 1.0},
    }


def long_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Turn {turn}: the depot in city {turn} keeps {turn * 7} crates. " * 6}
        )
        messages.append({"role": "assistant", "content": f"Noted for turn {turn}."})
    messages.append({"role": "user", "content": QUESTION})
    return messages


def asks(body: dict[str, Any]) -> bool:
    last = without_recall(body["messages"][-1])  # the retry may carry recalled excerpts after the question
    return isinstance(last.get("content"), str) and last["content"].endswith(QUESTION)


QUESTION = "How many crates does the depot in city 3 keep?"


def test_an_upstream_context_length_refusal_is_compacted_and_retried_once(
    app_factory: Any, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    proxy = app_factory(models=[small_model(upstream_url)])
    messages = long_history(18)
    # llama.cpp's answer when the prompt is larger than the slot's context.
    fake_upstream.enqueue(
        Reply(
            status=400,
            error_message="the request exceeds the available context size, try increasing it",
            error_type="exceed_context_size_error",
        )
    )
    response = proxy.client.post(
        f"{proxy.base_url}/chat/completions", json={"model": "small", "messages": messages}, timeout=60
    )
    assert response.status_code == 200, response.text
    # The question is the newest message of both.
    chats = [r.body for r in fake_upstream.requests if asks(r.body)]
    assert len(chats) == 2  # the refused request and the one retry
    assert count_messages(chats[1]["messages"]) < count_messages(chats[0]["messages"])
    assert count_messages(chats[1]["messages"]) <= WINDOW * 3 // 4
    assert response.headers["x-lcm-compaction"] in ("inline", "evicted")


def test_a_second_refusal_reaches_the_client_with_the_upstreams_own_fields(
    app_factory: Any, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    proxy = app_factory(models=[small_model(upstream_url)])
    refusal = Reply(status=400, error_message="prompt is too long", error_type="exceed_context_size_error")
    fake_upstream.responder = lambda body: refusal if asks(body) else Reply()
    response = proxy.client.post(
        f"{proxy.base_url}/chat/completions", json={"model": "small", "messages": long_history(18)}, timeout=60
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "exceed_context_size_error"
    assert response.headers["x-lcm-conversation-id"].startswith("conv_")
    assert sum(1 for r in fake_upstream.requests if asks(r.body)) == 2


def test_the_proxys_own_context_length_refusal_names_the_stored_conversation(
    app_factory: Any, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    proxy = app_factory(models=[small_model(upstream_url)])
    first = proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": [{"role": "user", "content": "hello"}]},
        timeout=60,
    )
    conversation = first.headers["x-lcm-conversation-id"]
    # Too long for what max_tokens leaves of the window, yet short of a paste the proxy would store aside.
    long = {"role": "user", "content": "word " * 800}
    response = proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        json={
            "model": "small",
            "max_tokens": 3500,
            "messages": [{"role": "user", "content": "hello"}, first.json()["choices"][0]["message"], long],
        },
        headers={"x-lcm-conversation-id": conversation},
        timeout=60,
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert response.headers["x-lcm-conversation-id"] == conversation
