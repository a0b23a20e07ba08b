"""A model that calls an ``lcm_`` tool the proxy did not offer this request (before any compaction, the recall
tools are not offered) gets its call neither run nor passed on: the client offered no such tool."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.fakes import FakeUpstream, Reply

GREP = {"id": "call_1", "type": "function", "function": {"name": "lcm_grep", "arguments": '{"pattern": "x"}'}}
WEATHER = {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("stream", [False, True])
def test_made_up_recall_calls_never_reach_the_client(proxy: Any, fake_upstream: FakeUpstream, stream: bool) -> None:
    # Two calls under one id are a malformed answer whatever their names (tests/engine/test_tool_call_rules.py):
    # here two well-formed ones.
    second = {**GREP, "id": "call_1b"}
    fake_upstream.enqueue(Reply(content="Here you go.", tool_calls=[GREP, second]))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)
    asked = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        chunks = list(client.chat.completions.create(**asked, stream=True))
        calls = [c for ch in chunks for choice in ch.choices for c in choice.delta.tool_calls or []]
        text = "".join(choice.delta.content or "" for ch in chunks for choice in ch.choices)
        finish = [choice.finish_reason for ch in chunks for choice in ch.choices if choice.finish_reason]
    else:
        answer = client.chat.completions.create(**asked)
        calls, text, finish = (
            answer.choices[0].message.tool_calls or [],
            answer.choices[0].message.content,
            [answer.choices[0].finish_reason],
        )
    assert calls == []
    assert text == "Here you go."
    assert finish == ["stop"]


def test_the_clients_own_call_beside_a_made_up_one_keeps_index_zero(proxy: Any, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content=None, tool_calls=[GREP, WEATHER]))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "weather?"}],
            tools=TOOLS,
            stream=True,  # type: ignore[arg-type]
        )
    )
    calls = [c for ch in chunks for choice in ch.choices for c in choice.delta.tool_calls or []]
    assert {c.index for c in calls} == {0}
    assert [c.function.name for c in calls if c.function and c.function.name] == ["weather"]
