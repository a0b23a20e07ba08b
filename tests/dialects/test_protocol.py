"""Each dialect read on a stored transcript of its format: roles, pairs, text, costs, instructions, and the
proxy's own blocks written in that format. The chat dialect must answer exactly what the engine computed
from chat fields before dialects existed."""

from __future__ import annotations

import copy
import itertools

from proxy import tokens
from proxy.dialects import CHAT, MESSAGES, RESPONSES, Dialect, split_instructions
from tests.support import wire_formats as t


def calls_and_results(dialect: Dialect, messages: list[dict]) -> tuple[list[str], list[str]]:
    calls = [c.id for m in messages for c in dialect.tool_calls(m)]
    results = [r for m in messages for r in dialect.result_ids(m)]
    return calls, results


def test_chat_reads_as_the_engine_did() -> None:
    d = CHAT
    assert [d.role(m) for m in t.CHAT] == [
        "system", "developer", "user", "assistant", "tool", "tool", "assistant", "user"
    ]  # fmt: skip
    instructions, transcript = split_instructions(d, t.CHAT)
    assert len(instructions) == 2 and transcript[0]["content"] == "Weather in Oslo and Bergen?"
    roles = [d.role(m) for m in t.CHAT]
    assert [d.continues(a, b) for a, b in itertools.pairwise(roles)] == [
        False, False, False, True, True, False, False
    ]  # fmt: skip
    assert d.continues("user", "function")  # the legacy result role too
    assert [d.count(m) for m in t.CHAT] == [tokens.count_message(m) for m in t.CHAT]
    assert [tuple(c) for c in d.tool_calls(t.CHAT[3])] == [
        ("c1", "weather", '{"city":"Oslo"}'),
        ("c2", "weather", '{"city":"Bergen"}'),
    ]
    assert calls_and_results(d, t.CHAT) == (["c1", "c2"], ["c1", "c2"])
    assert d.header(t.CHAT[4]) == "tool result (c1)"
    assert d.text(t.CHAT[7]) == "Thanks!\n[image: https://x/y.png]"
    assert d.search_text(t.CHAT[3]) == ['weather({"city":"Oslo"})', 'weather({"city":"Bergen"})']
    assert d.summary_message("S") == {"role": "user", "content": "S"}
    assert d.prepend({"role": "user", "content": "hi"}, "B") == {"role": "user", "content": "B\n\nhi"}
    assert d.prepend(t.CHAT[7], "B")["content"][0] == {"type": "text", "text": "B"}
    assert d.prepend({"role": "user", "content": ""}, "B") == {"role": "user", "content": "B"}


def test_messages_pairs_tool_use_with_the_tool_results_of_the_next_user_message() -> None:
    d = MESSAGES
    assert [d.role(m) for m in t.MESSAGES] == t.MESSAGES_ROLES
    assert d.continues("assistant", "tool") and not d.continues("tool", "assistant")
    assert not d.continues("assistant", "user")
    assert [d.user_turn(r) for r in t.MESSAGES_ROLES] == [True, False, False, False, True]
    assert [c.id for c in d.tool_calls(t.MESSAGES[1])] == ["toolu_A", "toolu_B"]
    assert d.result_ids(t.MESSAGES[2]) == ["toolu_A", "toolu_B"]
    assert calls_and_results(d, t.MESSAGES) == (["toolu_A", "toolu_B"], ["toolu_A", "toolu_B"])
    call = d.tool_calls(t.MESSAGES[1])[1]
    assert call.name == "Grep" and '"path":"ops"' in call.arguments
    assert d.header(t.MESSAGES[2]) == "tool result (toolu_A, toolu_B)"
    assert split_instructions(d, t.MESSAGES) == ([], t.MESSAGES)  # the top-level ``system`` is the door's


def test_messages_text_leaves_thinking_out() -> None:
    d = MESSAGES
    assert d.text(t.MESSAGES[1]) == "Searching both folders."
    assert d.text(t.MESSAGES[2]).splitlines()[:2] == ["src/deploy.py:3: KEY = load()", "ops/ci.yml:9"]
    everything = "\n".join(d.text(m) + "\n".join(d.search_text(m)) for m in t.MESSAGES)
    assert "PRIVATE-CHAIN" not in everything and "RDAT" not in everything and t.SIGNATURE not in everything
    assert "K-7781" in d.text(t.MESSAGES[0]) and "Open ops/ci.yml." in d.search_text(t.MESSAGES[4])


def test_messages_costs_are_positive_stable_and_ignore_signatures() -> None:
    d = MESSAGES
    costs = [d.count(m) for m in t.MESSAGES]
    assert all(c > tokens.MESSAGE_OVERHEAD for c in costs)
    assert costs == [d.count(copy.deepcopy(m)) for m in t.MESSAGES]
    short = copy.deepcopy(t.MESSAGES[1])
    short["content"][0]["signature"] = "sig"
    assert d.count(short) == costs[1]  # a signature only lets the API check the block: it is no input
    no_thinking = {**t.MESSAGES[1], "content": t.MESSAGES[1]["content"][1:]}
    assert d.count(no_thinking) < costs[1]  # the thinking text itself is
    assert costs[3] >= len("RDAT" * 50) // 4  # redacted thinking stands for reasoning the model reads


