"""The context engine's small interface to the wire layer: ``prepare`` a request, ``after_response``.

``prepare`` ingests the transcript, assembles ``instructions + summaries + raw tail`` within the budget
(compacting first when over the hard budget, evicting old material from the *view* if compaction cannot
help, refusing with ``context_length_exceeded`` if even the fresh tail cannot fit) and decides whether a
background compaction should follow. Below the soft threshold with nothing intercepted, the request's own
message list is forwarded untouched and no summarizer is called.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal, Protocol

from proxy.config import LcmSettings
from proxy.engine import tokens
from proxy.engine.canonical import split_instructions
from proxy.engine.compaction import Compactor, SweepReport
from proxy.engine.explore import TextSummarizer
from proxy.engine.ingest import Ingestor, IngestResult, Thresholds
from proxy.engine.intercept import apply_patches
from proxy.engine.render import render_summary
from proxy.engine.summarize import Guard, Summarizer
from proxy.errors import ContextLengthExceeded
from proxy.store.files import FileStore
from proxy.store.records import ConversationRecord
from proxy.store.sqlite import SQLiteStore
from proxy.types import Message, Messages

log = logging.getLogger("lcm_proxy.engine")

Compaction = Literal["none", "scheduled", "inline", "evicted"]


@dataclass(frozen=True)
class Budget:
    """What a request leaves for its messages: window minus output reserve and tool schemas (the
    instructions are subtracted by the engine, which knows where they end)."""

    window: int
    output_reserve: int
    tools: int

    def for_messages(self, instructions: int) -> int:
        return self.window - self.output_reserve - self.tools - instructions


class RequestSummarizer(Summarizer, TextSummarizer, Protocol):
    """What the engine needs from the request's summary model (implemented by the wire side)."""


@dataclass(frozen=True)
class Prepared:
    conversation_id: str | None
    messages: Messages
    tokens_sent: int
    tokens_forwarded: int
    compaction: Compaction
    budget: int
    recall: bool = False  # offer the recall tools with this request
    room: int = 0  # tokens still free for messages after the assembled context (the recall loop's budget)
    transcript_length: int = 0  # messages of the request after its instructions: what its recall may see


