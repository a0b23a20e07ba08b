"""Stays in force (docs/context.md, "Standing instructions"): through the real engine, a rule and a limit set
early are forwarded after compaction without being asked for, in their latest version, and the stale value
comes back neither through the summaries nor through recall."""

from __future__ import annotations

from typing import Any

from proxy.engine.engine import Budget
from proxy.store.location import Location
from tests.support.compaction import Scripted, open_context_engine
from tests.support.engine import assistant, run, user

BUDGET = Budget(window=2000, output_reserve=300, tools=0)
FILLER = "We went through the sensor calibration notes for the east wing once more, line by line. " * 3


def chat(n: int, first: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    out = list(first or [])
    for i in range(n):
        out += [user(f"Round {i}: {FILLER}"), assistant(f"Noted round {i}.")]
    return out


def prefix_of(messages: list[dict[str, Any]]) -> str:
    """The text the proxy placed before the first raw message (instructions excluded)."""
    return str(messages[1]["content"]).split("</summary>")[0] if len(messages) > 1 else ""


def test_a_rule_and_an_updated_limit_stay_in_force_after_compaction(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        system = {"role": "system", "content": "You help run the east wing."}
        opening = [
            user("Two ground rules: never push to main. The budget cap is $800 for this quarter."),
            assistant("Understood."),
        ]
        transcript = [system, *chat(24, opening)]
        prepared = await engine.prepare("t", transcript, BUDGET, summarizer)
        assert prepared.sent is not None and prepared.sent.first_raw > 2  # the opening is no longer raw
        first = str(prepared.messages[1]["content"])
        assert first.startswith('<standing_instructions source="lcm-proxy">')  # right after the instructions
        assert "[rule] Two ground rules: never push to main." in first
        assert "The budget cap is $800 for this quarter." in first
        assert len(prepared.sent.ledger) == 2

        # The update, in other words, arrives: the old limit leaves the block at once; the new one is raw.
        transcript += [user("Quick update: keep spend under five hundred dollars from now on."), assistant("OK.")]
        transcript += chat(1)
        prepared = await engine.prepare("t", transcript, BUDGET, summarizer)
        text = "\n".join(str(m.get("content")) for m in prepared.messages)
        assert "five hundred dollars" in text and "never push to main" in text
        assert "$800" not in text  # not in the ledger, the summaries' verbatim facts, nor a recall excerpt

        # Many turns later the update itself is summarised: the ledger carries it, the rule stays.
        transcript += chat(24)
        prepared = await engine.prepare("t", transcript, BUDGET, summarizer)
        first = str(prepared.messages[1]["content"])
        assert "keep spend under five hundred dollars" in first and "never push to main" in first
        assert "$800" not in "\n".join(str(m.get("content")) for m in prepared.messages)
        await store.close()

    run(scenario())