def test_messages_blocks_of_the_proxy_are_valid_messages_content() -> None:
    d = MESSAGES
    block = d.summary_message('<summary id="sum_1">x</summary>')
    assert block == {"role": "user", "content": [{"type": "text", "text": '<summary id="sum_1">x</summary>'}]}
    # Into a user message that carries tool results: after them (the API wants tool_result blocks first).
    merged = d.prepend(t.MESSAGES[2], "RECALL")
    assert [b["type"] for b in merged["content"]] == ["tool_result", "tool_result", "text", "text"]
    assert merged["content"][2] == {"type": "text", "text": "RECALL"}
    assert merged["content"][3] == t.MESSAGES[2]["content"][2]
    first = d.prepend(t.MESSAGES[4], "RECALL")["content"]
    assert first[0] == {"type": "text", "text": "RECALL"} and first[1] == t.MESSAGES[4]["content"][0]
    assert d.prepend(t.MESSAGES[0], "RECALL")["content"] == "RECALL\n\n" + t.MESSAGES[0]["content"]
    assert t.MESSAGES[4]["content"][0] == {
        "type": "text",
        "text": "Open ops/ci.yml.",
        "cache_control": {"type": "ephemeral"},
    }


def test_responses_pairs_calls_with_outputs_and_calls_with_their_reasoning() -> None:
    d = RESPONSES
    roles = [d.role(m) for m in t.RESPONSES]
    assert roles == t.RESPONSES_ROLES
    assert [d.continues(a, b) for a, b in itertools.pairwise(roles)] == [
        False,  # developer -> user
        False,  # user -> reasoning
        True,  # reasoning -> function_call: providers refuse the call without its reasoning item
        True,  # parallel calls stay together
        True,  # outputs follow their calls
        True,
        False,  # output -> reasoning of the next step
        True,  # reasoning -> the message it produced
        False,  # assistant -> user
    ]
    instructions, transcript = split_instructions(d, t.RESPONSES)
    assert instructions == t.RESPONSES[:1] and transcript[0]["role"] == "user"
    assert calls_and_results(d, t.RESPONSES) == (["call_1", "call_2"], ["call_1", "call_2"])
    assert d.tool_calls(t.RESPONSES[3])[0].arguments == '{"cmd":"pytest -q"}'
    assert d.user_turn(d.role(t.RESPONSES[-1]))  # an easy input message without "type"
    assert d.header(t.RESPONSES[5]) == "tool result (call_1)"


def test_responses_text_leaves_reasoning_out_and_costs_count_it() -> None:
    d = RESPONSES
    everything = "\n".join(d.text(m) + "\n".join(d.search_text(m)) for m in t.RESPONSES)
    assert "PRIVATE-SUMMARY" not in everything and "enc" * 10 not in everything
    assert d.text(t.RESPONSES[5]) == "3 passed" and d.text(t.RESPONSES[8]) == "Tests pass, lint clean."
    assert d.search_text(t.RESPONSES[3]) == ['shell({"cmd":"pytest -q"})']
    costs = [d.count(m) for m in t.RESPONSES]
    assert all(c > tokens.MESSAGE_OVERHEAD for c in costs)
    assert costs == [d.count(copy.deepcopy(m)) for m in t.RESPONSES]
    assert costs[2] > costs[7] >= len("xyz" * 100) // 4  # encrypted reasoning is forwarded: it costs


def test_responses_blocks_of_the_proxy_are_valid_input_items() -> None:
    d = RESPONSES
    assert d.summary_message("S") == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "S"}],
    }
    merged = d.prepend(t.RESPONSES[1], "RECALL")
    assert merged["content"] == [{"type": "input_text", "text": "RECALL"}, *t.RESPONSES[1]["content"]]
    assert merged["type"] == "message" and merged["role"] == "user"
    assert d.prepend(t.RESPONSES[-1], "RECALL") == {"role": "user", "content": "RECALL\n\nNow commit it."}


def test_a_plain_text_document_costs_what_its_text_does() -> None:
    """A ``document`` whose source is plain text (or inline content) reaches the model as text: it must cost
    what that text costs, not a base64 estimate a twentieth of it (the budget would let the window overflow)."""
    text = "The deploy runbook: rotate the key, restart the workers, check the dashboards. " * 200
    as_text = {"role": "user", "content": [{"type": "text", "text": text}]}
    sources = [
        {"type": "text", "media_type": "text/plain", "data": text},
        {"type": "content", "content": [{"type": "text", "text": text}]},
    ]
    for source in sources:
        document = {"role": "user", "content": [{"type": "document", "source": source}]}
        assert MESSAGES.count(document) >= MESSAGES.count(as_text) * 0.9, source["type"]


def test_append_puts_the_block_after_everything_the_message_holds() -> None:
    """``append`` (the auto-recall block in a round of tool calls) leaves the message's own content first and
    unchanged, in each format's own shape: the next request carries the message without the block."""
    assert CHAT.append({"role": "tool", "tool_call_id": "c", "content": "3 passed"}, "B") == {
        "role": "tool",
        "tool_call_id": "c",
        "content": "3 passed\n\nB",
    }
    assert CHAT.append(t.CHAT[7], "B")["content"] == [*t.CHAT[7]["content"], {"type": "text", "text": "B"}]
    assert CHAT.append({"role": "user", "content": ""}, "B") == {"role": "user", "content": "B"}
    # Messages: after the tool_result blocks (and after any block carrying the client's cache breakpoint).
    merged = MESSAGES.append(t.MESSAGES[2], "B")["content"]
    assert merged == [*t.MESSAGES[2]["content"], {"type": "text", "text": "B"}]
    assert MESSAGES.append(t.MESSAGES[4], "B")["content"][-2] == t.MESSAGES[4]["content"][-1]
    # Responses: a call's output gets it after its output string; a message after its parts.
    assert RESPONSES.append({"type": "function_call_output", "call_id": "call_1", "output": "3 passed"}, "B") == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "3 passed\n\nB",
    }
    assert RESPONSES.append(t.RESPONSES[1], "B")["content"] == [
        *t.RESPONSES[1]["content"],
        {"type": "input_text", "text": "B"},
    ]
