"""Recall through the real proxy: a fact compacted out of the context is found again by the model calling
lcm_grep then lcm_describe, and the client sees one ordinary answer with no trace of the recall calls."""

from __future__ import annotations

import asyncio
import json
import re
from functools import partial
from typing import Any

import httpx
import openai
import pytest

from proxy.engine.ingest import export_conversation
from proxy.store.location import Location
from tests.support.fakes import FakeUpstream, Reply
from tests.support.sim import is_summary_request, start_sim_proxy

FACT = "The launch code for project Heron is ZEBRA-4471."


def history() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": f"Remember this. {FACT}"},
        {"role": "assistant", "content": "Noted."},
    ]
    for i in range(60):
        out.append({"role": "user", "content": f"Topic {i}: " + "let us talk about the weather and gardening. " * 8})
        out.append({"role": "assistant", "content": f"Reply {i}: " + "gardening is fun in the spring and summer. " * 8})
    out.append({"role": "user", "content": "What was the launch code for project Heron?"})
    return out


class RecallingModel:
    """Summaries never keep the fact; the chat model looks it up with the recall tools."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content="Summary: small talk about weather and gardening.")
        last = body["messages"][-1]
        names = [t["function"]["name"] for t in body.get("tools") or []]
        if last["role"] == "user" and "lcm_grep" in names:
            self.steps.append("grep")
            return Reply(
                content=None,
                tool_calls=[
                    {
                        "id": "rc_1",
                        "type": "function",
                        "function": {"name": "lcm_grep", "arguments": json.dumps({"pattern": "launch code"})},
                    }
                ],
            )
        if last["role"] == "tool" and last["tool_call_id"] == "rc_1":
            # Pick the hit that is not the question itself (as a model reading the snippets would).
            line = next(x for x in last["content"].splitlines() if "msg_" in x and "What was" not in x)
            found = re.search(r"msg_\d+", line)
            assert found, last["content"]
            self.steps.append("describe")
            return Reply(
                content=None,
                tool_calls=[
                    {
                        "id": "rc_2",
                        "type": "function",
                        "function": {"name": "lcm_describe", "arguments": json.dumps({"id": found.group(0)})},
                    }
                ],
            )
        if last["role"] == "tool" and last["tool_call_id"] == "rc_2":
            code = re.search(r"[A-Z]+-\d{4}", last["content"])
            self.steps.append("answer")
            return Reply(content=f"The launch code was {code.group(0) if code else 'not found'}.")
        return Reply(content="I do not know.")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_fact_recovered_through_grep_and_describe(
    where: Location, proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, stream: bool
) -> None:
    model = RecallingModel()
    fake_upstream.responder = model
    proxy = start_sim_proxy(partial(proxy_factory, where=where), upstream_url)
    sdk = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=60)
    messages = history()
    if stream:
        chunks = list(
            sdk.chat.completions.create(
                model="small", messages=messages, max_tokens=400, stream=True, stream_options={"include_usage": True}
            )
        )  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["stop"]
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 18 * 3  # summed over three rounds
    else:
        result = sdk.chat.completions.create(model="small", messages=messages, max_tokens=400)  # type: ignore[arg-type]
        text = result.choices[0].message.content or ""
        assert result.choices[0].message.tool_calls is None and result.choices[0].finish_reason == "stop"
        assert result.usage is not None and result.usage.total_tokens == 18 * 3
    assert text == "The launch code was ZEBRA-4471."
    assert model.steps == ["grep", "describe", "answer"]
    chats = [r.body for r in fake_upstream.requests if not is_summary_request(r.body)]
    # The turn that stated the fact was compacted (the fact itself now survives in the summary's fact list), and
    # the recall tools were offered: the model can still read the original words.
    assert str(chats[0]["messages"][1]["content"]).startswith('<summary id="sum_')
    assert {t["function"]["name"] for t in chats[0]["tools"]} >= {
        "lcm_grep",
        "lcm_describe",
        "lcm_expand",
        "lcm_expand_query",
    }
    # The recall round trip is kept out of the stored transcript: the next request continues normally.
    follow = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "thanks"}]
    response = httpx.post(
        f"{proxy.base_url}/chat/completions", json={"model": "small", "messages": follow, "max_tokens": 400}, timeout=60
    )
    assert response.status_code == 200
    conversation = response.headers["x-lcm-conversation-id"]
    # Stored: exactly what the client sent, and the answer relayed for it; none of the recall round trip.
    exported = asyncio.run(_export(proxy.config.general_settings.location(), conversation))
    assert exported == [*follow, {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}]


async def _export(location: Location, conversation: str) -> list[dict[str, Any]]:
    store, files = location.stores()
    await store.open()
    try:
        return await export_conversation(store, files, None, conversation)
    finally:
        await store.close()


def test_client_tools_are_returned_and_recall_calls_hidden(
    where: Location, proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    def responder(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content="Summary.")
        mixed = [
            {"id": "c1", "type": "function", "function": {"name": "lcm_grep", "arguments": '{"pattern": "x"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ]
        return Reply(content=None, tool_calls=mixed)

    fake_upstream.responder = responder
    proxy = start_sim_proxy(partial(proxy_factory, where=where), upstream_url)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    response = httpx.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": history(), "tools": tools, "max_tokens": 400},
        timeout=60,
    )
    message = response.json()["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_no_recall_tools_below_threshold(proxy: Any, fake_upstream: FakeUpstream) -> None:
    httpx.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert "tools" not in fake_upstream.last.body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tool_loop_stays_within_budget(
    where: Location, proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, stream: bool
) -> None:
    """A greedy model asking for three broad greps every round never pushes a request over the budget."""
    from tests.support.sim import forwarded_tokens

    def greedy(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content="Summary: small talk.")
        if any(t["function"]["name"] == "lcm_grep" for t in body.get("tools") or []):
            n = len(body["messages"])
            calls = [
                {
                    "id": f"g{n}_{i}",
                    "type": "function",
                    "function": {"name": "lcm_grep", "arguments": json.dumps({"pattern": ".", "limit": 50})},
                }
                for i in range(3)
            ]
            return Reply(content=None, tool_calls=calls)
        return Reply(content="Final answer.")

    fake_upstream.responder = greedy
    proxy = start_sim_proxy(partial(proxy_factory, where=where), upstream_url)
    body = {"model": "small", "messages": history(), "max_tokens": 400, "stream": stream}
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    else:
        text = response.json()["choices"][0]["message"]["content"]
    assert text == "Final answer."
    chats = [r.body for r in fake_upstream.requests if not is_summary_request(r.body)]
    assert len(chats) >= 2
    for sent in chats:
        assert forwarded_tokens(sent) + 400 <= 8000, forwarded_tokens(sent)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_expand_query_survives_a_summary_model_that_times_out(
    where: Location, proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, stream: bool
) -> None:
    """lcm_expand_query's summary call times out: the model gets the sources as the tool's result and the
    client its answer, not a 500 (the request *was* forwarded)."""

    def responder(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(content="Summary: small talk about weather and gardening.")
        first = body["messages"][0].get("content")
        if isinstance(first, str) and first.startswith("Answer the question using only"):
            return Reply(content="too late", delay=3)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Reply(content=f"Read {len(last['content'])} characters.")
        arguments = json.dumps({"prompt": "What was discussed?", "query": "gardening"})
        call = {"id": "q1", "type": "function", "function": {"name": "lcm_expand_query", "arguments": arguments}}
        return Reply(content=None, tool_calls=[call])

    fake_upstream.responder = responder
    proxy = start_sim_proxy(partial(proxy_factory, where=where), upstream_url, summary_timeout=1)
    body = {"model": "small", "messages": history(), "max_tokens": 400, "stream": stream}
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        assert not any("error" in e for e in events)
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    else:
        text = response.json()["choices"][0]["message"]["content"]
    assert text.startswith("Read ")
    tool_results = [m["content"] for r in fake_upstream.requests for m in r.body["messages"] if m["role"] == "tool"]
    assert tool_results and tool_results[-1].startswith("(The summary model did not answer; the sources follow.)")
    assert "gardening" in tool_results[-1]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_no_recall_tools_when_several_choices_are_asked_for(
    where: Location, proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, stream: bool
) -> None:
    """The recall loop answers for one choice; with n > 1 the request is forwarded without the recall tools
    (so the client can never see an ``lcm_*`` call)."""
    fake_upstream.responder = lambda body: Reply(content="Summary." if is_summary_request(body) else "ok")
    proxy = start_sim_proxy(partial(proxy_factory, where=where), upstream_url)
    for n, offered in ((2, False), (1, True)):
        body = {"model": "small", "messages": history(), "max_tokens": 400, "stream": stream, "n": n}
        response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        chat = next(r.body for r in reversed(fake_upstream.requests) if not is_summary_request(r.body))
        assert chat["n"] == n
        assert ("lcm_grep" in json.dumps(chat.get("tools"))) is offered
