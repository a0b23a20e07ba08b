"""The context engine's small interface to the wire layer: ``prepare`` a request, ``after_response``.

``prepare`` ingests the transcript and assembles ``instructions + summaries + raw messages`` within the
request's budget (``proxy.engine.budget``): over the context share it compacts first, for at most
``inline_compaction_seconds`` (the rest finishes in the background); whatever still does not fit leaves the
forwarded view oldest first (``proxy.engine.assemble``). When older material is outside what is forwarded,
auto-recall places original excerpts that match the newest user message right before it. Only when the
newest user message and what follows it cannot fit at all is the request refused. Below the soft threshold
with nothing intercepted, the request's own message list is forwarded untouched and no summarizer is called.

Messages are read, and the proxy's own blocks written, through the request's dialect (``proxy.dialects``):
the chat door's by default. The sweeps this process runs are ``proxy.engine.sweeps``'s to track.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.config.lcm import LcmSettings
from proxy.dialects import CHAT, Dialect, count_messages, split_instructions
from proxy.engine import answers, budget, digest, export
from proxy.engine.assemble import Assembly, required_start
from proxy.engine.budget import Budget
from proxy.engine.compaction import Compactor, SweepReport, covering_prefix
from proxy.engine.compose import Composer, Request
from proxy.engine.errors import ConversationBusy
from proxy.engine.explore import TextSummarizer
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.engine.prepared import Compaction, Prepared, Sent, View
from proxy.engine.seen import Fingerprint, Seen
from proxy.engine.standing import Standing
from proxy.engine.standing.reader import LedgerReader
from proxy.engine.summarize import Guard, Summarizer
from proxy.engine.sweeps import Sweeps
from proxy.store.base import Blobs, Store, reads_for
from proxy.store.records import ConversationRecord
from proxy.types import Message, Messages

__all__ = ["Budget", "ContextEngine", "Prepared", "RequestSummarizer"]

log = logging.getLogger("lcm_proxy.engine")


class RequestSummarizer(Summarizer, TextSummarizer, Protocol):
    """What the engine needs from the request's summary model (implemented by the wire side)."""


@dataclass
class Preparation:
    """A request between ``begin`` and ``finish``: ``compacting`` is the inline compaction it waits for."""

    engine: ContextEngine
    request: Request | None = None
    compacting: asyncio.Task[SweepReport] | None = None
    done: Prepared | None = None

    async def finish(self) -> Prepared:
        if self.done is None:
            assert self.request is not None
            self.done = await self.engine._finish(self.request, self.compacting)
        return self.done


TAIL_WINDOW = 64  # newest raw messages a request reads first, for its required start (``_view``)
MAX_CONTINUED = 64  # client compactions one conversation is followed back through (as recall's ancestors)


# A conversation's messages are read for standing instructions (``proxy.engine.standing.reader``) once it holds
# this share of the soft threshold: until then its ledger is neither forwarded nor reserved for, and most
# conversations never reach it. From then on each turn is read after its response, so the first compaction finds
# the ledger read (or nearly: ``catch_up`` reads what is left).
READ_AHEAD = 0.5


