"""What one request's conversation may see: its own messages up to the request's point, and of each
conversation it was forked from only the shared prefix before the fork (and the summaries that cover nothing
else). Conversations that merely open alike become forks of one another, so an ancestor's later messages
belong to someone else: an app serving many end users through one key must not leak between them. Never
another scope's (a tenant, or an end user within it).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.store.base import Store
from proxy.store.records import SummaryRecord

UNBOUNDED = 2**62
MAX_ANCESTORS = 64  # a line of forks longer than this is cut: recall stops at the 64th conversation


@dataclass(frozen=True)
class Scope:
    """What one conversation may see. ``bounds`` pairs a conversation id with the number of its messages that
    are visible (messages ``[0, n)``): the current conversation first (bounded by the request's own length,
    so a request that re-sends an earlier point sees no more than it sent), then each ancestor, bounded by
    the point where the line of forks left it. A summary is visible when it covers only visible messages.
    ``owner`` is the scope (``proxy.scopes``: a tenant, or an end user within it) the conversations belong to;
    ``dialect`` the wire format their messages are stored in (a line of forks never changes format: a chain's
    root includes its dialect)."""

    owner: str
    bounds: tuple[tuple[str, int], ...]
    dialect: str = "chat"

    @property
    def conversation_ids(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.bounds)

    @property
    def current(self) -> tuple[str, int]:
        return self.bounds[0] if self.bounds else ("", 0)

    def sees_message(self, conversation_id: str, seq: int) -> bool:
        return any(c == conversation_id and seq < n for c, n in self.bounds)

    def sees_summary(self, summary: SummaryRecord) -> bool:
        return any(c == summary.conversation_id and summary.end_seq <= n for c, n in self.bounds)


async def resolve_scope(store: Store, owner: str, conversation_id: str, upto: int | None = None) -> Scope:
    """The scope of ``conversation_id`` as of its first ``upto`` messages (all of them by default)."""
    bounds: list[tuple[str, int]] = []
    dialect = "chat"
    limit = UNBOUNDED if upto is None else upto
    current: str | None = conversation_id
    while current is not None and all(current != c for c, _ in bounds) and len(bounds) < MAX_ANCESTORS and limit > 0:
        # Through deleted ancestors too: one kept for its live forks holds what they share with it.
        record = await store.read.conversation(owner, current, deleted=True)
        if record is None:
            break
        if not bounds:
            dialect = record.dialect
        bounds.append((record.id, limit))
        if record.parent_id is None or record.fork_seq is None:
            break
        # A continuation (``ConversationRecord.continued``) copied nothing: all it continues stays in scope.
        limit = record.fork_seq if record.continued else min(limit, record.fork_seq)
        current = record.parent_id
    return Scope(owner, tuple(bounds), dialect)
