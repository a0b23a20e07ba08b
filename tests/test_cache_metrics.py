"""The prompt-cache metrics and billing of ``python -m bench compaction`` (tests/support/cache.py) and its
Claude Code-like client baseline (tests/support/client_compaction.py), on hand-computed cases.

Token counts below are o200k's: a message is serialised as ``role\\ncontent\\n\\n``, so ``user\\nhello hello``
is ``user``, ``\\n``, ``hello``, `` hello``, ``\\n\\n``: the role line costs 2 tokens, each word 1, the
separator 1."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cache import CacheUse, anthropic_billed, common_prefix, openai_billed, serialise, size
from tests.support.client_compaction import claude_code_requests, summary_message, threshold


def words(n: int, word: str = "hello") -> str:
    return " ".join([word] * n)


def body(*messages: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content} for role, content in messages]}


def test_a_message_costs_its_role_line_its_words_and_the_separator() -> None:
    assert size(serialise(body(("system", "s"), ("user", words(3))))) == 4 + 6


def test_identical_requests_share_everything_and_extend_each_other() -> None:
    request = serialise(body(("system", "s"), ("user", words(10))))
    assert common_prefix(request, request) == 4 + 13
    use = CacheUse.of([request, request])
    assert use.extending_share == 1.0
    assert use.repeated_share == 0.5  # the first request repeats nothing


def test_a_request_diverging_at_a_message_shares_the_tokens_before_it() -> None:
    before = (("system", "s"), ("user", words(10)))
    a = serialise(body(*before, ("user", words(5))))
    b = serialise(body(*before, ("assistant", words(5)), ("user", "go")))
    assert common_prefix(a, b) == 4 + 13  # the role differs at the first token of message 3
    use = CacheUse.of([a, b])
    assert use.extending == 0
    assert use.shared == (0, 17)


def test_a_request_diverging_inside_a_message_shares_its_common_tokens() -> None:
    a = serialise(body(("system", "s"), ("user", words(4) + " world")))
    b = serialise(body(("system", "s"), ("user", words(4) + " there"), ("assistant", "x")))
    assert common_prefix(a, b) == 4 + 2 + 4


def test_a_request_that_appends_extends_the_previous() -> None:
    a = serialise(body(("system", "s"), ("user", words(3))))
    b = serialise(body(("system", "s"), ("user", words(3)), ("assistant", "x")))
    c = serialise(body(("system", "s"), ("user", words(3)), ("assistant", "y")))
    use = CacheUse.of([a, b, c])
    assert use.shared == (0, 10, 12)  # c shares b's first two messages and the role line of the third
    assert use.extending == 1
    assert use.extending_share == 0.5
    assert use.repeated_share == 22 / (10 + 14 + 14)


@pytest.mark.parametrize(
    ("tokens", "shared", "billed"),
    [
        (2000, 1500, 0.1 * 1500 + 1.25 * 500),
        (2000, 1024, 0.1 * 1024 + 1.25 * 976),
        (2000, 1023, 1.25 * 2000),  # a shared prefix under 1,024 tokens is not read from the cache
        (2000, 0, 2500.0),
        (1023, 1000, 1023.0),  # a request under 1,024 tokens is not cached at all: no write premium
    ],
)
def test_anthropic_reads_a_shared_prefix_of_1024_tokens_or_more_and_writes_the_rest(
    tokens: int, shared: int, billed: float
) -> None:
    assert anthropic_billed(tokens, shared) == pytest.approx(billed)


@pytest.mark.parametrize(
    ("tokens", "shared", "billed"),
    [
        (2000, 1500, 0.1 * 1408 + 592),  # 1,500 rounded down to a multiple of 128
        (2000, 1151, 0.1 * 1024 + 976),
        (2000, 1152, 0.1 * 1152 + 848),
        (2000, 1000, 2000.0),  # under 1,024 shared: nothing cached
        (1000, 1000, 1000.0),  # a prompt under 1,024 tokens is never cached
    ],
)
def test_openai_caches_the_shared_prefix_in_steps_of_128_tokens(tokens: int, shared: int, billed: float) -> None:
    assert openai_billed(tokens, shared) == pytest.approx(billed)


def test_a_sequence_is_billed_request_by_request_the_first_uncached() -> None:
    use = CacheUse(sizes=(1200, 1400), shared=(0, 1200))
    assert use.anthropic() == pytest.approx(1.25 * 1200 + 0.1 * 1200 + 1.25 * 200)
    assert use.openai() == pytest.approx(1200 + 0.1 * 1152 + 248)


def test_the_claude_code_threshold_keeps_its_share_of_the_window() -> None:
    # 200,000 - 20,000 output - 13,000 buffer = 167,000 of 180,000; the same share of 8,000 - 400.
    assert threshold(8000, 400) == 7051
    assert threshold(200_000, 20_000) == 167_000


def test_the_claude_code_client_compacts_when_it_crosses_its_threshold_and_not_before() -> None:
    # The system message costs 4 tokens, each user message 303: 9 messages make 2,731, 10 make 3,034.
    transcript = [{"role": "system", "content": "s"}, *({"role": "user", "content": words(300)} for _ in range(11))]
    sent = list(claude_code_requests(transcript, list(range(2, 13)), None, 2800))
    assert [s.summary for s in sent] == [False] * 9 + [True, False, False]
    assert sent[9].body["messages"][:-1] == transcript[:11]  # everything, then the instruction
    assert str(sent[9].body["messages"][-1]["content"]).startswith("CRITICAL: Respond with TEXT ONLY.")
    assert sent[10].body["messages"] == [transcript[0], summary_message(1), transcript[10]]
    assert sent[11].body["messages"] == [transcript[0], summary_message(1), transcript[10], transcript[11]]


def test_after_a_compaction_the_client_keeps_only_the_newest_tool_rounds_that_fit() -> None:
    # One turn: the instruction (4 tokens), then 10 rounds of 103 tokens: 1,042 with the system message.
    # After the compaction the system message and the summary (of about 630 tokens) leave room for 3 rounds.
    names = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    rounds = [{"role": "assistant", "content": f"{words(99)} {name}"} for name in names]
    assert size(serialise({"messages": rounds})) == 10 * 103
    transcript = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}, *rounds]
    sent = list(claude_code_requests(transcript, [12], None, 1000))
    assert [s.summary for s in sent] == [True, False]
    assert sent[1].body["messages"] == [transcript[0], summary_message(1), *rounds[-3:]]
