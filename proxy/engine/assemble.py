"""Assembly: which of a conversation's summaries and raw messages one request forwards, within its limit.

The stored view is ``summaries + raw messages [upto, count)``. When it fits, it is forwarded as it is (and it
changes only by appending between compactions: prompt caches depend on that). When it does not, material
leaves the *forwarded* view (never the store), oldest first, in this order:

1. raw messages before the newest user message, a whole exchange at a time (a tool call with all its
   results: no cut falls where the dialect says a message continues the one before it), so the tail
   shrinks before anything fails; a quarter of the limit at a time (``EVICTION_STEPS``), so the cut stays
   where it is while the next few turns are appended;
2. summaries, oldest first (compaction condenses them to fit their room before it comes to this).

The newest user message and everything after it are never dropped (``required_start``; in an agent's long
run of tool rounds, only the newest exchange), and when even that exceeds the limit the request is refused
(``TooLarge``). What was dropped is reported, and auto-recall can bring it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.dialects import Dialect
from proxy.engine.render import summary_tokens
from proxy.store.records import SummaryRecord
from proxy.types import Messages


@dataclass(frozen=True)
class Assembly:
    summaries: list[SummaryRecord]  # forwarded, oldest first
    evicted: list[str]  # ids of summaries of the view that did not fit
    first_raw: int  # first raw seq forwarded; [upto, first_raw) did not fit
    upto: int  # first raw seq after the summaries
    tokens: int  # summaries (as one message) + raw messages


# When raw messages must leave the view, they leave a quarter of the limit at a time: the cut falls at the first
# whole exchange past a multiple of the step, so the following turns, each adding an exchange at the end, find
# the same cut and forward the same prefix (a local server's slot, a provider's cache) until the view has grown
# by a step, instead of moving the cut, and with it every token after it, on every turn.
EVICTION_STEPS = 4


class TooLarge(Exception):
    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


def exchange_start(dialect: Dialect, roles: Sequence[str], offset: int, seq: int) -> int:
    """``seq`` moved back to where its exchange starts (tool results to their call, a call to its reasoning):
    the nearest seq at or before it where a cut may fall. ``roles`` cover seqs from ``offset``."""
    while seq > offset and dialect.continues(roles[seq - offset - 1], roles[seq - offset]):
        seq -= 1
    return seq


def newest_exchange(dialect: Dialect, roles: Sequence[str], offset: int, count: int) -> int:
    """Seq of the newest exchange: the last message, moved back over tool results to their assistant call."""
    return max(offset, exchange_start(dialect, roles, offset, count - 1))


def required_start(
    dialect: Dialect, roles: Sequence[str], costs: Sequence[int], offset: int, count: int, limit: int
) -> int:
    """First seq that must be forwarded raw (``roles``/``costs`` cover ``[offset, count)``): the newest user
    message and what follows it, when that fits ``limit``; otherwise (an agent's long run of tool rounds after
    one instruction, or a transcript with no user message) only the newest exchange, so that the older
    rounds, the instruction with them, can be summarised instead of refused."""
    newest = count - 1
    while newest > offset and not dialect.user_turn(roles[newest - offset]):
        newest -= 1
    if newest >= offset and dialect.user_turn(roles[newest - offset]) and sum(costs[newest - offset :]) <= limit:
        return newest
    return newest_exchange(dialect, roles, offset, count)


def fit(
    dialect: Dialect,
    summaries: Sequence[SummaryRecord],
    upto: int,
    roles: Sequence[str],
    costs: Sequence[int],
    limit: int,
) -> Assembly:
    """Fit ``summaries`` + raw messages ``[upto, upto + len(costs))`` into ``limit`` tokens."""
    count = upto + len(costs)
    required = required_start(dialect, roles, costs, upto, count, limit) if costs else count
    raw = sum(costs)
    if sum(costs[required - upto :]) > limit:
        raise TooLarge(sum(costs[required - upto :]))
    kept = list(summaries)
    total = summary_tokens(kept, dialect) + raw
    first = upto
    step = max(1, limit // EVICTION_STEPS)
    gone = target = 0  # tokens of raw messages left out, and to leave out: a whole number of steps
    while first < required and (total > limit or gone < target):
        if total > limit:
            target = -(-(gone + total - limit) // step) * step
        end = first + 1
        while end < required and dialect.continues(roles[end - upto - 1], roles[end - upto]):
            end += 1  # the results of a call leave with it
        cost = sum(costs[first - upto : end - upto])
        total -= cost
        gone += cost
        first = end
    evicted: list[str] = []
    while total > limit and kept:
        evicted.append(kept.pop(0).id)
        total = summary_tokens(kept, dialect) + sum(costs[first - upto :])
    return Assembly(kept, evicted, first, upto, total)


def join(dialect: Dialect, instructions: Messages, summaries: str | None, raw: Messages) -> Messages:
    """``instructions + summaries + raw``, the summaries merged into the first raw message when that is a
    user message (strict user/assistant alternation)."""
    if summaries is None:
        return [*instructions, *raw]
    if raw and dialect.user_turn(dialect.role(raw[0])):
        return [*instructions, dialect.prepend(raw[0], summaries), *raw[1:]]
    return [*instructions, dialect.summary_message(summaries), *raw]
