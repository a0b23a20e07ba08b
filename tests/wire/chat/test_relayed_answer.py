"""The answer the proxy relayed is stored before the response ends, and the client's own version wins when it comes back.

Through the real proxy and the fake upstream over loopback: after a streamed or plain reply the conversation
ends with that answer (``export`` has it); a client that sends it back unchanged, changed, or not at all
(regenerate) never forks the conversation.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import orjson
import pytest

from proxy.errors import ProxyError, UpstreamError
from proxy.wire.chat.answer import Answer, relay_sse
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import RunningProxy


def chat(proxy: RunningProxy, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": "test-model", "messages": messages, **extra}
    return httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=30)


def stored(proxy: RunningProxy, conversation: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{proxy.url}/lcm/conversations/{conversation}/messages", timeout=30)
    assert response.status_code == 200, response.text
    return [item["message"] for item in response.json()["data"]]


def conversations(proxy: RunningProxy) -> list[dict[str, Any]]:
    response = httpx.get(f"{proxy.url}/lcm/conversations", timeout=30)
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def test_a_streamed_answer_is_stored_without_the_client_sending_it_back(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(content="The capital is Lisbon, on the Tagus."))
    sdk = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is the capital of Portugal?"}]
    with sdk.chat.completions.with_streaming_response.create(model="test-model", messages=messages, stream=True) as raw:
        conversation = raw.headers["x-lcm-conversation-id"]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert text == "The capital is Lisbon, on the Tagus."
    assert len(stored(proxy, conversation)) == 2
    assert stored(proxy, conversation)[-1] == {"role": "assistant", "content": text}


def test_a_plain_answer_then_the_clients_identical_copy_appends_without_a_fork(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(content="First answer."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "one"}]
    first = chat(proxy, messages)
    conversation = first.headers["x-lcm-conversation-id"]
    assert len(stored(proxy, conversation)) == 2
    # What the SDK hands back, re-sent as the client's history (refusal: null and all).
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "two"}]
    second = chat(proxy, messages)
    assert second.headers["x-lcm-conversation-id"] == conversation
    assert len(stored(proxy, conversation)) == 4
    assert [m["role"] for m in stored(proxy, conversation)] == ["user", "assistant", "user", "assistant"]
    assert len(conversations(proxy)) == 1


def test_the_clients_own_version_of_the_answer_replaces_the_relayed_one_in_place(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(Reply(content="  Relayed answer with spaces.  \n"))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    first = chat(proxy, messages)
    conversation = first.headers["x-lcm-conversation-id"]
    assert len(stored(proxy, conversation)) == 2
    # The client trims the answer before keeping it (many UIs do), then goes on.
    messages += [{"role": "assistant", "content": "Relayed answer with spaces."}, {"role": "user", "content": "next"}]
    second = chat(proxy, messages)
    assert second.headers["x-lcm-conversation-id"] == conversation
    assert len(stored(proxy, conversation)) == 4
    history = stored(proxy, conversation)
    assert history[1] == {"role": "assistant", "content": "Relayed answer with spaces."}
    assert history[2] == {"role": "user", "content": "next"}
    assert len(conversations(proxy)) == 1  # replaced, not forked


def test_a_regenerate_replaces_the_relayed_answer(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="Draft one."), Reply(content="Draft two."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "write a line"}]
    conversation = chat(proxy, messages).headers["x-lcm-conversation-id"]
    assert len(stored(proxy, conversation)) == 2
    again = chat(proxy, messages)  # the same transcript without the answer: regenerate
    assert again.headers["x-lcm-conversation-id"] == conversation
    assert stored(proxy, conversation)[-1].get("content") == "Draft two."
    assert len(stored(proxy, conversation)) == 2
    assert len(conversations(proxy)) == 1


def test_an_answer_with_tool_calls_is_stored_and_the_tool_results_follow_it(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
    fake_upstream.enqueue(Reply(content=None, tool_calls=[call]), Reply(content="It is noon."))
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "what time is it?"}]
    with httpx.stream(
        "POST",
        f"{proxy.base_url}/chat/completions",
        json={"model": "test-model", "messages": messages, "tools": tools, "stream": True},
        timeout=30,
    ) as response:
        conversation = response.headers["x-lcm-conversation-id"]
        response.read()
    assert len(stored(proxy, conversation)) == 2
    assert stored(proxy, conversation)[1] == {"role": "assistant", "content": None, "tool_calls": [call]}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    assert chat(proxy, messages, tools=tools).headers["x-lcm-conversation-id"] == conversation
    assert len(stored(proxy, conversation)) == 4
    assert len(conversations(proxy)) == 1


async def _chunks(*events: dict[str, Any], error: ProxyError | None = None) -> AsyncIterator[dict[str, Any]]:
    for event in events:
        yield event
    if error is not None:
        raise error


def _delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


async def _collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [b async for b in stream]


def test_only_a_stream_that_reached_its_finish_is_kept_as_the_answer() -> None:
    complete, cut = Answer(), Answer()
    sent = asyncio.run(_collect(relay_sse(_chunks(_delta("Hel"), _delta("lo", "stop")), answer=complete)))
    assert sent[-1] == b"data: [DONE]\n\n"
    assert complete.message == {"role": "assistant", "content": "Hello"}
    broken = _chunks(_delta("Hel"), error=UpstreamError("cut", code="upstream_stream_truncated"))
    sent = asyncio.run(_collect(relay_sse(broken, answer=cut)))
    assert b"upstream_stream_truncated" in sent[-1]
    assert cut.message is None


def test_several_choices_are_not_one_answer() -> None:
    answer = Answer()
    message = {"role": "assistant", "content": "x"}
    asyncio.run(answer.keep_result({"choices": [{"index": 0, "message": message}, {"index": 1, "message": message}]}))
    assert answer.message is None
    asyncio.run(answer.keep_result({"choices": [{"index": 0, "message": message}]}))
    assert answer.message == message


def test_an_answer_to_an_earlier_request_does_not_replace_the_answer_to_a_later_one(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """Of two requests with one transcript (an attempt on a slow link and the client's retry), the one that
    ARRIVED later keeps its answer, even when the earlier one's body was read last: the order is the client's,
    not the upload's."""
    transcript = [{"role": "user", "content": "What is a fork?"}]
    body = orjson.dumps({"model": "test-model", "messages": transcript})
    fake_upstream.enqueue(Reply(content="answer R"), Reply(content="answer X"))
    address = urlsplit(proxy.url)
    with socket.create_connection((address.hostname or "127.0.0.1", address.port or 80)) as x:
        # X: the headers and all of the body but its last byte.
        x.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body[:-1])
        )
        # R: the retry, answered at once.
        r = httpx.post(f"{proxy.base_url}/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "answer R"
        cid = r.headers["x-lcm-conversation-id"]
        x.sendall(body[-1:])  # X's body completes now, after R was answered
        reply = b""
        while chunk := x.recv(65536):  # X's whole response: its answer was recorded (or not) before it ended
            reply += chunk
    assert b"answer X" in reply
    stored = httpx.get(f"{proxy.url}/lcm/conversations/{cid}/messages", timeout=30).json()["data"]
    assert [m["message"]["content"] for m in stored] == ["What is a fork?", "answer R"]


def test_the_answer_of_a_client_that_hung_up_is_not_stored(
    proxy: RunningProxy, fake_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that hangs up before its answer arrives never saw it: the conversation must not end with it (the
    multi-replica audit found such answers as messages no client had)."""
    caplog.set_level(logging.INFO, logger="lcm_proxy")
    transcript = [{"role": "user", "content": "Will you remember this?"}]
    body = orjson.dumps({"model": "test-model", "messages": transcript})
    fake_upstream.enqueue(Reply(content="an answer nobody reads", delay=0.5))
    address = urlsplit(proxy.url)
    with socket.create_connection((address.hostname or "127.0.0.1", address.port or 80)) as x:
        x.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        for _ in range(1000):  # until the upstream has it (a bounded wait on a condition)
            if fake_upstream.requests:
                break
            time.sleep(0.01)
        assert fake_upstream.requests
    # The client is gone; the upstream answers. Wait for the proxy to decide (a condition, bounded).
    for _ in range(1000):
        if any("the client hung up" in r.getMessage() for r in caplog.records):
            break
        time.sleep(0.01)
    assert any("the client hung up" in r.getMessage() for r in caplog.records)
    conversations = httpx.get(f"{proxy.url}/lcm/conversations", timeout=30).json()["data"]
    (conversation,) = conversations
    stored = httpx.get(f"{proxy.url}/lcm/conversations/{conversation['id']}/messages", timeout=30).json()["data"]
    assert [m["message"]["content"] for m in stored] == ["Will you remember this?"]
