"""Cache-stable: what was sent stays sent (docs/architecture.md, "Prefix stability").

Between two requests with no compaction in between, the second repeats the first byte for byte, except for
the auto-recall block, which only ever sits in a request's last message (just before the user's words when
they are last, after the last tool result of a round): the next request carries that message without it.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from proxy.engine.engine import Budget
from proxy.store.location import Location
from tests.support.compaction import Scripted, open_context_engine
from tests.support.engine import assistant, run, user

LEADING_BLOCK = re.compile(r"\A<recalled_history [^>]*>\n.*?\n</recalled_history>\n\n", re.S)
TRAILING_BLOCK = re.compile(r"\n\n<recalled_history [^>]*>\n.*\n</recalled_history>\Z", re.S)
BUDGET = Budget(window=3000, output_reserve=300, tools=0)


def turn(i: int) -> dict[str, Any]:
    # Every user message names a pump and a pressure that come back later: auto-recall has matches to place.
    filler = "The readings go into the weekly report with the other halls. " * 4
    return user(f"Turn {i}: pump P-{i % 7} in hall {i % 5} reads {40 + i % 9} psi; log it next to the others. {filler}")


def without_block(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str):
        return message
    return {**message, "content": TRAILING_BLOCK.sub("", LEADING_BLOCK.sub("", content, count=1))}


def tool_round(i: int) -> list[dict[str, Any]]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_log", "arguments": f'{{"day": {i}}}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"log of day {i}: nothing unusual"},
    ]


def test_consecutive_requests_repeat_each_other_up_to_the_recall_block(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript: list[dict[str, Any]] = []
        sent: list[tuple[tuple[str, ...], int, list[dict[str, Any]]]] = []
        for i in range(40):
            transcript.append(turn(i))
            rounds = [tool_round(i)] if i % 4 == 1 else []
            for extra in [*rounds, [assistant(f"Logged reading {i}.")]]:
                prepared = await engine.prepare("t", transcript, BUDGET, summarizer)
                assert prepared.sent is not None
                sent.append((prepared.sent.summaries, prepared.sent.first_raw, prepared.messages))
                await engine.after_response(prepared, summarizer)
                await engine.wait_idle()
                transcript += extra
        compared = with_block = 0
        for (summaries, first, before), (summaries2, first2, after) in itertools.pairwise(sent):
            for message in before[:-1]:
                assert "<recalled_history" not in str(message.get("content"))  # only ever in the last message
            with_block += "<recalled_history" in str(before[-1].get("content"))
            if (summaries, first) != (summaries2, first2):
                continue  # a compaction was swapped in between: the one moment the prefix may change
            compared += 1
            assert after[: len(before) - 1] == before[:-1]
            assert after[len(before) - 1] == without_block(before[-1])
        assert compared >= 20 and with_block >= 10  # the comparison covered recall blocks, tool rounds included
        await store.close()

    run(scenario())