class ContextEngine:
    def __init__(self, store: Store, files: Blobs, settings: LcmSettings) -> None:
        self.store = store
        self.files = files
        self.settings = settings
        self.guard = Guard(settings.max_summarizer_calls_per_hour)
        default = budget.sizes(settings, budget.DEFAULT_WINDOW_LIMIT)
        thresholds = Thresholds(default.large_file, default.tool_result)
        standing = settings.standing_instructions != "off"
        self.seen = Seen()  # transcripts this process handled: a re-sent prefix is not validated or hashed again
        self.ingestor = Ingestor(store, files, thresholds, self.guard, standing, seen=self.seen)
        # Messages are read for standing instructions after the response, or before the ledger is needed.
        self.reader = LedgerReader(store, files, standing)
        self._unread: set[str] = set()  # conversations with messages stored by this process's requests, not read
        self._near: set[str] = set()  # conversations past READ_AHEAD at their last request
        self.compactor = Compactor(store, settings, self.guard, self.reader.catch_up)
        self.sweeps = Sweeps(self.compactor, settings)
        self.composer = Composer(store, settings)  # a compacted request's context (``proxy.engine.compose``)

    async def prepare(self, *args: Any, **kwargs: Any) -> Prepared:
        """``begin`` (same arguments) then ``finish``: the request's messages, ready to forward."""
        return await (await self.begin(*args, **kwargs)).finish()

    async def begin(
        self,
        scope: str,
        messages: Messages,
        request_budget: Budget,
        summarizer: RequestSummarizer | None,
        *,
        conversation_key: str | None = None,
        model: str | None = None,
        tools_offered: bool = False,
        dialect: Dialect = CHAT,
        continues: bool = False,
        link_key: str | None = None,
        seen: Fingerprint | None = None,
    ) -> Preparation:
        """The fast half of ``prepare``: ingest, the refusal check, and the start of an inline compaction when
        one is needed (``Preparation.compacting``); ``finish`` waits for it and assembles. A streamed request
        can send its headers in between. ``messages`` are in the wire format ``dialect`` reads; ``seen``: the
        door's fingerprint of them (``proxy.engine.seen``)."""
        instructions, _ = split_instructions(dialect, messages)
        instruction_tokens = count_messages(dialect, instructions) if instructions else 0
        limit = request_budget.for_messages(instruction_tokens)
        if request_budget.reserve_leaves_no_room(instruction_tokens):
            raise budget.no_room(limit, request_budget, instruction_tokens)  # before anything is stored
        sizes = budget.sizes(self.settings, limit, getattr(summarizer, "window", None))
        ingested = await self.ingestor.ingest(
            scope,
            messages,
            conversation_key=conversation_key,
            summarizer=summarizer,
            model=model,
            thresholds=Thresholds(sizes.large_file, sizes.tool_result),
            dialect=dialect,
            continues=continues,
            link_key=link_key,
            seen=seen,
        )
        if ingested.conversation_id is None:
            done = Prepared(None, messages, ingested.tokens_sent, ingested.tokens_sent, "none", limit, dialect=dialect)
            return Preparation(self, done=done)
        parent_task = self.sweeps.current(ingested.forked_from) if ingested.forked_from else None
        if ingested.forked_from is not None and parent_task is None:
            await self._adopt(ingested.conversation_id, ingested.forked_from)
        conversation = await self._conversation(scope, ingested.conversation_id)
        count = len(ingested.messages) - len(instructions)
        view = await self._view(conversation, count, limit, dialect)
        window = getattr(summarizer, "window", None)
        if self.reader.enabled and not self._plain_whatever_the_ledger(
            conversation, view, count, limit, window, READ_AHEAD
        ):
            if len(self._near) > 10_000:  # responses that never ended: their reads wait for the next need
                self._near.clear()
                self._unread.clear()
            self._near.add(conversation.id)
            if conversation.ledger_upto < conversation.message_count:
                self._unread.add(conversation.id)  # read after the response (``after_response``)
        else:
            self._near.discard(conversation.id)
        if parent_task is None and self._plain_whatever_the_ledger(conversation, view, count, limit, window):
            standing = Standing.of([])  # forwarded as sent: the ledger is neither forwarded nor reserved for
        else:
            standing = await self._standing(conversation)
        if standing.items:  # the budget keeps what the conversation's standing instructions take
            reserve = standing.reserve(budget.ledger_room(self.settings, limit), budget.compact_ledger(limit))
            sizes = budget.sizes(self.settings, limit, window, reserve)
        required = sum(view.costs[view.required - view.start :])
        if required > limit:
            # Refused before any summarizer call or stored change: compaction cannot make this fit.
            refusal = budget.too_large(required, limit, request_budget, instruction_tokens)
            refusal.conversation_id = ingested.conversation_id
            raise refusal
        request = Request(
            scope, messages, ingested, instructions, instruction_tokens, limit, sizes, conversation, count, view,
            tools_offered, dialect, standing,
        )  # fmt: skip
        if parent_task is not None and not parent_task.done():
            # A fork made while its parent is being compacted waits for that compaction (in ``finish``, so a
            # streamed request sends its headers first) and takes its summaries of the shared prefix.
            waiting = asyncio.create_task(self._after_parent(request, parent_task, summarizer))
            return Preparation(self, request, compacting=waiting)
        if view.tokens > sizes.context and not getattr(summarizer, "between_turns", False):
            task = self.sweeps.start(conversation.id, summarizer, sizes, count, "inline")
            return Preparation(self, request, compacting=task)
        # A summariser that works between turns (a local one-slot server) compacts after the response, while the
        # server is idle; this request is answered from what fits (``_finish`` schedules the compaction).
        return Preparation(self, request)

    async def _finish(self, request: Request, compacting: asyncio.Task[SweepReport] | None) -> Prepared:
        ingested, conversation, count, view = request.ingested, request.conversation, request.count, request.view
        sizes, limit = request.sizes, request.limit
        compaction: Compaction = "none"
        if compacting is not None:
            compaction = await self.sweeps.wait_inline(conversation.id, compacting)
            conversation = await self._conversation(request.scope, conversation.id)
            # The sweep may have added what the summary model read (``standing.proposals``).
            request = dataclasses.replace(request, standing=await self._standing(conversation))
            view = await self._view(conversation, count, limit, request.dialect)
        elif view.tokens > sizes.soft:
            compaction = "scheduled"
        stubbed = min(conversation.stubbed_upto, count)
        patches = await reads_for(self.store, stubbed - view.upto).patches(conversation.id, view.upto, stubbed)
        compact = {seq: c for seq, _, c in patches if c is not None}
        # (A continuation of a client's own compaction is assembled: auto-recall reaches what it continues.)
        plain = not view.summaries and view.upto == 0 and not compact and not conversation.continued
        if plain and view.tokens <= sizes.context:
            # Zero-cost continuity: the request's own list, untouched (nothing summarised, nothing stubbed).
            stubs = ingested.messages is not request.messages  # huge payloads were stubbed at ingest
            return Prepared(
                conversation.id, ingested.messages, ingested.tokens_sent, ingested.tokens_forwarded, compaction,
                limit, self.composer.offer_tools(stubs, request.tools_offered), max(0, limit - view.tokens), count,
                Sent(tokens=view.tokens), sizes, ingested.tip_chain, request.dialect,
            )  # fmt: skip
        if not view.complete:  # eviction may reach any raw message
            view = await self._view(request.conversation, count, limit, request.dialect, tail=False)
        earlier = await self._continued(request.scope, request.conversation)
        return await self.composer.compose(request, view, compact, compaction, earlier)

    async def _standing(self, conversation: ConversationRecord) -> Standing:
        """The conversation's ledger (none when it is off), its messages not read yet read first."""
        if self.settings.standing_instructions == "off":
            return Standing.of([])
        await self.reader.catch_up(conversation.id, conversation)
        return await Standing.read(self.store.read, conversation.id)

    def _plain_whatever_the_ledger(
        self,
        conversation: ConversationRecord,
        view: View,
        count: int,
        limit: int,
        window: int | None,
        share: float = 1.0,
    ) -> bool:
        """Whether the request is forwarded as sent whatever its conversation's ledger holds: nothing of it is
        summarised or stubbed, and its messages stay under the soft threshold even with the largest reserve the
        ledger could take (``_finish``'s plain case, with no compaction due). Then the ledger is not read at all,
        nor caught up (``proxy.engine.standing.reader``): it is neither forwarded nor reserved for. With a
        ``share`` below 1, whether the messages stay under that share of it (``READ_AHEAD``)."""
        if view.summaries or view.upto > 0 or conversation.continued or min(conversation.stubbed_upto, count) > 0:
            return False
        most = budget.sizes(self.settings, limit, window, budget.ledger_room(self.settings, limit))
        return view.tokens <= share * min(most.soft, most.context)

    async def _view(
        self, conversation: ConversationRecord, count: int, limit: int, dialect: Dialect, *, tail: bool = True
    ) -> View:
        """The stored view of the first ``count`` messages. ``tail``: read the roles and costs of the newest raw
        messages only, as far back as the required start needs, and the total from the stored running sums
        (``proxy.store.running``): a long uncompacted conversation then costs a request a few rows, not one per
        message (``_assemble`` reads them all when material must leave the view)."""
        summaries, upto = await self.compactor.view(conversation, count)
        stubbed, window = conversation.stubbed_upto, TAIL_WINDOW
        if tail and count - upto > window:
            raw = await self.store.read.raw_token_sum(conversation.id, upto, count, stubbed)
            while count - window > upto:
                start = count - window
                roles = await self.store.read.roles(conversation.id, start, count)
                costs = await self.store.read.raw_token_counts(conversation.id, start, count, stubbed)
                required = required_start(dialect, roles, costs, start, count, limit)
                # The newest user message within the window (after its first message) and the start after
                # the window's first message: the same answer as reading every message would give.
                if required > start and any(dialect.user_turn(role) for role in roles[1:]):
                    return View(summaries, upto, roles, costs, required, dialect, start, raw)
                window *= 4
        q = reads_for(self.store, count - upto)  # raw messages as long as the history until a compaction
        roles = await q.roles(conversation.id, upto, count)
        costs = await q.raw_token_counts(conversation.id, upto, count, stubbed)
        required = required_start(dialect, roles, costs, upto, count, limit) if costs else count
        return View(summaries, upto, roles, costs, required, dialect)

    async def _conversation(self, scope: str, conversation_id: str) -> ConversationRecord:
        conversation = await self.store.read.conversation(scope, conversation_id)
        if conversation is None:  # deleted (the admin API, the CLI, retention) while this request was in flight
            raise ConversationBusy(f"Conversation {conversation_id} was deleted while this request used it; retry.")
        return conversation

    async def _after_parent(
        self, request: Request, parent: asyncio.Task[SweepReport], summarizer: RequestSummarizer | None
    ) -> SweepReport:
        """The fork's side of its parent's running compaction: wait for it (within the inline deadline), take
        its summaries of the shared prefix, then compact the fork itself only if it is still over its share."""
        await asyncio.wait({parent}, timeout=self.settings.inline_compaction_seconds)
        fork = request.conversation
        if fork.parent_id is not None:
            await self._adopt(fork.id, fork.parent_id)
        conversation = await self._conversation(request.scope, fork.id)
        view = await self._view(conversation, request.count, request.limit, request.dialect)
        if view.tokens <= request.sizes.context:
            return SweepReport()
        return await self.sweeps.start(fork.id, summarizer, request.sizes, request.count, "inline")

    async def digest(self, scope: str, conversation_id: str, max_tokens: int) -> str:
        """A client's own compaction answered from the stored conversation (``proxy.engine.digest``)."""
        return await digest.digest(self.store, scope, conversation_id, max_tokens)

    async def history(self, scope: str, conversation_id: str, upto: int) -> Messages | None:
        """The first ``upto`` messages of a stored conversation as its client sent them (a client's compaction
        checkpoint expanded back into what it stands for); None when ``scope`` has no such messages."""
        return await export.history(self.store, self.files, scope, conversation_id, upto)

    async def _continued(self, scope: str, conversation: ConversationRecord) -> list[tuple[str, int]]:
        """The conversations ``conversation`` continues after its client's own compactions, newest first, each
        with the number of its messages the continuation follows (all of them stay searchable)."""
        lines: list[tuple[str, int]] = []
        record: ConversationRecord | None = conversation
        while record is not None and record.continued and record.parent_id and len(lines) < MAX_CONTINUED:
            lines.append((record.parent_id, record.fork_seq or 0))
            record = await self.store.read.conversation(scope, record.parent_id, deleted=True)
        return lines

    async def _adopt(self, fork_id: str, parent_id: str) -> None:
        """Give a fork without summaries its parent's summaries of the shared prefix (nothing is summarised
        twice), e.g. those of a compaction that finished after the fork was made."""
        if await self.store.read.context_summaries(fork_id):
            return
        async with self.store.write() as tx:
            await tx.lock_conversation(fork_id)
            fork = await tx.conversation(None, fork_id)
            if fork is None or fork.fork_seq is None or await tx.context_summaries(fork_id):
                return
            shared, upto = await covering_prefix(tx, await tx.context_summaries(parent_id), fork.fork_seq)
            if shared:
                await tx.set_context(fork_id, [s.id for s in shared], upto)

    def unread(self, prepared: Prepared) -> bool:
        """Whether the request's conversation has messages to read for standing instructions after the
        response (``after_response`` reads them)."""
        return prepared.conversation_id in self._unread

    async def after_response(self, prepared: Prepared, summarizer: RequestSummarizer | None) -> bool:
        """Read the turn's messages for standing instructions (in the background: ``LedgerReader``), and start
        a background compaction if the request crossed the soft threshold, or if its inline compaction overran
        the deadline and gave way to it (one per conversation)."""
        if prepared.conversation_id in self._unread:
            self._unread.discard(prepared.conversation_id)
            self.reader.schedule(prepared.conversation_id)  # (the relayed answer, stored by now, among them)
        if prepared.compaction not in ("scheduled", "deferred", "evicted") or prepared.conversation_id is None:
            return False
        if prepared.compaction == "evicted" and not getattr(summarizer, "between_turns", False):
            return False  # an inline sweep ran for it and did what it could; the next request over the limit retries
        conversation_id, sizes = prepared.conversation_id, prepared.sizes
        running = self.sweeps.current(conversation_id)
        if running is not None:
            # Single flight: no second sweep beside it. But should it stop short (it gave way to a chat request,
            # this one's own, or another process held the conversation), the work this request asks for
            # resumes in the background then instead of waiting for some later request.
            def resume(task: asyncio.Task[SweepReport]) -> None:
                report = None if task.cancelled() else task.result()
                if report is not None and (report.preempted or report.busy):
                    self.sweeps.start(conversation_id, summarizer, sizes, None, "background")

            running.add_done_callback(resume)
            return False
        self.sweeps.start(conversation_id, summarizer, sizes, None, "background")
        return True

    async def compact(self, conversation_id: str, summarizer: RequestSummarizer | None) -> SweepReport:
        """A full sweep now (the admin API, ``lcm-proxy compact``): after the conversation's running sweep, never
        beside it, so nothing is summarised twice."""
        while (running := self.sweeps.current(conversation_id)) is not None:
            log.info("compaction of %s is running already: the full sweep waits for it", conversation_id)
            await asyncio.wait({running})
        return await asyncio.shield(self.sweeps.start(conversation_id, summarizer, None, None, "full"))

    async def record_answer(self, scope: str, prepared: Prepared, answer: Message | None, asked_at: float) -> bool:
        """Store ``answer`` (the door's reply to ``prepared``, in the request's wire format, None when there is
        nothing worth storing), relayed for a request that arrived at ``asked_at``, as its conversation's
        newest message (``answers``)."""
        if answer is None or prepared.conversation_id is None:
            return False
        stored = await answers.record_answer(
            self.ingestor,
            scope,
            prepared.conversation_id,
            prepared.transcript_length,
            prepared.tip_chain,
            answer,
            asked_at,
            prepared.dialect,
        )
        if stored and prepared.conversation_id in self._near:
            self._unread.add(prepared.conversation_id)  # read with the turn's messages (``after_response``)
        return stored

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait for background compactions and reads of standing instructions (tests, shutdown)."""
        await self.reader.wait_idle(timeout)
        await self.sweeps.wait_idle(timeout)
        await self.reader.wait_idle(timeout)

    async def close(self) -> None:
        await self.sweeps.close()
        await self.reader.close()


__all__ += ["Assembly", "Sent"]
