"""The recall tools on the Messages door: a translated request (an OpenAI-compatible deployment whose model calls
tools) runs the recall-tool loop on its Chat Completions form once the conversation is compacted; the proxy runs
the ``lcm_*`` calls itself and the client sees one ordinary Messages answer, streamed or not."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.support.fake_anthropic import AReply, FakeAnthropic, claude_models
from tests.support.fakes import FakeUpstream, Reply

FACT = "The vault combination is 31-17-4."


def _grep(pattern: str) -> dict[str, Any]:
    return {
        "id": "call_g",
        "type": "function",
        "function": {"name": "lcm_grep", "arguments": f'{{"pattern": "{pattern}"}}'},
    }


@pytest.mark.parametrize("stream", [False, True])
def test_a_translated_request_recalls_through_the_tools(
    proxy_factory: Any,
    fake_anthropic_server: tuple[Any, str],
    fake_upstream: FakeUpstream,
    upstream_url: str,
    stream: bool,
) -> None:
    proxy = proxy_factory(
        lcm={"fresh_tail_count": 2, "leaf_chunk_tokens": 400, "auto_recall": "off", "retrieval_tools": "always"},
        models=claude_models(fake_anthropic_server[1], upstream_url, window=4_000),
    )
    sdk = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    fake_upstream.responder = lambda body: Reply(content="noted")
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Remember: {FACT}"}]
    headers = {"x-claude-code-session-id": f"recall-{stream}"}
    for i in range(24):
        answer = sdk.messages.create(model="local-claude", max_tokens=200, messages=messages, extra_headers=headers)
        messages += [{"role": "assistant", "content": answer.content[0].text}]
        messages.append({"role": "user", "content": f"Turn {i}: " + "more notes on the cache " * 30})
    messages[-1] = {"role": "user", "content": "What is the vault combination?"}

    def model(body: dict[str, Any]) -> Reply:  # the proxy's own summariser calls get "noted" too
        if any(m.get("role") == "tool" for m in body["messages"]):
            return Reply(content="It is 31-17-4.")
        if "vault combination?" in str(body["messages"][-1]) and body.get("tools"):
            return Reply(content=None, tool_calls=[_grep("vault")])
        return Reply(content="noted")

    fake_upstream.responder = model
    if stream:
        with sdk.messages.stream(model="local-claude", max_tokens=200, messages=messages, extra_headers=headers) as s:
            final = s.get_final_message()
    else:
        final = sdk.messages.create(model="local-claude", max_tokens=200, messages=messages, extra_headers=headers)
    assert [b.type for b in final.content] == ["text"]  # the recall call never reaches the client
    assert final.content[0].text == "It is 31-17-4."
    asked = [r for r in fake_upstream.requests if "vault combination?" in str(r.body["messages"][-1])]
    first, second = (
        asked[0],
        next(r for r in fake_upstream.requests if any(m.get("role") == "tool" for m in r.body["messages"])),
    )
    assert any(t["function"]["name"] == "lcm_grep" for t in first.body["tools"])
    results = [m for m in second.body["messages"] if m.get("role") == "tool"]
    assert results and "31-17-4" in results[-1]["content"]  # the grep found the fact in the stored history


@pytest.mark.parametrize("stream", [False, True])
def test_a_native_request_recalls_through_the_tools_in_anthropics_format(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
    upstream_url: str,
    stream: bool,
) -> None:
    proxy = proxy_factory(
        lcm={"fresh_tail_count": 2, "leaf_chunk_tokens": 400, "auto_recall": "off", "retrieval_tools": "always"},
        models=claude_models(fake_anthropic_server[1], upstream_url, window=4_000),
    )
    sdk = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)

    def model(body: dict[str, Any]) -> AReply:  # the proxy's summariser calls get "noted" too
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return AReply(text="It is 31-17-4.")
        names = [t["name"] for t in body.get("tools") or []]
        if "vault combination?" in str(last) and "lcm_grep" in names:
            return AReply(
                text="Let me look.", tool_uses=[{"id": "toolu_g", "name": "lcm_grep", "input": {"pattern": "vault"}}]
            )
        return AReply(text="noted")

    fake_anthropic.responder = model
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Remember: {FACT}"}]
    headers = {"x-claude-code-session-id": f"native-recall-{stream}"}
    for i in range(24):
        answer = sdk.messages.create(
            model="claude-sonnet-4-5", max_tokens=200, messages=messages, extra_headers=headers
        )
        messages += [{"role": "assistant", "content": answer.content[0].text}]
        messages.append({"role": "user", "content": f"Turn {i}: " + "more notes on the cache " * 30})
    messages[-1] = {"role": "user", "content": "What is the vault combination?"}
    if stream:
        with sdk.messages.stream(
            model="claude-sonnet-4-5", max_tokens=200, messages=messages, extra_headers=headers
        ) as s:
            final = s.get_final_message()
    else:
        final = sdk.messages.create(model="claude-sonnet-4-5", max_tokens=200, messages=messages, extra_headers=headers)
    assert [b.type for b in final.content] == ["text", "text"]  # the recall call never reaches the client
    assert final.content[-1].text == "It is 31-17-4."
    assert final.stop_reason == "end_turn"
    answered = next(r for r in fake_anthropic.requests if "tool_result" in str(r.body["messages"][-1]))
    result = answered.body["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_g" and "31-17-4" in str(result["content"])