class ContextEngine:
    def __init__(self, store: SQLiteStore, files: FileStore, settings: LcmSettings) -> None:
        self.store = store
        self.files = files
        self.settings = settings
        self.guard = Guard(settings.max_summarizer_calls_per_hour)
        self.ingestor = Ingestor(
            store,
            files,
            Thresholds(settings.large_file_token_threshold, settings.tool_result_token_threshold),
            self.guard,
        )
        self.compactor = Compactor(store, settings, self.guard)
        self._background: dict[str, asyncio.Task[SweepReport]] = {}

    async def prepare(
        self,
        tenant: str,
        messages: Messages,
        budget: Budget,
        summarizer: RequestSummarizer | None,
        *,
        conversation_key: str | None = None,
        model: str | None = None,
    ) -> Prepared:
        ingested = await self.ingestor.ingest(
            tenant, messages, conversation_key=conversation_key, summarizer=summarizer, model=model
        )
        instructions, transcript = split_instructions(ingested.messages)
        instruction_tokens = tokens.count_messages(instructions) if instructions else 0
        limit = budget.for_messages(instruction_tokens)
        if ingested.conversation_id is None:
            return Prepared(None, messages, ingested.tokens_sent, ingested.tokens_sent, "none", limit)
        conversation = await self.store.read.conversation(tenant, ingested.conversation_id)
        assert conversation is not None
        count = len(transcript)
        soft = int(limit * self.settings.context_threshold)
        current = await self.compactor.context_tokens(conversation, count)
        compaction: Compaction = "none"
        if current > limit:
            # A tail that cannot fit makes the request fail whatever compaction does: refuse it before any
            # summarizer call or stored change (a huge max_tokens must not compact a conversation for good).
            await self._check_tail_fits(conversation, count, budget, instruction_tokens)
            compaction = "inline"
            report = await self.compactor.sweep(conversation.id, summarizer, count=count, target_tokens=soft)
            log.info("inline compaction of %s: %s", conversation.id, report)
            conversation = await self.store.read.conversation(tenant, conversation.id)
            assert conversation is not None
            current = await self.compactor.context_tokens(conversation, count)
        elif current > soft:
            compaction = "scheduled"
        assembled = await self._assemble(conversation, instructions, transcript, ingested)
        if current > limit:
            compaction = "evicted"
            assembled, current = await self._evict(conversation, instructions, transcript, budget, instruction_tokens)
        # From stored per-message counts: re-tokenizing a long context on every request would cost more than
        # everything else the proxy does.
        forwarded = ingested.tokens_forwarded if assembled is ingested.messages else instruction_tokens + current + 3
        mode = self.settings.retrieval_tools
        recall = mode == "always" or (mode == "auto" and assembled is not messages)  # summaries or stubs present
        return Prepared(
            conversation.id,
            assembled,
            ingested.tokens_sent,
            forwarded,
            compaction,
            limit,
            recall,
            max(0, limit - current),
            count,
        )

    async def _assemble(
        self, conversation: ConversationRecord, instructions: Messages, transcript: Messages, ingested: IngestResult
    ) -> Messages:
        count = len(transcript)
        summaries, upto = await self.compactor.view(conversation, count)
        stubbed = min(conversation.stubbed_upto, count)
        compact = {
            seq: c for seq, _, c in await self.store.read.patches(conversation.id, upto, stubbed) if c is not None
        }
        if not summaries and upto == 0 and not compact:
            return ingested.messages  # zero-cost continuity: the request's own list, untouched
        tail: Messages = []
        for seq in range(upto, count):
            message = transcript[seq]
            if seq in compact:
                message = apply_patches(message, [(p, v) for p, v in _loads(compact[seq])])
            tail.append(message)
        return [*instructions, *(render_summary(s) for s in summaries), *tail]

    async def _check_tail_fits(
        self, conversation: ConversationRecord, count: int, budget: Budget, instruction_tokens: int
    ) -> None:
        limit = budget.for_messages(instruction_tokens)
        tail_from = await self.compactor.tail_start(conversation.id, count)
        tail_tokens = await self.store.read.raw_token_sum(conversation.id, tail_from, count, conversation.stubbed_upto)
        if tail_tokens > limit:
            raise ContextLengthExceeded(
                f"This conversation's newest {count - tail_from} messages (the protected fresh tail) need "
                f"{tail_tokens} tokens, but only {limit} are available for messages (context window "
                f"{budget.window} - output reserve {budget.output_reserve} - instructions {instruction_tokens} "
                f"- tools {budget.tools}). Shorten the latest messages, lower max_tokens, or use a larger model.",
                param="messages",
            )

    async def _evict(
        self,
        conversation: ConversationRecord,
        instructions: Messages,
        transcript: Messages,
        budget: Budget,
        instruction_tokens: int,
    ) -> tuple[Messages, int]:
        """Drop the oldest material from the assembled view (never from the store) until it fits."""
        limit = budget.for_messages(instruction_tokens)
        count = len(transcript)
        summaries, upto = await self.compactor.view(conversation, count)
        tail_from = await self.compactor.tail_start(conversation.id, count)
        costs = await self.store.read.raw_token_counts(conversation.id, upto, count, conversation.stubbed_upto)
        rendered = [render_summary(s) for s in summaries]
        total = sum(tokens.count_message(m) for m in rendered) + sum(costs)
        while rendered and total > limit:
            total -= tokens.count_message(rendered.pop(0))
        first_raw = upto
        while total > limit and first_raw < tail_from:
            # Drop a whole exchange: an assistant tool call goes together with all of its results.
            total -= costs[first_raw - upto]
            first_raw += 1
            while first_raw < tail_from and transcript[first_raw].get("role") in ("tool", "function"):
                total -= costs[first_raw - upto]
                first_raw += 1
        if total > limit:
            await self._check_tail_fits(conversation, count, budget, instruction_tokens)
            raise ContextLengthExceeded(
                f"The conversation needs {total} tokens; {limit} are available.", param="messages"
            )
        stubbed = min(conversation.stubbed_upto, count)
        compact = {seq: c for seq, _, c in await self.store.read.patches(conversation.id, first_raw, stubbed) if c}
        kept: list[Message] = []
        for seq in range(first_raw, count):
            message = transcript[seq]
            if seq in compact:
                message = apply_patches(message, [(p, v) for p, v in _loads(compact[seq])])
            kept.append(message)
        return [*instructions, *rendered, *kept], total

    async def after_response(self, prepared: Prepared, summarizer: RequestSummarizer | None) -> bool:
        """Start a background compaction if the request crossed the soft threshold (one per conversation)."""
        if prepared.compaction != "scheduled" or prepared.conversation_id is None:
            return False
        running = self._background.get(prepared.conversation_id)
        if running is not None and not running.done():
            return False
        task = asyncio.create_task(self._compact_in_background(prepared.conversation_id, summarizer))
        self._background[prepared.conversation_id] = task
        return True

    async def _compact_in_background(self, conversation_id: str, summarizer: RequestSummarizer | None) -> SweepReport:
        try:
            report = await self.compactor.sweep(conversation_id, summarizer)
            log.info("background compaction of %s: %s", conversation_id, report)
            return report
        except Exception:
            log.exception("background compaction of %s failed", conversation_id)
            return SweepReport()
        finally:
            self._background.pop(conversation_id, None)

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait for background compactions (tests, shutdown)."""
        tasks = [t for t in self._background.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def close(self) -> None:
        for task in list(self._background.values()):
            task.cancel()
        await self.wait_idle(timeout=5)


def _loads(text: str) -> list[tuple[list[str | int], str]]:
    import orjson

    return [(p, v) for p, v in orjson.loads(text)]
