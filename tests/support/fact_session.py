"""The 150-turn chat of issue 32, for the prompt-cache measurement: an 8,000-token window, ``fresh_tail_count``
8 and ``leaf_chunk_tokens`` 2,000; ~200-token user turns, each stating one new fact; every 10th turn asks for
tools and gets two parallel ~500-token results; every 5th turn is streamed."""

from __future__ import annotations

from typing import Any

from tests.support.sim import SIM_LCM

TURNS = 150
LCM = {**SIM_LCM, "fresh_tail_count": 8, "leaf_chunk_tokens": 2000}
SUBJECTS = ["the staging database", "the billing service", "the mobile app", "the nightly build", "the data export",
            "the search index", "the login page", "the audit job"]  # fmt: skip
PROPERTIES = ["owner", "port", "deadline", "budget code", "ticket", "region", "retry limit", "version"]


def fact(turn: int) -> str:
    subject = SUBJECTS[turn % len(SUBJECTS)]
    prop = PROPERTIES[turn * 3 % len(PROPERTIES)]
    return f"For {subject}, the {prop} is now K{turn * 7919 % 100000:05d}."


def user_turn(turn: int) -> dict[str, Any]:
    """About 200 tokens: one new fact, then ordinary talk about the work."""
    filler = (
        "I went through the notes from this morning's meeting and there is a lot to follow up on. "
        "The team agreed that we should keep the change small, test it on a copy first, and write down what we "
        "learn so the next person does not repeat our mistakes. Some of the older scripts still assume the "
        "previous layout, so we need to check them one by one before the release on Friday. "
    )
    ask = "Please use tools to look this up." if turn % 10 == 9 else "What should I do next?"
    return {"role": "user", "content": f"Turn {turn}. {fact(turn)} {filler * 2}{ask}"}


def streamed(turn: int) -> bool:
    return turn % 5 == 4


def tool_result(call: dict[str, Any], turn: int, n: int) -> dict[str, Any]:
    """About 500 tokens of output."""
    lines = "".join(f"row {i}: item {turn}-{n}-{i} status ok, checked at step {i * 7 % 13}\n" for i in range(28))
    return {"role": "tool", "tool_call_id": call["id"], "content": lines}
