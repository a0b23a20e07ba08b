"""Summary passes: the leaf pass (the oldest raw messages outside the tail become one summary) and the
condensed pass (a run of summaries becomes one node a level deeper), each written as the model's notes
followed by the facts extracted from the material, or as the extractive fallback.

A pass changes only the sweep's working copy (``Plan``); ``Compactor.commit`` swaps the whole result in.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

import orjson

from proxy import tokens
from proxy.config.lcm import LcmSettings
from proxy.dialects import Dialect, by_name
from proxy.engine.budget import Sizes
from proxy.engine.facts import (
    Fact,
    extract_facts,
    fallback_from,
    parse_facts,
    render_facts,
    select_facts,
    split_summary,
)
from proxy.engine.neutralise import defang_markers
from proxy.engine.plan import Plan, view_message
from proxy.engine.render import render_message, strip_reasoning, timestamp
from proxy.engine.standing import proposals
from proxy.engine.standing.proposals import standing_so_far
from proxy.engine.summarize import (
    FALLBACK_MARKER,
    Guard,
    Summarizer,
    SummaryText,
    condensed_prompt,
    leaf_prompt,
    summarize,
)
from proxy.redaction import redact_secrets
from proxy.store.base import LONG_RANGE, Store
from proxy.store.records import MessageRecord, SummaryRecord

LEAF_PAGE = 256  # messages: the first page of roles and costs a leaf pass reads (each next one twice as long)


def new_summary_id() -> str:
    return "sum_" + secrets.token_hex(8)


CatchUp = Callable[[str], Awaitable[None]]  # reads a conversation's messages not read for the ledger yet


async def _read_already(_conversation_id: str) -> None:
    """The ledger's catch-up when every message is read as it is stored (tests that build a writer alone)."""


