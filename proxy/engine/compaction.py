"""Compaction: the summary DAG that keeps a conversation inside its budget forever.

The active context of a conversation is ``context_items`` (its top-level summaries, oldest first) followed
implicitly by the raw messages from ``summarized_upto`` on. Passes, cheapest first:

1. **stub step** — large tool results before the fresh tail are swapped for their prepared stubs
   (``stubbed_upto``): no LLM call, and it often frees more than a summary would;
2. **leaf pass** — the oldest raw messages outside the fresh tail, up to ``leaf_chunk_tokens`` (extended so a
   tool call and all its results stay together), become one depth-0 summary;
3. **condensed pass** — the oldest run of ``fanout`` same-depth summaries becomes one node a level deeper.

Each pass is one write transaction (summary + source links + context swap) that first re-checks the state
it was computed from, so concurrent compactions (other workers) can only waste work, never corrupt it.
A sweep repeats passes under an iteration cap and a deadline.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from proxy.config import LcmSettings
from proxy.engine import budget, tokens
from proxy.engine.budget import DEFAULT_WINDOW_LIMIT, Sizes
from proxy.engine.facts import (
    Fact,
    extract_facts,
    extractive_fallback,
    parse_facts,
    parse_transcript,
    render_facts,
    select_facts,
    split_summary,
)
from proxy.engine.intercept import SEGMENTS_KEY, apply_patches
from proxy.engine.render import render_message, render_summaries, timestamp
from proxy.engine.summarize import (
    FALLBACK_MARKER,
    Guard,
    Summarizer,
    SummarizerUnavailable,
    SummaryPreempted,
    SummaryText,
    condensed_prompt,
    leaf_prompt,
    summarize,
)
from proxy.store.records import ConversationRecord, MessageRecord, SummaryRecord
from proxy.store.sqlite import Queries, SQLiteStore
from proxy.types import Message

TAIL_LOOKBACK = 512  # roles fetched before the fresh tail, to find the start of a long run of tool results


def tail_start(roles: Sequence[str], costs: Sequence[int], offset: int, count: int, sizes: Sizes) -> int:
    """First seq of the fresh tail: the newest messages, at most ``sizes.tail_count`` of them and at most
    ``sizes.tail_tokens``, taken whole exchanges at a time (a tool result never starts the tail: its assistant
    call joins it). The newest user message and everything after it always belong to the tail, whatever they
    cost. ``roles`` and ``costs`` cover seqs ``[offset, count)``."""
    newest_user = count - 1
    while newest_user > offset and roles[newest_user - offset] != "user":
        newest_user -= 1
    start, total = count, 0
    while start > offset:
        first = start - 1
        while first > offset and roles[first - offset] in ("tool", "function"):
            first -= 1  # a whole exchange: the call and all of its results
        cost = sum(costs[first - offset : start - offset])
        required = start > newest_user  # the exchange holds the newest user message or follows it
        if not required and (count - first > sizes.tail_count or total + cost > sizes.tail_tokens):
            break
        start, total = first, total + cost
    return start


def new_summary_id() -> str:
    return "sum_" + secrets.token_hex(8)


async def covering_prefix(q: Queries, top: Sequence[SummaryRecord], limit: int) -> tuple[list[SummaryRecord], int]:
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


def view_message(row: MessageRecord, stubbed: bool) -> tuple[Message, list[str]]:
    """A stored message as compaction sees it: stubs applied, payload references as ``[file_…]`` markers."""
    message = orjson.loads(row.original_json)
    file_ids: list[str] = []
    for path in orjson.loads(row.payload_paths) if row.payload_paths else []:
        target = message
        for key in path[:-1]:
            target = target[key]
        pieces = []
        for segment in target[path[-1]][SEGMENTS_KEY]:
            if isinstance(segment, str):
                pieces.append(segment)
            else:
                pieces.append(f"[{segment['ref']}]")
                file_ids.append(segment["ref"])
        target[path[-1]] = "".join(pieces)
    patches = orjson.loads(row.forward_json) if row.forward_json else []
    if stubbed and row.compact_json:
        patches += orjson.loads(row.compact_json)
    return apply_patches(message, [(p, v) for p, v in patches]), file_ids


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
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def changed(self) -> bool:
        return not self.conflict and (self.stubbed or self.leaf_passes > 0 or self.condensed_passes > 0)


@dataclass
class Plan:
    """A sweep's working copy of one conversation's context. Passes change the plan; ``commit`` swaps the
    whole result in with one transaction, so the assembled prefix changes once per sweep, not once per
    pass (provider prompt caches and prefix stability depend on that)."""

    conversation: ConversationRecord
    original_ids: list[str]
    summaries: list[SummaryRecord]
    summarized_upto: int
    stubbed_upto: int
    pending: list[tuple[SummaryRecord, list[int], list[str]]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.pending) or self.stubbed_upto != self.conversation.stubbed_upto


class Compactor:
    def __init__(self, store: SQLiteStore, settings: LcmSettings, guard: Guard) -> None:
        self.store = store
        self.settings = settings
        self.guard = guard

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

    async def context_tokens(self, conversation: ConversationRecord, count: int) -> int:
        """Tokens of the assembled messages (instructions excluded) for the first ``count`` messages."""
        summaries, upto = await self.view(conversation, count)
        return await self._tokens(conversation.id, summaries, upto, conversation.stubbed_upto, count)

    async def _tokens(
        self, conversation_id: str, summaries: Sequence[SummaryRecord], upto: int, stubbed_upto: int, count: int
    ) -> int:
        raw = await self.store.read.raw_token_sum(conversation_id, upto, count, stubbed_upto)
        return summary_tokens(summaries) + raw

    async def tail_start(self, conversation_id: str, count: int, stubbed_upto: int, sizes: Sizes) -> int:
        offset = max(0, count - sizes.tail_count - TAIL_LOOKBACK)
        roles = await self.store.read.roles(conversation_id, offset, count)
        costs = await self.store.read.raw_token_counts(conversation_id, offset, count, stubbed_upto)
        return tail_start(roles, costs, offset, count, sizes)

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
        patches = await self.store.read.patches(plan.conversation.id, plan.stubbed_upto, tail)
        if not any(compact for _, _, compact in patches):
            return False
        plan.stubbed_upto = tail
        return True

    async def leaf_pass(
        self, plan: Plan, tail: int, summarizer: Summarizer | None, sizes: Sizes, excess: int
    ) -> SummaryRecord | None:
        """Summarise the oldest raw messages outside the tail: just enough of them to remove ``excess``
        tokens (within the chunk size and the summary model's window)."""
        start = plan.summarized_upto
        if start >= tail:
            return None
        conversation_id = plan.conversation.id
        rows = await self.store.read.messages(conversation_id, start, tail)
        limit = sizes.chunk_for(excess)
        chunk: list[MessageRecord] = []
        total = 0
        for row in rows:
            stubbed = row.compact_token_count is not None and row.seq < plan.stubbed_upto
            cost = row.compact_token_count if stubbed and row.compact_token_count is not None else row.token_count
            # Tool results always join their call's chunk: a cut between them would orphan one side.
            if chunk and total + cost > limit and row.role not in ("tool", "function"):
                break
            chunk.append(row)
            total += cost
        end = chunk[-1].seq + 1
        rendered: list[str] = []
        file_ids: list[str] = []
        for row in chunk:
            message, refs = view_message(row, stubbed=True)  # the summarizer reads stubs, not 20k-token logs
            rendered.append(render_message(message, row.created_at))
            file_ids += [r for r in refs if r not in file_ids]
        source = "\n\n".join(rendered)
        facts = select_facts(extract_facts(parse_transcript(source)), sizes.leaf_target * 2 // 3)
        previous = split_summary(plan.summaries[-1].content)[0] if plan.summaries else ""
        context = f"<previous_notes>\n{previous}\n</previous_notes>\n\n" if previous else ""
        text = await self._write(
            summarizer,
            conversation_id,
            facts,
            prompts=leaf_prompt,
            material=f"{context}<conversation>\n{source}\n</conversation>",
            material_tokens=tokens.count_text(source),
            target=sizes.leaf_target,
            timeout=self.settings.summary_timeout,
            kind="leaf",
            fallback=lambda: extractive_fallback(source, fallback_room(sizes)),
        )
        record = SummaryRecord(
            id=new_summary_id(),
            conversation_id=conversation_id,
            kind="leaf",
            depth=0,
            start_seq=start,
            end_seq=end,
            content=text.content,
            token_count=tokens.count_text(text.content),
            source_token_count=total,
            earliest_at=chunk[0].created_at,
            latest_at=chunk[-1].created_at,
            descendant_count=0,
            file_ids=orjson.dumps(file_ids).decode() if file_ids else None,
            summarizer_model=text.model,
            escalation=text.escalation,
            created_at=time.time(),
        )
        plan.pending.append((record, [row.id for row in chunk], []))
        plan.summaries.append(record)
        plan.summarized_upto = end
        plan.stubbed_upto = max(plan.stubbed_upto, end)
        return record

    async def _write(
        self,
        summarizer: Summarizer | None,
        conversation_id: str,
        facts: list[Fact],
        *,
        prompts: Callable[[int, bool], tuple[str, str]],
        material: str,
        material_tokens: int,
        target: int,
        timeout: float,
        kind: str,
        fallback: Callable[[], str],
    ) -> SummaryText:
        """The model's notes followed by the extracted facts; without a usable answer, the extractive
        fallback. The facts never depend on the model: a weak one cannot drop them."""
        block = render_facts(facts)
        prose_target = max(48, target - tokens.count_text(block))
        text = await summarize(
            summarizer,
            self.guard,
            conversation_id,
            prompts=(prompts(prose_target, False), prompts(prose_target // 2, True)),
            source=material,
            source_tokens=material_tokens,
            target_tokens=prose_target,
            timeout=timeout,
            kind=kind,
        )
        if text is None:
            return SummaryText(f"{fallback()}\n{FALLBACK_MARKER}", 2, None)
        content = f"{text.content}\n\n{block}" if block else text.content
        return SummaryText(content, text.escalation, text.model)

    def _fanout(self, depth: int) -> int:
        return self.settings.leaf_min_fanout if depth == 0 else self.settings.condensed_min_fanout

    def _condensable(self, context: Sequence[SummaryRecord], force: bool) -> tuple[int, int] | None:
        """(index, length) of the run of summaries to condense: the shallowest run of same-depth summaries
        that reaches its fanout; with ``force`` (the summaries outgrew their room) the oldest run of two or
        more, else the oldest two."""
        runs: list[tuple[int, int, int]] = []  # (depth, index, length)
        i = 0
        while i < len(context):
            j = i
            while j < len(context) and context[j].depth == context[i].depth:
                j += 1
            runs.append((context[i].depth, i, j - i))
            i = j
        full = [(d, i, self._fanout(d)) for d, i, n in runs if n >= self._fanout(d)]
        if full:
            _, index, length = min(full)
            return index, length
        if not force or len(context) < 2:
            return None
        pairs = [(i, n) for _, i, n in runs if n >= 2]
        return pairs[0] if pairs else (0, 2)

    async def condensed_pass(
        self, plan: Plan, summarizer: Summarizer | None, sizes: Sizes, force: bool = False
    ) -> SummaryRecord | None:
        context = plan.summaries
        found = self._condensable(context, force)
        if found is None:
            return None
        first, length = found
        children = context[first : first + length]
        # One call must fit the summary model: fewer children when their notes are long (never fewer than 2).
        while len(children) > 2 and sum(split_tokens(c) for c in children) > sizes.leaf_chunk:
            children = children[:-1]
        depth = max(c.depth for c in children) + 1
        source = "\n\n".join(
            f"[{timestamp(c.earliest_at)} to {timestamp(c.latest_at)} | summary {c.id}]\n{split_summary(c.content)[0]}"
            for c in children
        )
        merged: list[Fact] = []
        for child in children:
            merged += parse_facts(split_summary(child.content)[1])
        facts = select_facts(merged, sizes.condensed_target * 2 // 3)
        text = await self._write(
            summarizer,
            plan.conversation.id,
            facts,
            prompts=lambda target, aggressive: condensed_prompt(depth, target, aggressive),
            material=f"<notes>\n{source}\n</notes>",
            material_tokens=tokens.count_text(source) + sum(c.token_count for c in children),
            target=sizes.condensed_target,
            timeout=self.settings.summary_timeout,
            kind="condensed",
            fallback=lambda: render_facts(facts) or extractive_fallback(source, fallback_room(sizes)),
        )
        file_ids: list[str] = []
        for child in children:
            for file_id in orjson.loads(child.file_ids) if child.file_ids else []:
                if file_id not in file_ids:
                    file_ids.append(file_id)
        record = SummaryRecord(
            id=new_summary_id(),
            conversation_id=plan.conversation.id,
            kind="condensed",
            depth=depth,
            start_seq=children[0].start_seq,
            end_seq=children[-1].end_seq,
            content=text.content,
            token_count=tokens.count_text(text.content),
            source_token_count=sum(c.token_count for c in children),
            earliest_at=children[0].earliest_at,
            latest_at=children[-1].latest_at,
            descendant_count=sum(c.descendant_count + 1 for c in children),
            file_ids=orjson.dumps(file_ids).decode() if file_ids else None,
            summarizer_model=text.model,
            escalation=text.escalation,
            created_at=time.time(),
        )
        plan.pending.append((record, [], [c.id for c in children]))
        plan.summaries[first : first + len(children)] = [record]
        return record

    async def commit(self, plan: Plan) -> bool:
        """Swap the plan in: new summaries, their source links and the new context, in one transaction —
        unless the context changed since the plan was made (another worker compacted meanwhile)."""
        if not plan.changed:
            return True
        conversation_id = plan.conversation.id
        async with self.store.write() as tx:
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
    ) -> SweepReport:
        """Passes until the context is under ``target_tokens`` (by default the sizes' target; with neither, until
        nothing outside the tail is left) and its summaries fit their room, bounded by an iteration cap and a
        deadline; the result is committed at once."""
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
        tail = await self.tail_start(conversation_id, n, conversation.stubbed_upto, sizes)
        for iteration in range(self.settings.max_sweep_iterations + 1):
            current = await self._tokens(conversation_id, plan.summaries, plan.summarized_upto, plan.stubbed_upto, n)
            crowded = summary_tokens(plan.summaries) > sizes.summary_room
            if iteration == 0:
                report.tokens_before = current
            report.tokens_after = current
            if iteration == self.settings.max_sweep_iterations or (current <= target and not crowded):
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
                    made = await self.leaf_pass(plan, tail, summarizer, sizes, current - target)
                if made is not None:
                    report.leaf_passes += 1
                else:
                    # Condense before anything is evicted: when nothing raw is left to summarise, or when the
                    # summaries outgrew their share of the budget.
                    made = await self.condensed_pass(plan, summarizer, sizes, force=crowded)
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


def summary_tokens(summaries: Sequence[SummaryRecord]) -> int:
    """What the summaries cost in the assembled context (one message, see ``render_summaries``)."""
    return tokens.count_message(render_summaries(summaries)) if summaries else 0


def fallback_room(sizes: Sizes) -> int:
    """Tokens of an extractive fallback, its marker line included in ``sizes.fallback``."""
    return max(24, sizes.fallback - tokens.count_text(FALLBACK_MARKER) - 2)


def split_tokens(summary: SummaryRecord) -> int:
    return tokens.count_text(split_summary(summary.content)[0])
