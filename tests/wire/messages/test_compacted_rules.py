"""Anthropic's rules after the proxy compacted, against the strict fake (which refuses what the real API
refuses): thinking blocks whose prefix changed are not replayed as they were, the newest tool loop's are
dropped by the API at the proxy's request (with the beta that goes with it), at most four cache breakpoints with
one after the summary, and Claude Code's ``context_management`` edits reach the API with their beta."""

from __future__ import annotations

from typing import Any

import anthropic

from tests.support.fake_anthropic import AReply, FakeAnthropic, claude_models, prefix_digest

THINKING = {"type": "enabled", "budget_tokens": 1024}
WORDS = ["amber", "basalt", "cobalt", "dahlia", "ember", "fjord", "garnet", "heron", "indigo", "juniper", "kestrel"]
BETAS = "interleaved-thinking-2025-05-14,context-management-2025-06-27"


def _long_session(proxy: Any, fake: FakeAnthropic, turns: int) -> tuple[anthropic.Anthropic, list[dict[str, Any]]]:
    sdk = anthropic.Anthropic(base_url=proxy.url, api_key="sk-client", max_retries=0)
    messages: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> AReply:  # the session's turns think; the proxy's summariser calls do not
        return (
            AReply(thinking="Thinking about it.", text="Answer.") if body.get("thinking") else AReply(text="A summary.")
        )

    fake.responder = reply
    for i in range(turns):
        # Each turn has a word of its own: an excerpt of an early turn carries what the forwarded context lacks.
        messages.append({"role": "user", "content": f"Turn {i}: {WORDS[i]}. " + "notes about the cache layer " * 40})
        answer = sdk.messages.create(
            model="claude-sonnet-4-5", max_tokens=600, thinking=THINKING, messages=messages,
            extra_headers={"x-claude-code-session-id": "s-1", "anthropic-beta": BETAS},
            extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}},
        )  # fmt: skip
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
    return sdk, messages


def test_after_a_compaction_thinking_and_breakpoints_keep_anthropics_rules(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
    upstream_url: str,
) -> None:
    proxy = proxy_factory(
        lcm={"fresh_tail_count": 4, "leaf_chunk_tokens": 600, "background_yields": "never"},  # compacts inline
        models=claude_models(fake_anthropic_server[1], upstream_url, window=2_400),
    )
    sdk, messages = _long_session(proxy, fake_anthropic, 10)
    turns = [r for r in fake_anthropic.requests if r.body.get("thinking")]
    assert len(turns) == 10  # every turn was answered: the fake refused no replayed thinking block
    compacted = [r for r in turns if "<summary" in str(r.body["messages"][0])]
    assert compacted, "the proxy compacted the session"
    for request in compacted:
        assert request.headers["anthropic-beta"].startswith(BETAS)  # the client's list, verbatim, first
        assert request.body["context_management"] == {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
        first = request.body["messages"][0]
        assert first["role"] == "user"
        assert (
            sum("cache_control" in b for m in request.body["messages"] for b in m["content"] if isinstance(b, dict))
            <= 4
        )

    # A tool loop after the compaction: its thinking block goes back with the call; the API drops it (its prefix
    # changed) because the proxy asked, with the beta that makes the field valid.
    tool = {"name": "read", "description": "read a file", "input_schema": {"type": "object"}}
    messages.append({"role": "user", "content": "read the notes about basalt"})

    def loop_reply(body: dict[str, Any]) -> AReply:  # the proxy's own summariser calls get a summary
        last = str(body["messages"][-1]["content"])
        if "tool_result" in last:
            return AReply(text="Done reading.")
        if "read the notes about basalt" in last and body.get("thinking"):
            return AReply(thinking="I should read.", tool_uses=[{"id": "toolu_9", "name": "read", "input": {}}])
        return AReply(text="A summary.")

    fake_anthropic.responder = loop_reply
    call = sdk.messages.create(
        model="claude-sonnet-4-5", max_tokens=600, thinking=THINKING, tools=[tool], messages=messages,
        extra_headers={"x-claude-code-session-id": "s-1", "anthropic-beta": BETAS},
    )  # fmt: skip
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in call.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "ok"}]})
    done = sdk.messages.create(
        model="claude-sonnet-4-5", max_tokens=600, thinking=THINKING, tools=[tool], messages=messages,
        extra_headers={"x-claude-code-session-id": "s-1", "anthropic-beta": BETAS},
    )  # fmt: skip
    assert done.content[0].text == "Done reading."
    # The client's turn that carried the tool result (a background summariser call may have come after it).
    sent = [
        r for r in fake_anthropic.requests if r.body.get("thinking") and "tool_result" in str(r.body["messages"][-1])
    ][-1]
    assert sent.body["thinking"]["block_binding"] == {"prefix_mismatch_behavior": "drop_block"}
    assert "thinking-binding-controls-2026-08-01" in sent.headers["anthropic-beta"]
    # The API drops the tool loop's thinking block exactly when the prefix it was made for changed (a summary or
    # the recalled excerpts moved; whether they did depends on when the background compaction ran).
    asked = [r for r in fake_anthropic.requests if r.body.get("thinking") and "basalt" in str(r.body["messages"][-1])]
    where = len(sent.body["messages"]) - 2  # the assistant message with the thinking block and the call
    changed = prefix_digest(asked[-1].body, len(asked[-1].body["messages"])) != prefix_digest(sent.body, where)
    assert fake_anthropic.dropped_thinking == int(changed)


def test_a_server_compaction_block_goes_back_verbatim_and_in_place(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
    upstream_url: str,
) -> None:
    """Anthropic's own compaction (``compact_20260112``) answers with a ``compaction`` block the client sends back;
    the API reads nothing before it. The proxy forwards such a transcript as it came, however long."""
    proxy = proxy_factory(
        lcm={"fresh_tail_count": 2, "leaf_chunk_tokens": 400},
        models=claude_models(fake_anthropic_server[1], upstream_url, window=2_400),
    )
    fake_anthropic.responder = lambda body: AReply(text="ok")
    block = {
        "type": "compaction",
        "content": "Earlier: the user set up the cache layer.",
        "encrypted_content": "Zm9v" * 50,
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Turn 0: " + "notes about the cache layer " * 40},
        {"role": "assistant", "content": [block, {"type": "text", "text": "Continuing."}]},
    ]
    for i in range(1, 12):
        messages += [
            {"role": "user", "content": f"Turn {i}: " + "notes about the cache layer " * 40},
            {"role": "assistant", "content": "ok"},
        ]
    messages.append({"role": "user", "content": "and now?"})
    sdk = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    edits = {"edits": [{"type": "compact_20260112"}]}
    answer = sdk.messages.create(
        model="claude-sonnet-4-5", max_tokens=300, messages=messages,
        extra_headers={"anthropic-beta": "context-management-2025-06-27"}, extra_body={"context_management": edits},
    )  # fmt: skip
    assert answer.content[0].text == "ok"
    sent = [r.body for r in fake_anthropic.requests if r.body.get("context_management")][-1]  # not a summariser call
    assert sent["messages"] == messages  # the block verbatim and in place, nothing summarised around it
    assert sent["context_management"] == edits