class SummaryWriter:
    def __init__(self, store: Store, settings: LcmSettings, guard: Guard, catch_up: CatchUp | None = None) -> None:
        self.store = store
        self.settings = settings
        self.guard = guard
        # Reads the conversation's messages not read for standing instructions yet (``LedgerReader.catch_up``):
        # before the summariser is shown the ledger, and before what it read is recorded in it.
        self.catch_up = catch_up or _read_already

    async def leaf_pass(
        self, plan: Plan, tail: int, summarizer: Summarizer | None, sizes: Sizes, excess: int, thorough: bool = False
    ) -> SummaryRecord | None:
        """Summarise the oldest raw messages outside the tail: just enough of them to remove ``excess``
        tokens (within the chunk size and the summary model's window). Unless ``thorough`` (an operator's
        explicit compaction), less material than a summary's own size is left raw: it would save nothing."""
        start = plan.summarized_upto
        if start >= tail:
            return None
        conversation_id, dialect = plan.conversation.id, by_name(plan.conversation.dialect)
        chunk_limit = sizes.chunk_for(excess)
        end, total = await self._chunk_end(conversation_id, start, tail, chunk_limit, plan.stubbed_upto, dialect)
        if end == start or (not thorough and total < min(sizes.leaf_target, sizes.leaf_chunk // 2)):
            return None
        # Only the chunk's rows are read whole (a stubbed row still holds its original), off the event loop.
        chunk = await self.store.search.messages(conversation_id, start, end)
        # Rendering, redaction and fact extraction cost what the chunk's text costs (a leaf chunk's worth of
        # tokens: seconds for a large one): in a worker thread, so the event loop goes on serving meanwhile.
        fact_room = sizes.leaf_target * 2 // 3
        source, pairs, file_ids, facts = await asyncio.to_thread(leaf_material, chunk, fact_room, dialect)
        source_tokens = await asyncio.to_thread(tokens.count_text, source)
        previous = split_summary(plan.summaries[-1].content)[0] if plan.summaries else ""
        context = f"<previous_notes>\n{defang_markers(previous)}\n</previous_notes>\n\n" if previous else ""
        reading = self.settings.standing_instructions != "off"  # the ledger also takes what the model read
        if reading:
            await self.catch_up(conversation_id)
        current = await self.store.read.ledger(conversation_id) if reading else []
        text = await self._write(
            summarizer,
            conversation_id,
            facts,
            prompts=functools.partial(leaf_prompt, standing=reading),
            material=f"{context}{standing_so_far(current)}<conversation>\n{source}\n</conversation>",
            material_tokens=source_tokens,
            target=sizes.leaf_target,
            timeout=self.settings.summary_timeout,
            kind="leaf",
            fallback=lambda: fallback_from(pairs, fallback_room(sizes)),
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
        if text.standing:
            messages = {row.seq: view_message(row, stubbed=True)[0] for row in chunk}
            offered = proposals.parse(text.standing)
            plan.proposed += await asyncio.to_thread(proposals.accept, offered, messages, current, dialect)
        plan.pending.append((record, [row.id for row in chunk], []))
        plan.summaries.append(record)
        plan.summarized_upto = end
        plan.stubbed_upto = max(plan.stubbed_upto, end)
        return record

    async def _chunk_end(
        self, conversation_id: str, start: int, tail: int, limit: int, stubbed_upto: int, dialect: Dialect
    ) -> tuple[int, int]:
        """(end, tokens) of the next leaf chunk ``[start, end)``: the oldest messages before ``tail`` up to
        ``limit`` tokens (as assembled: compact forms where stubbed), a tool call's results always with it.
        Read a page of roles and costs at a time, so a long history costs what the chunk costs, not what
        the history does."""
        q = self.store.read
        end, total, page, previous = start, 0, LEAF_PAGE, ""
        while end < tail:
            stop = min(tail, end + page)
            roles = await q.roles(conversation_id, end, stop)
            costs = await q.raw_token_counts(conversation_id, end, stop, stubbed_upto)
            for role, cost in zip(roles, costs, strict=True):
                # Tool results always join their call's chunk: a cut between them would orphan one side.
                if end > start and total + cost > limit and not dialect.continues(previous, role):
                    return end, total
                end, total, previous = end + 1, total + cost, role
            if end < stop:
                break  # fewer messages than the range names (none are missing in a sound store)
            page = min(page * 2, LONG_RANGE)
        return end, total

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
        if text is None:  # (a fallback reads the whole material: in a worker thread)
            return SummaryText(f"{await asyncio.to_thread(fallback)}\n{FALLBACK_MARKER}", 2, None)
        content = f"{text.content}\n\n{block}" if block else text.content
        return SummaryText(content, text.escalation, text.model, text.standing)

    def _fanout(self, depth: int) -> int:
        return self.settings.leaf_min_fanout if depth == 0 else self.settings.condensed_min_fanout

    def condensable(self, context: Sequence[SummaryRecord], force: bool) -> tuple[int, int] | None:
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
        found = self.condensable(context, force)
        if found is None:
            return None
        first, length = found
        children = context[first : first + length]
        # One call must fit the summary model: fewer children when their notes are long (never fewer than 2).
        while len(children) > 2 and sum(split_tokens(c) for c in children) > sizes.leaf_chunk:
            children = children[:-1]
        depth = max(c.depth for c in children) + 1
        source = "\n\n".join(
            f"[{timestamp(c.earliest_at)} to {timestamp(c.latest_at)} | summary {c.id}]\n"
            f"{defang_markers(split_summary(c.content)[0])}"
            for c in children
        )
        proses = [("text", split_summary(c.content)[0]) for c in children]
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
            fallback=lambda: render_facts(facts) or fallback_from(proses, fallback_room(sizes)),
        )
        record = condensed_record(plan.conversation.id, children, depth, text)
        plan.pending.append((record, [], [c.id for c in children]))
        plan.summaries[first : first + len(children)] = [record]
        return record


def leaf_material(
    chunk: Sequence[MessageRecord], fact_room: int, dialect: Dialect
) -> tuple[str, list[tuple[str, str]], list[str], list[Fact]]:
    """(the rendered chunk, its (role, redacted text) pairs, the files it refers to, its facts within
    ``fact_room`` tokens): what a leaf summary is written from. Pure, for a worker thread."""
    rendered: list[str] = []
    pairs: list[tuple[str, str]] = []  # (role, text) taken from the messages, not re-parsed from the rendering
    file_ids: list[str] = []
    for row in chunk:
        message, refs = view_message(row, stubbed=True)  # the summarizer reads stubs, not 20k-token logs
        rendered.append(render_message(message, row.created_at, dialect))
        pairs.append((row.role, redact_secrets(strip_reasoning(dialect.text(message)))))
        file_ids += [r for r in refs if r not in file_ids]
    return "\n\n".join(rendered), pairs, file_ids, select_facts(extract_facts(pairs), fact_room)


def condensed_record(
    conversation_id: str, children: Sequence[SummaryRecord], depth: int, text: SummaryText
) -> SummaryRecord:
    """The condensed summary of ``children`` written as ``text``: their span, times, descendants and files."""
    file_ids: list[str] = []
    for child in children:
        for file_id in orjson.loads(child.file_ids) if child.file_ids else []:
            if file_id not in file_ids:
                file_ids.append(file_id)
    return SummaryRecord(
        id=new_summary_id(),
        conversation_id=conversation_id,
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


def fallback_room(sizes: Sizes) -> int:
    """Tokens of an extractive fallback, its marker line included in ``sizes.fallback``."""
    return max(24, sizes.fallback - tokens.count_text(FALLBACK_MARKER) - 2)


def split_tokens(summary: SummaryRecord) -> int:
    return tokens.count_text(split_summary(summary.content)[0])
