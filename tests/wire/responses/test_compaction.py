"""Codex's two compactions, answered by the door itself (in-process shapes; Codex's own runs are in
``test_codex``): remotely exactly one ``compaction`` item whose handle the proxy expands on later requests and
never forwards, locally a digest with a checkpoint marker; a handle that is not the scope's is a 400."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.fake_responses import FakeResponses, RReply
from tests.support.fakes import FakeUpstream, Reply

MODELS = ["local-codex", "gpt-5-codex"]
FACT = "The vault code is ZEBRA-9."
PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM."
HEADERS = {"authorization": "Bearer sk-x", "session-id": "019a-session-1"}


def msg(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


BASE = msg("developer", "You are Codex.")
AGENTS = msg("user", "# AGENTS.md instructions for /work\n\n<INSTRUCTIONS>\nRULE-7731\n</INSTRUCTIONS>")


def post(proxy: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/responses", json=body, headers=headers or HEADERS, timeout=60)


def history() -> list[dict[str, Any]]:
    return [BASE, AGENTS, msg("user", "USER-1: hello"), msg("assistant", FACT), msg("user", "USER-2: go on"),
            msg("assistant", "done")]  # fmt: skip


def upstream_input(model: str, fake_upstream: FakeUpstream, fake_responses: FakeResponses) -> str:
    if model == "gpt-5-codex":
        return str(fake_responses.last.body["input"])
    return str(fake_upstream.last.body["messages"])


def sse_events(answer: httpx.Response) -> list[dict[str, Any]]:
    import json

    return [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_remote_compaction_gets_exactly_one_item_which_later_requests_expand(
    responses_proxy: Any, fake_upstream: FakeUpstream, fake_responses: FakeResponses, model: str, stream: bool
) -> None:
    for text in ("done", "ok"):  # the two turns before (stored by the proxy as they go)
        fake_upstream.enqueue(Reply(content=text))
        fake_responses.enqueue(RReply(text=text))
    assert post(responses_proxy, {"model": model, "input": history()[:5]}).status_code == 200
    seen = (len(fake_upstream.requests), len(fake_responses.requests))
    trigger = {"model": model, "input": [*history(), {"type": "compaction_trigger"}], "stream": stream}
    answer = post(responses_proxy, trigger)
    assert answer.status_code == 200, answer.text
    if stream:
        events = sse_events(answer)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.completed"
        output = events[-1]["response"]["output"]
        assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == ["compaction"]
    else:
        output = answer.json()["output"]
    assert [i["type"] for i in output] == ["compaction"]  # exactly one item: Codex's most reported failure
    assert (len(fake_upstream.requests), len(fake_responses.requests)) == seen  # no model call
    # Codex's next request: its base prompt, the user messages it kept, its instructions again, the item, the prompt.
    item = output[0]
    after = [BASE, msg("user", "USER-1: hello"), msg("user", "USER-2: go on"), AGENTS, item,
             msg("user", "USER-3: what vault code did you give me?")]  # fmt: skip
    fake_upstream.enqueue(Reply(content="ZEBRA-9"))
    fake_responses.enqueue(RReply(text="ZEBRA-9"))
    later = post(responses_proxy, {"model": model, "input": after})
    assert later.status_code == 200, later.text
    sent = upstream_input(model, fake_upstream, fake_responses)
    assert FACT in sent and "RULE-7731" in sent and "USER-3" in sent
    assert item["encrypted_content"] not in sent  # the handle never goes upstream (the strict fake refuses it)
    assert sent.index("RULE-7731") < sent.index("USER-1")  # the instructions back in their first place


@pytest.mark.parametrize("model", MODELS)
def test_a_local_compaction_is_answered_with_a_digest_and_its_marker_expands(
    responses_proxy: Any, fake_upstream: FakeUpstream, fake_responses: FakeResponses, model: str
) -> None:
    fake_upstream.enqueue(Reply(content="done"))
    fake_responses.enqueue(RReply(text="done"))
    assert post(responses_proxy, {"model": model, "input": history()[:5]}).status_code == 200
    seen = (len(fake_upstream.requests), len(fake_responses.requests))
    answer = post(responses_proxy, {"model": model, "input": [*history(), msg("user", PROMPT)]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-lcm-client-compaction"] == "answered"
    output = answer.json()["output"]
    assert [i["type"] for i in output] == ["message"]
    summary = output[0]["content"][0]["text"]
    assert "lcm_ckpt_" in summary
    assert (len(fake_upstream.requests), len(fake_responses.requests)) == seen  # no model call
    prefix = "Another language model started to solve this problem and produced a summary of its thinking process."
    after = [BASE, msg("user", "USER-1: hello"), AGENTS, msg("user", "USER-2: go on"), msg("user", f"{prefix}:\n{summary}"),
             msg("user", "USER-3: what vault code?")]  # fmt: skip
    fake_upstream.enqueue(Reply(content="ZEBRA-9"))
    fake_responses.enqueue(RReply(text="ZEBRA-9"))
    assert post(responses_proxy, {"model": model, "input": after}).status_code == 200
    sent = upstream_input(model, fake_upstream, fake_responses)
    assert FACT in sent and "USER-3" in sent
    assert "lcm_ckpt_" not in sent  # the summary was replaced by what it stands for


def test_a_forged_or_foreign_compaction_item_is_a_400(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    from tests.support.fake_responses import responses_models

    keys = [{"key": "sk-proxy-alice-000000", "tenant": "alice"}, {"key": "sk-proxy-bob-1111111", "tenant": "bob"}]
    proxy = proxy_factory(models=responses_models("http://127.0.0.1:9", upstream_url), api_keys=keys)
    alice = {**HEADERS, "authorization": "Bearer sk-proxy-alice-000000"}
    bob = {**HEADERS, "authorization": "Bearer sk-proxy-bob-1111111"}
    fake_upstream.enqueue(Reply(content="done"))
    assert post(proxy, {"model": "local-codex", "input": history()[:5]}, alice).status_code == 200
    answer = post(proxy, {"model": "local-codex", "input": [*history(), {"type": "compaction_trigger"}]}, alice)
    item = answer.json()["output"][0]
    forged = {**item, "encrypted_content": "lcm_ckpt_" + "A" * 43}
    for headers, compaction in ((bob, item), (alice, forged), (alice, {**item, "encrypted_content": "gAAAA-openai"})):
        refused = post(proxy, {"model": "local-codex", "input": [BASE, compaction, msg("user", "next")]}, headers)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "input[1].encrypted_content"
    assert post(proxy, {"model": "local-codex", "input": [BASE, item, msg("user", "next")]}, alice).status_code == 200


@pytest.mark.parametrize("model", MODELS)
def test_a_turn_that_cannot_fit_ends_its_stream_in_response_failed(
    proxy_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, model: str
) -> None:
    from tests.support.fake_responses import responses_models

    proxy = proxy_factory(models=responses_models(fake_responses_server[1], upstream_url, window=2000))
    # Images by URL are never stored out of line: twenty of them are more than the window by themselves.
    image = {"type": "input_image", "image_url": "https://example.invalid/cat.png"}
    huge = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"}, *[image] * 20]}
    answer = post(proxy, {"model": model, "input": [huge], "stream": True})
    assert answer.status_code == 200
    events = sse_events(answer)
    assert [e["type"] for e in events] == ["response.created", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"


def test_an_upstream_failure_mid_stream_ends_in_response_failed(
    responses_proxy: Any, fake_responses: FakeResponses
) -> None:
    fake_responses.enqueue(RReply(error_mid_stream=True, error_code="server_error", error_message="boom"))
    answer = post(responses_proxy, {"model": "gpt-5-codex", "input": "hi", "stream": True})
    events = sse_events(answer)
    assert events[-1]["type"] == "response.failed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert sum(e["type"] in ("response.completed", "response.failed") for e in events) == 1


def test_instructions_larger_than_the_window_end_the_stream_in_context_length_exceeded(
    proxy_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str
) -> None:
    """Codex's ~10k tokens of instructions sent to a model with an 8k window: its first request ends in
    ``response.failed`` with the code Codex reads as a full window (docs/clients.md#codex)."""
    from tests.support.fake_responses import responses_models

    proxy = proxy_factory(models=responses_models(fake_responses_server[1], upstream_url, window=8192))
    base = msg("developer", " ".join(f"Rule {i}: keep the code tidy and the tests honest." for i in range(4000)))
    answer = post(proxy, {"model": "local-codex", "input": [base, msg("user", "hi")], "stream": True})
    events = sse_events(answer)
    assert [e["type"] for e in events] == ["response.created", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"
