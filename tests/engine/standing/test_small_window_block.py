"""In a small window the standing-instructions block outranks summaries and recalled excerpts: no fixed quarter
that starves it, and a compact rendering (issue 29: in 400-600-token windows the block held 0-3 of 16 items
while summaries took the rest)."""

from __future__ import annotations

from typing import Any

from proxy import tokens
from proxy.engine.engine import Budget
from proxy.engine.standing.ledger import COMPACT_INTRO, INTRO
from proxy.store.location import Location
from tests.support.compaction import Scripted, open_context_engine
from tests.support.engine import assistant, run, user

RULES = [
    "Never push to main.",
    "The budget cap is $956 total.",
    "Answer in metric units.",
    "The project is called Heron.",
    "Always run the linter before a commit.",
    "Don't touch the billing module.",
    "The staging host is stg-eu-3.",
    "We decided to use PostgreSQL 16.",
]


def chat(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [user(f"Round {i}: we went through the sensor notes again, line by line."), assistant(f"Noted {i}.")]
    return out


def test_every_item_fits_a_600_token_window_in_the_compact_block(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        budget = Budget(window=600, output_reserve=100, tools=0)
        transcript = [m for rule in RULES for m in (user(rule), assistant("OK."))] + chat(30)
        prepared = await engine.prepare("t", transcript, budget, Scripted("ok"))
        first = str(prepared.messages[0]["content"])
        assert first.startswith('<standing_instructions source="lcm-proxy">')
        assert COMPACT_INTRO in first and INTRO not in first
        for rule in RULES:
            assert f"- {rule}" in first, rule
        forwarded = sum(tokens.count_text(str(m.get("content"))) for m in prepared.messages)
        assert forwarded <= 500 + 8 * len(prepared.messages)  # within the limit (a few tokens of framing each)
        await store.close()

    run(scenario())
