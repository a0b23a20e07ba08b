"""Cache-stable: what was sent stays sent (docs/architecture.md, "Prefix stability").

Between two requests with no compaction in between, the second repeats the first byte for byte and only
appends. The auto-recall block a request places in its last message (just before the user's words when they
are last, after the last tool result of a round) stays in that message on the following requests
(``proxy.engine.held``), until a compaction or eviction moves the cut; should the blocks held no longer fit
beside the growing tail, the newest give way first, so the request repeats the one before up to that block.
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
        compared = appended = held = 0
        for (summaries, first, before), (summaries2, first2, after) in itertools.pairwise(sent):
            if (summaries, first) != (summaries2, first2):
                continue  # a compaction was swapped in between: the one moment the prefix may change
            compared += 1
            if after[: len(before)] == before:  # byte for byte, the recall blocks included: it only appends
                appended += 1
                held += any("<recalled_history" in str(m.get("content")) for m in before[:-1])
                continue
            # Else the newest blocks held gave way: up to the first of them, byte for byte; from it on, the same
            # messages without their blocks.
            k = next(i for i, (a, b) in enumerate(zip(after, before, strict=False)) if a != b)
            assert "<recalled_history" in str(before[k].get("content"))
            assert [without_block(m) for m in after[k : len(before)]] == [without_block(m) for m in before[k:]]
        assert compared >= 20 and appended >= compared * 3 // 4 and held >= 8  # blocks kept, tool rounds included
        await store.close()

    run(scenario())


def test_a_retried_question_is_forwarded_as_before_with_one_block(where: Location) -> None:
    """The same request again (a retry, a regenerate): the block its question got is held, not placed twice."""

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        summarizer = Scripted("ok")
        transcript: list[dict[str, Any]] = []
        blocks = 0
        for i in range(30):
            transcript.append(turn(i))
            first = await engine.prepare("t", transcript, BUDGET, summarizer)
            again = await engine.prepare("t", transcript, BUDGET, summarizer)
            assert again.messages == first.messages
            last = str(first.messages[-1].get("content"))
            assert last.count("<recalled_history") <= 1
            blocks += last.count("<recalled_history")
            await engine.after_response(again, summarizer)
            await engine.wait_idle()
            transcript.append(assistant(f"Logged reading {i}."))
        assert blocks >= 1  # the retries covered a question that got a block
        await store.close()

    run(scenario())
