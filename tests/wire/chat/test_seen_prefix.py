"""A long transcript re-sent through the chat door: the messages the door validated before are not checked
again (``proxy.engine.seen``), yet a malformed message anywhere is still refused naming it, and an edited old
message still forks."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.wire.chat import validation
from tests.support.fakes import FakeUpstream
from tests.support.proxies import UPSTREAM_KEY, AppProxy

N = 5000


@pytest.fixture
def proxy(app_factory: Any, upstream_url: str) -> AppProxy:
    big = {
        "model_name": "big",
        "litellm_params": {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": UPSTREAM_KEY},
        "model_info": {"max_input_tokens": 2_000_000},
    }
    # The standing-instructions reader is most of a 5,000-message first turn's time, and not what this is about.
    return app_factory({"standing_instructions": "off"}, [big])  # type: ignore[no-any-return]


def transcript(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(n):
        out.append(
            {"role": "user", "content": f"question {i}"}
            if i % 2 == 0
            else {"role": "assistant", "content": f"answer {i}"}
        )
    return out


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def post(proxy: AppProxy, messages: list[Any]) -> Any:
    return proxy.client.post(
        f"{proxy.base_url}/chat/completions", json={"model": "big", "messages": messages}, timeout=120
    )


def test_a_malformed_message_deep_in_a_long_resend_is_refused_naming_it(
    proxy: AppProxy, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = transcript(N)
    assert post(proxy, messages).status_code == 200
    longer = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
    checked: list[str] = []
    check = validation.check_message
    monkeypatch.setattr(validation, "check_message", lambda m, param: (checked.append(param), check(m, param)))
    response = post(proxy, longer)
    assert response.status_code == 200, response.text
    # The instructions and the two new messages: the 5,000 the door validated before are not checked again.
    assert checked == ["messages[0]", f"messages[{N + 1}]", f"messages[{N + 2}]"]
    forwarded = len(fake_upstream.requests)
    for index, bad, param in [
        (3, {"role": "user", "content": 5}, "messages[3].content"),
        (2500, {"role": "user", "content": [{"type": "video"}]}, "messages[2500].content[0].type"),
        (N, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}, f"messages[{N}].tool_calls[0].function.arguments"),
        (4000, {"role": "user", "content": "x", "metadata": nested(70)}, "messages[4000].metadata"),
        (1, {"role": "wizard", "content": "hi"}, "messages[1].role"),
    ]:  # fmt: skip
        edited = [*longer[:index], bad, *longer[index + 1 :]]
        response = post(proxy, edited)
        assert response.status_code == 400, (index, response.text)
        assert response.json()["error"]["param"] == param
    assert len(fake_upstream.requests) == forwarded  # nothing refused reached the upstream
    assert post(proxy, longer).status_code == 200  # the valid transcript is still itself


def test_an_edited_old_message_in_a_long_resend_forks(proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    messages = transcript(N)
    first = post(proxy, messages)
    original = first.headers["x-lcm-conversation-id"]
    longer = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
    assert post(proxy, longer).headers["x-lcm-conversation-id"] == original
    edited = [*longer[:1234], {**longer[1234], "content": longer[1234]["content"] + " (edited)"}, *longer[1235:]]
    fork = post(proxy, edited)
    assert fork.status_code == 200
    assert fork.headers["x-lcm-conversation-id"] != original
    assert fake_upstream.last.body["messages"] == edited  # forwarded as the client sent it
    assert post(proxy, longer).headers["x-lcm-conversation-id"] == original
