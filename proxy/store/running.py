"""Running sums of a conversation's token counts, stored on each message row: what both stores share of them.

Each message row carries, in ``cum_tokens``, ``cum_sent_tokens`` and ``cum_compact_tokens``, the sums of
``token_count``, ``sent_token_count`` and ``coalesce(compact_token_count, token_count)`` over its conversation's
messages ``[0, seq]``. The cost of any range ``[a, b)`` is then the difference of two rows, whatever the length
of the conversation: a request on a long conversation reads a few rows instead of one per message.

They cannot go stale: a conversation's messages are only ever appended or cut off at the end (a retry's answer
replaced, a deletion keeping a fork's prefix), and a fork copies its parent's prefix rows, sums included, which
are the fork's own sums as well. A row without them (written by an older replica during a rolling upgrade)
makes the readers fall back to adding the rows up, and the next append computes its base that way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from proxy.store.records import NewMessage

Running = tuple[int, int, int]  # tokens, sent tokens, compact tokens: sums over [0, seq]
ZERO: Running = (0, 0, 0)
COLUMNS = "cum_tokens, cum_sent_tokens, cum_compact_tokens"


def extend(base: Running, messages: Sequence[NewMessage]) -> list[Running]:
    """The running sums of ``messages`` appended after a prefix whose sums are ``base``."""
    tokens, sent, compact = base
    out: list[Running] = []
    for m in messages:
        tokens += m.token_count
        sent += m.sent_token_count
        compact += m.compact_token_count if m.compact_token_count is not None else m.token_count
        out.append((tokens, sent, compact))
    return out


def raw_points(start: int, end: int, stubbed_upto: int) -> tuple[int, int, int]:
    """The seqs whose sums ``raw_sum`` needs (-1: before the first message, where every sum is zero)."""
    middle = min(max(stubbed_upto, start), end)
    return start - 1, middle - 1, end - 1


def found(rows: Iterable[Sequence[Any]], seqs: Iterable[int]) -> dict[int, Running] | None:
    """The sums of ``seqs`` from ``(seq, tokens, sent, compact)`` rows; None when one is missing or unknown."""
    out: dict[int, Running] = {-1: ZERO}
    for seq, tokens, sent, compact in rows:
        if not isinstance(tokens, int) or not isinstance(sent, int) or not isinstance(compact, int):
            return None
        out[int(seq)] = (tokens, sent, compact)
    return out if all(s in out for s in seqs) else None


def raw_sum(sums: dict[int, Running], start: int, end: int, stubbed_upto: int) -> int:
    """Tokens of messages ``[start, end)`` as assembled: the compact form before ``stubbed_upto``."""
    if end <= start:
        return 0
    before, middle, last = raw_points(start, end, stubbed_upto)
    return (sums[middle][2] - sums[before][2]) + (sums[last][0] - sums[middle][0])
