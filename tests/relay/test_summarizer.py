"""The summariser alone, with a scripted upstream in process (``tests.support.upstream``): what it sends the
summary model, and when it gives way to a chat request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.engine.summarize import SWEEP_MODE, SummaryPreempted, Yielding
from proxy.relay.priority import Priority
from proxy.relay.summarizer import MAX_INPUT_CHARS, UpstreamSummarizer
from proxy.upstream.routing import ResolvedModel
from tests.support.upstream import ScriptedUpstream

TARGET = ResolvedModel("summary", {"model": "openai/summary", "api_base": "http://127.0.0.1:9/v1"}, None, None)
DOCUMENT = "".join(f"line {i} of a long report about the launch plan\n" for i in range(4000))  # ~180k chars


def said(content: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def document_sent(upstream: ScriptedUpstream) -> str:
    (body,) = upstream.requests
    return str(body["messages"][1]["content"])


@pytest.mark.parametrize(("window", "most"), [(None, MAX_INPUT_CHARS), (2000, (2000 - 300 - 400) * 3)])
def test_a_document_is_clipped_to_the_summary_models_window(window: int | None, most: int) -> None:
    """The window ``ModelPolicy`` gives the summariser caps what one call carries: a document is cut in its
    middle to fit, at a conservative 3 characters per token."""
    upstream = ScriptedUpstream([said("A launch plan.")])
    summarizer = UpstreamSummarizer(upstream, TARGET, timeout=5, window=window)
    text = asyncio.run(summarizer.summarize_text(DOCUMENT, name="plan.txt", max_tokens=300))
    assert text == "A launch plan."
    sent = document_sent(upstream)
    assert "characters omitted" in sent and "line 0 of" in sent and "line 3999 of" in sent
    note = 100  # the "[... N characters omitted ...]" line and the <document> wrapper
    assert most - 600 < len(sent) <= most + note


def test_an_answer_without_text_is_an_empty_summary() -> None:
    upstream = ScriptedUpstream([said(None)])
    summarizer = UpstreamSummarizer(upstream, TARGET, timeout=5)
    assert asyncio.run(summarizer.complete(system="s", user="u", max_tokens=9, temperature=0)) == ""
    (body,) = upstream.requests
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("summary", 9, 0)


def test_a_background_summary_gives_way_to_a_chat_request_in_flight() -> None:
    """A background sweep's call to a server a chat request is using is not sent at all; an inline sweep's is."""
    priority = Priority("always")
    upstream = ScriptedUpstream([said("inline summary")])
    summarizer = UpstreamSummarizer(upstream, TARGET, timeout=5, priority=priority)

    async def call(background: bool) -> str:
        SWEEP_MODE.set(Yielding(background=background))
        return await summarizer.complete(system="s", user="u", max_tokens=9, temperature=0)

    leave = priority.enter(priority.key(TARGET))
    with pytest.raises(SummaryPreempted):
        asyncio.run(call(background=True))
    assert upstream.requests == []
    assert asyncio.run(call(background=False)) == "inline summary"
    leave()
    assert len(upstream.requests) == 1
