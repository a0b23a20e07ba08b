"""The engine's cuts (what leaves the forwarded view, where the fresh tail starts) fall only where the
dialect allows: never between a tool call and its results, nor between a Responses reasoning item and the
call or message it produced. Each case is one where cutting at message granularity would split a pair."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from proxy.config.lcm import LcmSettings
from proxy.dialects import CHAT, MESSAGES, RESPONSES, Dialect, cut_allowed, split_instructions
from proxy.engine import budget
from proxy.engine.assemble import TooLarge, fit, newest_exchange, required_start
from proxy.engine.compaction import tail_start
from tests.support import wire_formats as t

CASES = [(CHAT, t.CHAT), (MESSAGES, t.MESSAGES), (RESPONSES, t.RESPONSES)]


def stored(dialect: Dialect, messages: list[dict]) -> tuple[list[str], list[int]]:
    """(roles, costs) of the transcript as the store keeps them (instructions are not stored)."""
    _, transcript = split_instructions(dialect, messages)
    return [dialect.role(m) for m in transcript], [dialect.count(m) for m in transcript]


def naive_first(costs: list[int], limit: int) -> int:
    """Where dropping the oldest messages one at a time would start the forwarded view."""
    first = 0
    while sum(costs[first:]) > limit:
        first += 1
    return first


@pytest.mark.parametrize(("dialect", "messages"), CASES, ids=lambda v: getattr(v, "name", ""))
def test_eviction_drops_whole_exchanges(dialect: Dialect, messages: list[dict]) -> None:
    roles, costs = stored(dialect, messages)
    split_somewhere = False
    for limit in range(1, sum(costs) + 1):
        try:
            assembly = fit(dialect, [], 0, roles, costs, limit)
        except TooLarge:
            continue
        assert cut_allowed(dialect, roles, assembly.first_raw), (limit, assembly.first_raw, roles)
        assert assembly.tokens == sum(costs[assembly.first_raw :]) <= limit
        split_somewhere |= not cut_allowed(dialect, roles, naive_first(costs, limit))
    assert split_somewhere  # the transcript has limits where a per-message cut would split a pair


@pytest.mark.parametrize(("dialect", "messages"), CASES, ids=lambda v: getattr(v, "name", ""))
def test_the_newest_exchange_starts_where_a_cut_may_fall(dialect: Dialect, messages: list[dict]) -> None:
    roles, costs = stored(dialect, messages)
    for count in range(1, len(roles) + 1):
        start = newest_exchange(dialect, roles[:count], 0, count)
        assert cut_allowed(dialect, roles[:count], start)
        # The nearest such place: every message after it continues the one before it.
        assert all(not cut_allowed(dialect, roles[:count], j) for j in range(start + 1, count))
    # Over a budget too small for the newest user turn, the newest exchange is what must be forwarded.
    assert cut_allowed(dialect, roles, required_start(dialect, roles, costs, 0, len(roles), 1))


def test_a_responses_call_never_leaves_its_reasoning_item_behind() -> None:
    roles, costs = stored(RESPONSES, t.RESPONSES)
    # Ending the transcript after the second output: the newest exchange reaches back to the reasoning item.
    assert roles[1:6] == ["reasoning", "tool_call", "tool_call", "tool", "tool"]
    assert newest_exchange(RESPONSES, roles[:6], 0, 6) == 1
    limit = sum(costs[2:])  # room for everything after the reasoning item, not for it
    assert fit(RESPONSES, [], 0, roles, costs, limit).first_raw not in (2, 3, 4, 5)


def test_a_messages_tool_result_never_opens_the_view() -> None:
    roles, costs = stored(MESSAGES, t.MESSAGES)
    limit = sum(costs[2:])  # a per-message cut would start at the tool results, orphaning them
    assert naive_first(costs, limit) == 2
    assert fit(MESSAGES, [], 0, roles, costs, limit).first_raw == 3


@pytest.mark.parametrize(("dialect", "messages"), CASES, ids=lambda v: getattr(v, "name", ""))
def test_the_fresh_tail_starts_where_a_cut_may_fall(dialect: Dialect, messages: list[dict]) -> None:
    roles, costs = stored(dialect, messages)
    base = budget.sizes(LcmSettings(), 100_000)
    for tail_count in range(1, len(roles) + 1):
        for tail_tokens in (1, costs[-1], sum(costs) // 2, sum(costs)):
            sizes = dataclasses.replace(base, tail_count=tail_count, tail_tokens=tail_tokens)
            start = tail_start(dialect, roles, costs, 0, len(roles), sizes)
            assert cut_allowed(dialect, roles, start), (tail_count, tail_tokens, start)


def test_chat_cuts_where_the_engine_always_cut() -> None:
    """Before dialects the engine kept ``tool`` and ``function`` messages with the message before them,
    whatever that was; the chat dialect's cuts are exactly those. Of them, the first that leaves out a whole
    number of quarters of the limit, at least what must go."""
    roles = ["user", "assistant", "tool", "function", "user", "assistant", "tool", "assistant", "user", "function"]
    costs = [5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    assert [cut_allowed(CHAT, roles, i) for i in range(len(roles))] == [r not in ("tool", "function") for r in roles]
    for limit in range(1, sum(costs) + 1):
        required = 8  # the newest user message; what follows it always fits these limits or nothing does
        if sum(costs[required:]) > limit:
            continue
        step = max(1, limit // 4)
        must = max(0, sum(costs) - limit)  # tokens that must leave
        quarters = -(-must // step) * step
        first = 0
        while first < required and sum(costs[:first]) < quarters:
            first += 1
            while first < required and roles[first] in ("tool", "function"):
                first += 1
        assert fit(CHAT, [], 0, roles, costs, limit).first_raw == first, limit


@pytest.mark.parametrize("limit", [300, 1000, 2000])
def test_a_growing_conversation_moves_its_cut_once_a_quarter_of_the_limit(limit: int) -> None:
    """Turn after turn an exchange is appended; the forwarded view starts at the same message until it has
    grown by a quarter of the limit, so a cache (a llama.cpp slot, a provider's prefix cache) keeps it."""
    roles: list[str] = []
    costs: list[int] = []
    cuts = []
    for turn in range(200):
        roles += ["user", "assistant"]
        costs += [40 + turn % 7 * 9, 60 + turn % 5 * 11]
        assembly = fit(CHAT, [], 0, roles, costs, limit)
        assert assembly.tokens <= limit
        assert assembly.tokens > limit * 3 // 4 - max(costs) * 2 or assembly.first_raw == 0  # not emptied
        cuts.append(assembly.first_raw)
    grown = sum(costs) - limit
    moves = sum(1 for a, b in itertools.pairwise(cuts) if a != b)
    assert moves <= grown // (limit // 4) + 1
    assert cuts == sorted(cuts)  # the cut only moves forward


def test_a_responses_turn_stays_whole_from_its_reasoning_to_its_outputs() -> None:
    """GPT-5 writes reasoning, more reasoning, a preamble message, then its calls: a cut anywhere inside that
    turn would replay a call without its reasoning item, which the API refuses."""
    turn = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the build."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAB"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running make."}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "local_shell_call", "call_id": "c2", "action": {"type": "exec", "command": ["ls"]}},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "local_shell_call_output", "call_id": "c2", "output": "a.py"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]},
    ]
    roles = [RESPONSES.role(m) for m in turn]
    allowed = [i for i in range(len(turn) + 1) if cut_allowed(RESPONSES, roles, i)]
    assert allowed == [0, 1, 8, 9]
