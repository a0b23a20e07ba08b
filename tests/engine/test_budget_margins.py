"""Budgets the provider agrees with, through the proxy (in process) and a real fake upstream: every field that reaches
the model is counted (a legacy ``function_call``, the legacy ``functions`` schemas), the window is divided by
the model's token margin, and a ``max_tokens`` that leaves no room is refused naming ``max_tokens``."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from proxy import tokens
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy
from tests.support.sim import ScriptedModel, forwarded_tokens, is_summary_request
from tests.support.transcripts import CODE

WINDOW = 8000
MAX_TOKENS = 400
ROOM = WINDOW - MAX_TOKENS
# Pastes stay whole (no stub), so that what is refused or forwarded is the message itself.
LCM = {"large_file_token_threshold": 50_000, "background_yields": "never"}


def deployment(name: str, model: str, upstream_url: str, **info: Any) -> dict[str, Any]:
    return {
        "model_name": name,
        "litellm_params": {"model": model, "api_base": f"{upstream_url}/v1", "api_key": "k-12345678"},
        "model_info": {"max_input_tokens": WINDOW, **info},
    }


def start(app_factory: Any, upstream_url: str) -> AppProxy:
    models = [
        deployment("local", "openai/local-model", upstream_url),  # unknown tokenizer: 1.1
        deployment("claude", "openai/claude-sonnet-4-5", upstream_url),  # Claude family: 1.15
        deployment("pinned", "openai/local-model", upstream_url, token_margin=1.0),
    ]
    return app_factory(lcm=LCM, models=models)  # type: ignore[no-any-return]


def post(proxy: AppProxy, model: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, **extra}
    return proxy.client.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60)


def chat_requests(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests if not is_summary_request(r.body)]


def paste(n: int) -> dict[str, Any]:
    message = {"role": "user", "content": "word " * n}
    assert n <= tokens.count_message(message) <= n + 10
    return message


def test_the_window_is_divided_by_the_models_token_margin(
    app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """6,800 o200k tokens fit 7,600 by o200k, and by a tokenizer counting 10% more (7,480), not by one counting
    15% more (7,820): a Claude-family model gets the proxy's refusal instead of the provider's."""
    proxy = start(app_factory, upstream_url)
    medium = [paste(6800)]
    refused = post(proxy, "claude", medium)
    assert refused.status_code == 400, refused.text[:300]
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "token margin 1.15 (Claude default; set model_info.token_margin)" in error["message"]
    assert chat_requests(fake_upstream) == []

    accepted = post(proxy, "local", medium)
    assert accepted.status_code == 200, accepted.text[:300]
    (sent,) = chat_requests(fake_upstream)
    assert sent["messages"] == medium and forwarded_tokens(sent) * 1.1 <= ROOM

    fake_upstream.requests.clear()
    large = [paste(7200)]  # 7,920 by a tokenizer counting 10% more
    refused = post(proxy, "local", large)
    assert refused.status_code == 400, refused.text[:300]
    assert "token margin 1.1 (unknown tokenizer" in refused.json()["error"]["message"]
    assert post(proxy, "pinned", large).status_code == 200  # model_info.token_margin: 1.0 lets it through
    (sent,) = chat_requests(fake_upstream)
    assert sent["messages"] == large


def test_a_legacy_function_call_is_counted(app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream) -> None:
    """A 9,000-token ``function_call`` cannot be forwarded to a 7,600-token budget (it used to count 4 tokens
    and was forwarded whole)."""
    fake_upstream.responder = ScriptedModel()
    proxy = start(app_factory, upstream_url)
    messages = [
        {"role": "system", "content": "You write files."},
        {"role": "user", "content": "Write the handlers to handlers.py."},
        {"role": "assistant", "content": None, "function_call": {"name": "write_file", "arguments": CODE}},
        {"role": "function", "name": "write_file", "content": "saved"},
        {"role": "user", "content": "Thanks. What should we test first?"},
    ]
    response = post(proxy, "pinned", messages)
    assert response.status_code == 200, response.text[:300]
    (sent,) = chat_requests(fake_upstream)
    assert "handler_299" not in orjson.dumps(sent["messages"]).decode()  # the call's end did not fit
    assert forwarded_tokens(sent) <= ROOM
    assert sent["messages"][-1] == messages[-1]


FUNCTIONS = [
    {
        "name": f"operation_{i}",
        "description": f"Performs operation {i} on the selected records and reports what changed in detail.",
        "parameters": {
            "type": "object",
            "properties": {
                f"field_{j}": {"type": "string", "description": f"value {j} of the record"} for j in range(6)
            },
        },
    }
    for i in range(40)
]


def test_legacy_functions_are_counted_like_tools(
    app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = ScriptedModel()
    proxy = start(app_factory, upstream_url)
    schemas = tokens.count_text(orjson.dumps(FUNCTIONS).decode())
    assert schemas > 3000
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be helpful."}]
    for i in range(30):
        history.append({"role": "user", "content": f"Question {i}: " + "tell me more about the design. " * 10})
        history.append({"role": "assistant", "content": f"Answer {i}: " + "the design has several layers. " * 10})
    history.append({"role": "user", "content": "What did we decide?"})
    assert ROOM - schemas < tokens.count_messages(history) < ROOM * 0.75  # fits only if the schemas are free
    response = post(proxy, "pinned", history, functions=FUNCTIONS)
    assert response.status_code == 200, response.text[:300]
    (sent,) = chat_requests(fake_upstream)
    assert sent["functions"] == FUNCTIONS
    assert forwarded_tokens(sent) + schemas <= ROOM
    assert sent["messages"][-1] == history[-1]


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_a_reserve_that_leaves_no_room_names_it(
    param: str, app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    proxy = start(app_factory, upstream_url)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    body = {"model": "pinned", "messages": messages, param: 2**31}
    response = proxy.client.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "context_length_exceeded"
    assert f"{param} {2**31} leaves no room" in error["message"]
    assert f"context window {WINDOW} (model_info.max_input_tokens)" in error["message"]
    assert "are available for messages" not in error["message"]  # not "only -2147476xxx are available"
    assert fake_upstream.requests == []
    assert proxy.client.get(f"{proxy.url}/lcm/conversations").json()["data"] == []  # refused before anything is stored
