"""Identity: which stored conversation a request's transcript continues, and how.

A transcript is identified by the chain hashes of its messages (``proxy.engine.canonical``). The rules
(``proxy.engine.ingest`` states them in full): the conversation named by the client's key, else the tenant's
conversation with the longest stored prefix; the request's ``Action`` on it follows from how much they share.
``locate_locked`` takes the same decision again inside the write transaction, under the locks that make it
final.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from proxy.dialects import Dialect
from proxy.engine.errors import ConversationBusy
from proxy.store.base import Reads, Writes
from proxy.store.records import ConversationRecord
from proxy.types import Messages

Action = Literal["none", "new", "append", "same", "earlier", "fork"]


@dataclass(frozen=True)
class Located:
    conversation: ConversationRecord | None
    common: int  # messages shared by the request and that conversation
    client_key: bool = False  # the request's key is one the client chose (it follows forks), not an id we issued

    def action(self, request_count: int) -> Action:
        if self.conversation is None:
            return "new"
        stored = self.conversation.message_count
        if self.common == stored:
            return "append" if request_count > stored else "same"
        if self.common == request_count:
            return "earlier"
        return "fork"


def new_conversation_id() -> str:
    return "conv_" + secrets.token_hex(8)


async def _binary_search(count: int, present: Callable[[int], Awaitable[bool]]) -> int:
    """Largest k such that present(i) holds for every i < k; ``present`` must be prefix-closed.

    Galloping from the end: a client re-sends what is stored plus a few new messages, so the answer is
    nearly always within a few messages of ``count``. Probing ``count - 1``, ``count - 2``, ``count - 4``, ...
    finds it in O(log(count - k)) lookups: one for a re-send, three or four for a continuation, however long
    the conversation (a transcript with nothing stored costs about what a plain binary search does)."""
    low, high, step = 0, count, 1
    while high - step >= low:
        probe = high - step  # high: the smallest index known not to be present (or count)
        if await present(probe):
            low = probe + 1
            break
        high = probe
        step *= 2
    while low < high:
        middle = (low + high + 1) // 2
        if await present(middle - 1):
            low = middle
        else:
            high = middle - 1
    return low


async def locate(q: Reads, scope: str, chains: list[str], conversation_key: str | None) -> Located:
    if conversation_key is not None:
        conversation = await q.conversation_by_key(scope, conversation_key)
        if conversation is None:
            return Located(None, 0, client_key=True)
        client_key = conversation.external_key == conversation_key
        limit = min(len(chains), conversation.message_count)
        common = await _binary_search(limit, lambda i: q.chain_in_conversation(conversation.id, i, chains[i]))
        located = Located(conversation, common, client_key)
        if client_key or located.action(len(chains)) != "fork":
            return located
        # An id the proxy issued names that conversation for good. A client that keeps sending it with a
        # transcript that went elsewhere continues the fork its first such request made, not a new fork per
        # request: the longest prefix among the conversation's descendants, if longer.
        family = await q.descendants(scope, conversation.id)
        if not family:
            return located
        deeper = await _longest_prefix(q, scope, chains, family)
        return deeper if deeper.conversation is not None and deeper.common > common else located
    return await _longest_prefix(q, scope, chains, None)


async def locate_locked(
    tx: Writes, scope: str, chains: list[str], conversation_key: str | None, expected: str | None = None
) -> Located:
    """``locate`` inside a write transaction, holding the locks that make its answer final until the commit:
    the identity locks (the client's key, the first message's chain: every conversation this transcript could
    continue starts with it) so that concurrent first requests create one conversation, then the lock of the
    conversation found, re-reading once it is held (another replica may have written it meanwhile). The
    conversation an earlier read ``expected`` is locked first, so that in the common case one read suffices."""
    for identity in sorted({k for k in (conversation_key, chains[0] if chains else None) if k is not None}):
        await tx.lock_identity(scope, identity)
    held: set[str] = set()
    if expected is not None and await tx.lock_conversation(expected):
        held.add(expected)
    while True:
        located = await locate(tx.locked_reads, scope, chains, conversation_key)
        found = located.conversation
        if found is None or found.id in held:
            return located
        if len(held) >= 4:
            raise ConversationBusy("Other requests kept moving this conversation while this one was stored; retry.")
        held.add(found.id)
        if not await tx.lock_conversation(found.id):
            return located  # this store's writers are serialised: nothing can have changed


async def _longest_prefix(q: Reads, scope: str, chains: list[str], among: list[str] | None) -> Located:
    """The conversation (of ``among``, or of the whole tenant) sharing the longest prefix with ``chains``."""

    async def present(i: int) -> bool:
        return await q.chain_exists(chains[i]) if among is None else await q.chain_in_any(among, chains[i])

    common = await _binary_search(len(chains), present)
    if common == 0:
        return Located(None, 0)
    candidates = await q.conversations_with_chain(scope, chains[common - 1])
    if among is not None:
        candidates = [c for c in candidates if c.id in among]
    if not candidates:  # the hash belongs to another tenant's chain: cannot happen, chains are tenant-seeded
        return Located(None, 0)
    best = max(candidates, key=lambda c: (c.message_count == common, c.updated_at))
    return Located(best, common)


# The roles of what a model answers: a message, and in the Responses format a call or a reasoning item.
ANSWER_ROLES = ("assistant", "tool_call", "reasoning")


async def replaces_relayed_answer(q: Reads, located: Located, transcript: Messages, dialect: Dialect) -> bool:
    """Whether the request differs from its conversation only in the answer the proxy relayed and stored last
    (``proxy.engine.answers``): the client's version then replaces it."""
    conversation, common = located.conversation, located.common
    if conversation is None or common != conversation.message_count - 1 or common >= len(transcript):
        return False
    if dialect.role(transcript[common]) not in ANSWER_ROLES:
        return False
    return await q.replaceable_answer(conversation.id) == common
