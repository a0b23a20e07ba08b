"""Assembly: which of a conversation's summaries and raw messages one request forwards, within its limit.

The stored view is ``summaries + raw messages [upto, count)``. When it fits, it is forwarded as it is (and it
changes only by appending between compactions: prompt caches depend on that). When it does not, material
leaves the *forwarded* view (never the store), oldest first, in this order:

1. raw messages before the newest user message, a whole exchange at a time (a tool call with all its
   results), so the tail shrinks before anything fails;
2. summaries, oldest first (compaction condenses them to fit their room before it comes to this).

The newest user message and everything after it are never dropped (``required_start``; in an agent's long
run of tool rounds, only the newest exchange), and when even that exceeds the limit the request is refused
(``TooLarge``). What was dropped is reported, and auto-recall can bring it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.engine.render import summary_tokens
from proxy.store.records import SummaryRecord
from proxy.types import Message, Messages


@dataclass(frozen=True)
class Assembly:
    summaries: list[SummaryRecord]  # forwarded, oldest first
    evicted: list[str]  # ids of summaries of the view that did not fit
    first_raw: int  # first raw seq forwarded; [upto, first_raw) did not fit
    upto: int  # first raw seq after the summaries
    tokens: int  # summaries (as one message) + raw messages


class TooLarge(Exception):
    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


def newest_exchange(roles: Sequence[str], offset: int, count: int) -> int:
    """Seq of the newest exchange: the last message, moved back over tool results to their assistant call."""
    seq = count - 1
    while seq > offset and roles[seq - offset] in ("tool", "function"):
        seq -= 1
    return max(offset, seq)


def required_start(roles: Sequence[str], costs: Sequence[int], offset: int, count: int, limit: int) -> int:
    """First seq that must be forwarded raw (``roles``/``costs`` cover ``[offset, count)``): the newest user
    message and what follows it, when that fits ``limit``; otherwise (an agent's long run of tool rounds after
    one instruction, or a transcript with no user message) only the newest exchange, so that the older
    rounds, the instruction with them, can be summarised instead of refused."""
    newest = count - 1
    while newest > offset and roles[newest - offset] != "user":
        newest -= 1
    if newest >= offset and roles[newest - offset] == "user" and sum(costs[newest - offset :]) <= limit:
        return newest
    return newest_exchange(roles, offset, count)


def fit(
    summaries: Sequence[SummaryRecord], upto: int, roles: Sequence[str], costs: Sequence[int], limit: int
) -> Assembly:
    """Fit ``summaries`` + raw messages ``[upto, upto + len(costs))`` into ``limit`` tokens."""
    count = upto + len(costs)
    required = required_start(roles, costs, upto, count, limit) if costs else count
    raw = sum(costs)
    if sum(costs[required - upto :]) > limit:
        raise TooLarge(sum(costs[required - upto :]))
    kept = list(summaries)
    total = summary_tokens(kept) + raw
    first = upto
    while total > limit and first < required:
        end = first + 1
        while end < required and roles[end - upto] in ("tool", "function"):
            end += 1  # the results of a call leave with it
        total -= sum(costs[first - upto : end - upto])
        first = end
    evicted: list[str] = []
    while total > limit and kept:
        evicted.append(kept.pop(0).id)
        total = summary_tokens(kept) + sum(costs[first - upto :])
    return Assembly(kept, evicted, first, upto, total)


def prepend_text(message: Message, text: str) -> Message:
    """``message`` with ``text`` (a summary or recall block) before its content, as one message, so that the
    assembled context never has two user messages in a row."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": text}, *content]}
    if isinstance(content, str) and content:
        return {**message, "content": f"{text}\n\n{content}"}
    return {**message, "content": text}


def join(instructions: Messages, summaries_message: Message | None, raw: Messages) -> Messages:
    """``instructions + summaries + raw``, the summaries merged into the first raw message when that is a
    user message (strict user/assistant alternation)."""
    if summaries_message is None:
        return [*instructions, *raw]
    if raw and raw[0].get("role") == "user":
        return [*instructions, prepend_text(raw[0], str(summaries_message["content"])), *raw[1:]]
    return [*instructions, summaries_message, *raw]
