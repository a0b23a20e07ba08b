"""A compacted request's context, composed (``ContextEngine.finish`` past the zero-cost case):
``instructions + ledger + summaries + raw messages`` within the request's limit (``proxy.engine.assemble``
fits them; whatever does not fit leaves the view oldest first), the ledger of standing instructions right after
the instructions, stored stubs applied, the recall blocks earlier requests forwarded kept in their messages
(``proxy.engine.held``) and auto-recall's new block for the newest user message (``proxy.engine.auto_recall``).
What was forwarded is recorded when its composition changes, for the admin views.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from proxy import tokens
from proxy.config.lcm import LcmSettings
from proxy.dialects import Dialect
from proxy.engine import auto_recall, budget, held
from proxy.engine.assemble import TooLarge, fit, join
from proxy.engine.budget import Sizes
from proxy.engine.ingest import IngestResult
from proxy.engine.intercept import apply_patches
from proxy.engine.prepared import Compaction, Prepared, Sent, View
from proxy.engine.render import summaries_text
from proxy.engine.standing import Standing
from proxy.store.base import Store
from proxy.store.records import ConversationRecord
from proxy.types import Message, Messages

log = logging.getLogger("lcm_proxy.engine")
MASK_OFF_LOOP_CHARS = 32_000  # summary text beyond which stale values are masked in a worker thread


@dataclass(frozen=True)
class Request:
    """What ``ContextEngine.begin`` learnt about a request, for ``finish``."""

    scope: str
    messages: Messages
    ingested: IngestResult
    instructions: Messages
    instruction_tokens: int
    limit: int
    sizes: Sizes
    conversation: ConversationRecord
    count: int
    view: View
    tools_offered: bool
    dialect: Dialect
    standing: Standing


class Composer:
    def __init__(self, store: Store, settings: LcmSettings) -> None:
        self.store = store
        self.settings = settings
        self._last_sent: dict[str, str] = {}  # conversation id -> composition last recorded by this process
        self.held = held.HeldRecall()  # recall blocks forwarded, kept in their messages (``proxy.engine.held``)

    async def compose(
        self,
        request: Request,
        view: View,
        compact: dict[int, str],
        compaction: Compaction,
        earlier: Sequence[tuple[str, int]],
    ) -> Prepared:
        """``instructions + ledger + summaries + raw messages`` within the request's limit, with what
        auto-recall adds. ``view``: complete (every raw message's role and cost); ``compact``: the stored
        stubs' compact forms by seq; ``earlier``: the conversations it continues (client compactions)."""
        conversation_id = request.conversation.id
        ingested, dialect, sizes, limit = request.ingested, request.dialect, request.sizes, request.limit
        count = request.count
        standing = request.standing
        # A superseded value does not come back through the summaries (masked copies; long ones off the loop).
        if standing.stale is not None and sum(len(s.content) for s in view.summaries) > MASK_OFF_LOOP_CHARS:
            summaries = await asyncio.to_thread(standing.masked_summaries, view.summaries)
        else:
            summaries = standing.masked_summaries(view.summaries)

        try:
            assembly = fit(dialect, summaries, view.upto, view.roles, view.costs, sizes.context)
        except TooLarge:  # the recall and ledger reserves give way
            assembly = fit(dialect, summaries, view.upto, view.roles, view.costs, limit)
        if assembly.evicted or assembly.first_raw > view.upto:
            compaction = "deferred" if compaction == "deferred" else "evicted"
            log.info(
                "%s: %d summaries and %d messages left the forwarded view to fit %d tokens",
                conversation_id,
                len(assembly.evicted),
                assembly.first_raw - view.upto,
                sizes.context,
            )
        transcript = ingested.messages[len(request.instructions) :]  # huge payloads already stubbed

        def raw_at(seq: int) -> Message:
            message = transcript[seq]
            return apply_patches(message, [(p, v) for p, v in _loads(compact[seq])]) if seq in compact else message

        raw = [raw_at(seq) for seq in range(assembly.first_raw, count)]
        used = assembly.tokens
        # The ledger: right after the instructions, before the summaries, within its share (and the room left).
        room = min(max(sizes.ledger, budget.ledger_share(self.settings, limit)), limit - used - 8)
        small = budget.compact_ledger(limit)
        block, items = standing.block(assembly.first_raw, room, small) if room > 0 else ("", ())
        if block:
            used += tokens.count_text(block) + 6  # its own message, or a paragraph of the first one
        prefix = "\n".join(p for p in (block, summaries_text(assembly.summaries)) if p) or None
        summary_ids = tuple(s.id for s in assembly.summaries)
        # The recall blocks earlier requests forwarded, kept in their messages while what comes before the raw
        # messages is what they were placed after, each in the very message it went into (a new question at a
        # retried one's place is another message).
        key = held.prefix_key(prefix, assembly.first_raw)
        kept = self.held.get(conversation_id, count)
        candidates: tuple[held.Block, ...] = ()
        if kept is not None and (kept.key, kept.summaries) == (key, summary_ids):
            candidates = tuple(
                b for b in kept.blocks if b.seq >= assembly.first_raw and held.digest(raw_at(b.seq)) == b.anchor
            )
        # The same question or tool round again (a retry): where a new block would go, one is held already.
        newest = (_last_user(dialect, raw, assembly.first_raw), assembly.first_raw + len(raw) - 1)
        again = any(b.seq in newest for b in candidates)
        recalling = self.settings.auto_recall == "auto" and (assembly.first_raw > 0 or earlier) and sizes.recall > 0
        recalled: tuple[int, ...] = ()
        fresh: held.Block | None = None
        if recalling and not again:
            # The newest question's block first, within its cap (at most a quarter of the message limit: in a 2k
            # window a block of five excerpts cost more than the turn itself): recall of what is asked now comes
            # before the cache (`bench fidelity` found fewer facts when the blocks held came first). Excerpts the
            # blocks held show already are left out.
            cap = min(limit - used - 8, self.settings.auto_recall_tokens or max(sizes.recall, min(2000, limit // 4)))
            context = "\n".join([block, *(s.content for s in assembly.summaries), *(b.text for b in candidates)])
            placement = await auto_recall.place(
                self.store, conversation_id, assembly.first_raw, raw, cap, dialect, standing.mask_recalled, earlier,
                context,
            )  # fmt: skip
            raw, used, recalled, fresh = placement.messages, used + placement.tokens, placement.ids, placement.block
        # The blocks held get the room left in the limit, oldest first; one that no longer fits gives way with
        # those after it (the next request is read again from there).
        blocks: list[held.Block] = []
        for b in candidates:
            if used + b.tokens > limit - 8:
                break
            blocks.append(b)
            used += b.tokens
        raw, placed = held.apply(dialect, raw, assembly.first_raw, blocks)
        recalled = tuple(i for b in placed for i in b.ids) + recalled
        blocks = [*placed, fresh] if fresh is not None else list(placed)
        summary_ids = tuple(s.id for s in assembly.summaries)
        self.held.keep(conversation_id, held.Held(assembly.first_raw, summary_ids, key, tuple(blocks)))
        sent = Sent(
            tuple(s.id for s in assembly.summaries),
            tuple(assembly.evicted),
            assembly.first_raw,
            assembly.first_raw - view.upto,
            recalled,
            used,
            items,
        )
        await self.record(conversation_id, sent, view.upto)
        return Prepared(
            conversation_id,
            join(dialect, request.instructions, prefix, raw),
            ingested.tokens_sent,
            request.instruction_tokens + used + 3,
            compaction,
            limit,
            self.offer_tools(True, request.tools_offered),
            max(0, limit - used),
            count,
            sent,
            sizes,
            ingested.tip_chain,
            dialect,
        )

    async def record(self, conversation_id: str, sent: Sent, upto: int) -> None:
        """Store what was forwarded when its composition changed (compaction moments, eviction), for the admin
        views and ``show``: they report what the model saw, not only what is stored."""
        composition = orjson.dumps(
            {
                "summaries": sent.summaries,
                "evicted": sent.evicted,
                "upto": upto,
                "first_raw": sent.first_raw,
                "dropped": sent.dropped,
                "ledger": sent.ledger,
            }
        ).decode()
        if self._last_sent.get(conversation_id) == composition:
            return
        async with self.store.write() as tx:
            await tx.set_last_sent(conversation_id, composition)
        if len(self._last_sent) > 10_000:
            self._last_sent.clear()
        self._last_sent[conversation_id] = composition

    def offer_tools(self, compacted: bool, allowed: bool) -> bool:
        """Offer the recall tools when the model may have them (``allowed``: the wire side knows the model)
        and there is something to recall (summaries or stubs), or always when configured so."""
        return allowed and (compacted or self.settings.retrieval_tools == "always")


def _loads(text: str) -> list[tuple[list[str | int], str]]:
    return [(p, v) for p, v in orjson.loads(text)]


def _last_user(dialect: Dialect, raw: list[Message], first_raw: int) -> int:
    """The seq of the newest user message forwarded raw (-1: none)."""
    for i in range(len(raw) - 1, -1, -1):
        if dialect.user_turn(dialect.role(raw[i])):
            return first_raw + i
    return -1
