"""Compaction: the summary DAG that keeps a conversation inside its budget forever.

The active context of a conversation is ``context_items`` (its top-level summaries, oldest first) followed
implicitly by the raw messages from ``summarized_upto`` on. A sweep works on a copy (``Plan``) until the
context is under its target (``proxy.engine.budget``), cheapest first:

1. **stub step** — large tool results before the fresh tail are swapped for their prepared stubs
   (``stubbed_upto``): no LLM call, and it often frees more than a summary would;
2. **leaf pass** — just enough of the oldest raw messages outside the fresh tail (a tool call and all its
   results stay together) become one depth-0 summary (``proxy.engine.passes``);
3. **condensed pass** — when the summaries outgrow their room, or a run reaches its fanout, a run of
   summaries becomes one node a level deeper: condensed before anything has to be evicted.

The sweep's result is committed in one write transaction (summaries, source links, context swap) that first
re-checks the state it was computed from, so concurrent compactions (other workers) can only waste work,
never corrupt it; and they do not even waste it: a sweep holds its conversation's lease
(``proxy.engine.lease``) from before it reads that state until after it commits, so one conversation is
swept by one process at a time. A sweep repeats passes under an iteration cap and a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.config.lcm import LcmSettings
from proxy.dialects import Dialect, by_name
from proxy.engine import budget
from proxy.engine.assemble import exchange_start, required_start
from proxy.engine.budget import DEFAULT_WINDOW_LIMIT, Sizes
from proxy.engine.errors import SummarizerUnavailable
from proxy.engine.lease import CompactionLeases
from proxy.engine.passes import CatchUp, SummaryWriter
from proxy.engine.plan import Plan
from proxy.engine.render import summary_tokens
from proxy.engine.standing.flow import record_proposed
from proxy.engine.summarize import Guard, Summarizer, SummaryPreempted
from proxy.store.base import Reads, Store, reads_for
from proxy.store.records import ConversationRecord, SummaryRecord

TAIL_LOOKBACK = 512  # roles fetched before the fresh tail, to find the start of a long run of tool results


def tail_start(
    dialect: Dialect, roles: Sequence[str], costs: Sequence[int], offset: int, count: int, sizes: Sizes
) -> int:
    """First seq of the fresh tail: the newest messages, at most ``sizes.tail_count`` of them and at most
    ``sizes.tail_tokens``, taken whole exchanges at a time (a tool result never starts the tail: its assistant
    call joins it). What must be forwarded raw (``required_start``: the newest user message and what follows
    it, or in a long agent run only the newest exchange) always belongs to the tail. ``roles`` and ``costs``
    cover seqs ``[offset, count)``."""
    required = required_start(dialect, roles, costs, offset, count, sizes.limit) if count > offset else count
    start, total = count, 0
    while start > offset:
        first = exchange_start(dialect, roles, offset, start - 1)  # a whole exchange: the call and its results
        cost = sum(costs[first - offset : start - offset])
        if start <= required and (count - first > sizes.tail_count or total + cost > sizes.tail_tokens):
            break
        start, total = first, total + cost
    return start


async def covering_prefix(q: Reads, top: Sequence[SummaryRecord], limit: int) -> tuple[list[SummaryRecord], int]:
    """The summaries that cover the longest prefix of messages [0, limit), descending into condensed nodes
    that reach past ``limit``. Used for forks and for requests that re-send an earlier point."""
    out: list[SummaryRecord] = []
    upto = 0
    for summary in top:
        if summary.end_seq <= limit:
            out.append(summary)
            upto = summary.end_seq
            continue
        if summary.kind == "condensed":
            inner, inner_upto = await covering_prefix(q, await q.child_summaries(summary.id), limit)
            if inner:
                out += inner
                upto = inner_upto
        break
    return out, upto


@dataclass
class SweepReport:
    stubbed: bool = False
    leaf_passes: int = 0
    condensed_passes: int = 0
    fallbacks: int = 0
    unavailable: bool = False
    deadline_hit: bool = False
    conflict: bool = False  # another worker changed the context meanwhile; this sweep's work was dropped
    preempted: bool = False  # a background summary gave way to a chat request; the rest waits for a later sweep
    busy: bool = False  # another sweep of the conversation (another process) held its lease throughout: nothing done
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def changed(self) -> bool:
        return not self.conflict and (self.stubbed or self.leaf_passes > 0 or self.condensed_passes > 0)


class Compactor:
    def __init__(self, store: Store, settings: LcmSettings, guard: Guard, catch_up: CatchUp | None = None) -> None:
        self.store = store
        self.settings = settings
        self.guard = guard
        self.writer = SummaryWriter(store, settings, guard, catch_up)
        self.leases = CompactionLeases(store, settings.compaction_lease_heartbeat_seconds)

    def default_sizes(self, summarizer: Summarizer | None = None) -> Sizes:
        """Sizes when no request is at hand (the operator's ``compact``): a large model's."""
        return budget.sizes(self.settings, DEFAULT_WINDOW_LIMIT, getattr(summarizer, "window", None))

    async def view(self, conversation: ConversationRecord, count: int) -> tuple[list[SummaryRecord], int]:
        """The summaries in the context of the first ``count`` messages, and the first raw seq after them."""
        q = self.store.read
        summaries = await q.context_summaries(conversation.id)
        # The boundary comes from the summaries themselves (one statement, one snapshot), not from the
        # conversation row read earlier: a compaction committing in between would pair the new summaries
        # with the old boundary and send the messages they cover twice.
        upto = summaries[-1].end_seq if summaries else 0
        if upto <= count:
            return summaries, upto
        return await covering_prefix(q, summaries, count)

    async def _tokens(
        self,
        conversation_id: str,
        summaries: Sequence[SummaryRecord],
        upto: int,
        stubbed_upto: int,
        count: int,
        dialect: Dialect,
    ) -> int:
        raw = await reads_for(self.store, count - upto).raw_token_sum(conversation_id, upto, count, stubbed_upto)
        return summary_tokens(summaries, dialect) + raw

    async def tail_start(
        self, conversation_id: str, count: int, stubbed_upto: int, sizes: Sizes, dialect: Dialect
    ) -> int:
        offset = max(0, count - sizes.tail_count - TAIL_LOOKBACK)
        roles = await self.store.read.roles(conversation_id, offset, count)
        costs = await self.store.read.raw_token_counts(conversation_id, offset, count, stubbed_upto)
        return tail_start(dialect, roles, costs, offset, count, sizes)

    async def plan(self, conversation: ConversationRecord) -> Plan:
        summaries = await self.store.read.context_summaries(conversation.id)
        return Plan(
            conversation=conversation,
            original_ids=[s.id for s in summaries],
            summaries=list(summaries),
            summarized_upto=conversation.summarized_upto,
            stubbed_upto=conversation.stubbed_upto,
        )

    async def stub_step(self, plan: Plan, tail: int) -> bool:
        if plan.stubbed_upto >= tail:
            return False
        q = reads_for(self.store, tail - plan.stubbed_upto)
        patches = await q.patches(plan.conversation.id, plan.stubbed_upto, tail)
        if not any(compact for _, _, compact in patches):
            return False
        plan.stubbed_upto = tail
        return True

    async def commit(self, plan: Plan) -> bool:
        """Swap the plan in: new summaries, their source links and the new context, in one transaction —
        unless the context changed since the plan was made (another worker compacted meanwhile)."""
        if not plan.changed:
            return True
        conversation_id = plan.conversation.id
        if plan.proposed:  # what the model read joins a ledger that holds every message's own statements
            await self.writer.catch_up(conversation_id)
        async with self.store.write() as tx:
            await tx.lock_conversation(conversation_id)
            current = await tx.conversation(None, conversation_id)
            ids = [s.id for s in await tx.context_summaries(conversation_id)]
            if (
                current is None
                or ids != plan.original_ids
                or current.summarized_upto != plan.conversation.summarized_upto
                or current.stubbed_upto != plan.conversation.stubbed_upto
            ):
                return False
            for record, message_ids, child_ids in plan.pending:
                await tx.insert_summary(record, message_ids, child_ids)
            await record_proposed(tx, conversation_id, plan.proposed)
            await tx.set_context(conversation_id, [s.id for s in plan.summaries], plan.summarized_upto)
            await tx.set_stubbed_upto(conversation_id, plan.stubbed_upto)
        return True

    async def sweep(
        self,
        conversation_id: str,
        summarizer: Summarizer | None,
        *,
        sizes: Sizes | None = None,
        count: int | None = None,
        target_tokens: int | None = None,
        lease_wait: float = 0.0,
    ) -> SweepReport:
        """Passes until the context is under ``target_tokens`` (by default the sizes' target; with neither, until
        nothing outside the tail is left) and its summaries fit their room, bounded by an iteration cap and a
        deadline; the result is committed at once. While another process sweeps the conversation, this waits
        for it at most ``lease_wait`` seconds, then starts from what it committed (or does nothing: ``busy``)."""
        async with self.leases.hold(conversation_id, lease_wait) as held:
            if not held:
                return SweepReport(busy=True)
            return await self._sweep(conversation_id, summarizer, sizes, count, target_tokens)

    async def _sweep(
        self,
        conversation_id: str,
        summarizer: Summarizer | None,
        sizes: Sizes | None,
        count: int | None,
        target_tokens: int | None,
    ) -> SweepReport:
        report = SweepReport()
        conversation = await self.store.read.conversation(None, conversation_id)
        if conversation is None:
            return report
        # Without a request's sizes (the operator's ``compact``) everything outside the tail is compacted.
        target = target_tokens if target_tokens is not None else sizes.target if sizes else 0
        sizes = sizes or self.default_sizes(summarizer)
        n = conversation.message_count if count is None else count
        plan = await self.plan(conversation)
        deadline = time.monotonic() + self.settings.sweep_deadline_seconds
        dialect = by_name(conversation.dialect)
        tail = await self.tail_start(conversation_id, n, conversation.stubbed_upto, sizes, dialect)
        for iteration in range(self.settings.max_sweep_iterations + 1):
            upto, stubbed = plan.summarized_upto, plan.stubbed_upto
            current = await self._tokens(conversation_id, plan.summaries, upto, stubbed, n, dialect)
            crowded = summary_tokens(plan.summaries, dialect) > sizes.summary_room
            due = crowded or self.writer.condensable(plan.summaries, force=False) is not None  # a run at its fanout
            if iteration == 0:
                report.tokens_before = current
            report.tokens_after = current
            if iteration == self.settings.max_sweep_iterations or (current <= target and not due):
                break
            if time.monotonic() > deadline:
                report.deadline_hit = True
                break
            if current > target and await self.stub_step(plan, tail):
                report.stubbed = True
                continue
            try:
                made = None
                if current > target:
                    made = await self.writer.leaf_pass(plan, tail, summarizer, sizes, current - target, target == 0)
                if made is not None:
                    report.leaf_passes += 1
                else:
                    # Condense before anything is evicted: when nothing raw is left to summarise, or when the
                    # summaries outgrew their share of the budget.
                    made = await self.writer.condensed_pass(plan, summarizer, sizes, force=crowded)
                    report.condensed_passes += made is not None
                if made is not None:
                    report.fallbacks += made.escalation == 2
                    continue
            except SummarizerUnavailable:
                report.unavailable = True
            except SummaryPreempted:
                report.preempted = True
            break
        if not await self.commit(plan):
            report.conflict = True
            report.tokens_after = report.tokens_before
        return report
