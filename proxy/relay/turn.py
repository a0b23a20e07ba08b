"""One model turn, for any door: who asked, for which model, in which wire format (``Call``); its budget and
summariser from the model's policy; the engine's preparation of its messages (``Call.begin``); the answer
recorded after it (``Call.answer_to``); what the engine does afterwards (``Call.after``: the turn's messages read
for standing instructions, the compaction it calls for); and the one compacted retry when the upstream refuses a
context the proxy's count said would fit (``compacted_retry``).

A door validates its request, builds a ``Call`` with the transcript in its own dialect, and renders what comes
back; everything between is here, so the chat, Messages and Responses doors make the same decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from proxy.config.settings import ProxyConfig
from proxy.dialects import CHAT, Dialect
from proxy.engine.engine import Budget, ContextEngine, Preparation, Prepared
from proxy.engine.errors import ContextTooLong
from proxy.engine.recall import RecallTools
from proxy.engine.seen import Fingerprint
from proxy.errors import UpstreamError
from proxy.relay.policy import ModelPolicy
from proxy.relay.priority import Priority
from proxy.relay.summarizer import UpstreamSummarizer
from proxy.types import Message, Messages
from proxy.upstream.client import Upstream
from proxy.upstream.errors import is_context_length_error
from proxy.upstream.routing import ResolvedModel

log = logging.getLogger("lcm_proxy.relay")

CONVERSATION_HEADER = "x-lcm-conversation-id"


class Services(Protocol):
    """What a turn needs of the running app (``proxy.wire.state.AppState`` is one)."""

    config: ProxyConfig
    engine: ContextEngine
    policy: ModelPolicy
    upstream: Upstream
    priority: Priority
    recall: RecallTools


Record = Callable[[Message | None], Awaitable[None]]  # None: the answer held nothing worth storing


@dataclass
class Call:
    """One request on its way through: who asked, for which model, and what the engine made of it."""

    state: Services
    scope: str  # the key's tenant, or an end user within it (``proxy.scopes.user_scope``)
    target: ResolvedModel
    body: dict[str, Any]  # as the client sent it
    conversation_key: str | None  # the client's own conversation key (X-LCM-Conversation-Id, a session id)
    asked_at: float  # when the request arrived: of several answers to one transcript, the latest asked stays
    gone: Callable[[], Awaitable[bool]] | None = None  # whether the client hung up (``Request.is_disconnected``)
    summarizer: UpstreamSummarizer | None = None
    budget: Budget | None = None
    dialect: Dialect = CHAT
    messages: Messages | None = None  # the transcript in ``dialect``; the body's ``messages`` when None
    recall_tools: bool | None = None  # whether the recall tools may be offered; the model's policy when None
    reserved: int = 0  # tokens the door adds to every request besides the transcript (kept instructions)
    continues: bool = False  # the client compacted its transcript itself (``ContextEngine.begin``)
    link_key: str | None = None  # a sub-agent's request: the key of the conversation that started it
    seen: Fingerprint | None = None  # the door's fingerprint of the transcript (``proxy.engine.seen``)

    @property
    def transcript(self) -> Messages:
        return self.messages if self.messages is not None else self.body["messages"]

    def plan(self) -> Budget:
        """The model's summariser and the request's budget (returned)."""
        self.summarizer = self.state.policy.summarizer_for(self.target)
        self.budget = self.fresh_budget()
        return self.budget

    def fresh_budget(self) -> Budget:
        """The request's budget as the model's policy gives it now (a refusal may have taught it a window)."""
        budget = self.state.policy.budget_for(self.target, self.body, self.recall_tools)
        return replace(budget, tools=budget.tools + self.reserved) if self.reserved else budget

    def offers_tools(self) -> bool:
        if self.recall_tools is not None:
            return self.recall_tools
        return self.state.policy.offers_recall_tools(self.target)

    async def prepare(self, headers: dict[str, str]) -> Prepared:
        """Plan, begin and finish the turn, its ``x-lcm-*`` figures put in ``headers`` (the conversation's id
        also when the request is refused as too long)."""
        budget = self.plan()
        try:
            prepared = await (await self.begin(budget)).finish()
        except ContextTooLong as error:
            if error.conversation_id is not None:
                headers[CONVERSATION_HEADER] = error.conversation_id
            raise
        prepared_headers(prepared, headers)
        return prepared

    async def begin(self, budget: Budget) -> Preparation:
        return await self.state.engine.begin(
            self.scope,
            self.transcript,
            budget,
            self.summarizer,
            conversation_key=self.conversation_key,
            model=self.body["model"],
            tools_offered=self.offers_tools(),
            dialect=self.dialect,
            continues=self.continues,
            link_key=self.link_key,
            seen=self.seen,
        )

    def after(self, prepared: Prepared | None) -> Callable[[], Awaitable[Any]] | None:
        """What the engine does once the response is sent: read the turn's messages for standing instructions,
        the compaction the request calls for."""
        engine, summarizer = self.state.engine, self.summarizer
        if prepared is None:
            return None
        if prepared.compaction not in ("scheduled", "deferred", "evicted") and not engine.unread(prepared):
            return None

        async def compact() -> None:
            await engine.after_response(prepared, summarizer)

        return compact

    def answer_to(self, prepared: Prepared | None) -> Record | None:
        """Where the relayed answer goes: the request's stored conversation (None when it has none)."""
        if prepared is None or prepared.conversation_id is None:
            return None
        engine, scope = self.state.engine, self.scope

        async def record(message: Message | None) -> None:
            if self.gone is not None and await self.gone():
                # Nobody received it: storing it would put an answer in the conversation that its client never
                # saw (the client's retry, or its next request, carries the one it did see).
                log.info("the answer of %s was not stored: the client hung up", prepared.conversation_id)
                return
            try:
                await engine.record_answer(scope, prepared, message, self.asked_at)
            except Exception as error:  # the client gets its answer anyway; its next request stores it
                log.warning(
                    "the relayed answer of %s was not stored: %s", prepared.conversation_id, type(error).__name__
                )

        return record


def prepared_headers(prepared: Prepared, headers: dict[str, str]) -> None:
    if prepared.conversation_id is not None:
        headers[CONVERSATION_HEADER] = prepared.conversation_id
    headers["x-lcm-tokens-sent"] = str(prepared.tokens_sent)
    headers["x-lcm-tokens-forwarded"] = str(prepared.tokens_forwarded)
    headers["x-lcm-compaction"] = prepared.compaction
    # What was actually sent: summaries, summaries and messages that did not fit, recalled excerpts.
    headers["x-lcm-summaries"] = str(len(prepared.sent.summaries))
    headers["x-lcm-evicted"] = str(len(prepared.sent.evicted) + prepared.sent.dropped)
    headers["x-lcm-recalled"] = str(len(prepared.sent.recalled))


CONTEXT_RETRY_SHARE = 0.75  # of what was refused, for the one retry when the refusal did not state the window


async def compacted_retry(call: Call, prepared: Prepared | None, error: UpstreamError) -> Prepared | None:
    """The upstream said the context is too long although it fit the proxy's count (a tokenizer that counts
    higher, a server started with a smaller window than configured): compact to a smaller budget and try once
    more. A refusal that stated the server's window taught it (``proxy.upstream.windows``): the retry, and every
    later request, is budgeted for that window. Otherwise the retry gets three quarters of what was refused.
    None when there is nothing to retry."""
    if prepared is None or prepared.conversation_id is None or call.budget is None:
        return None
    if not is_context_length_error(error):
        return None
    before = call.budget
    if error.deployment is not None:  # the server's count of what it refused, against the proxy's
        counted = prepared.tokens_forwarded + before.tools
        call.state.upstream.windows.learn_margin(error.deployment, error.message, counted)
    budget = call.fresh_budget()
    if budget.window >= before.window and budget.margin <= before.margin:
        # Three quarters of what the server refused, turned back into a window (never above the old one).
        refused = before.output_reserve + prepared.tokens_forwarded * before.margin + before.tools
        budget = replace(before, window=int(min(before.window, refused) * CONTEXT_RETRY_SHARE))
    log.warning(
        "the upstream of model %s refused %d tokens as too long for its context: compacting to a window of %d (%s), "
        "token margin %g, and retrying once",
        call.target.alias,
        prepared.tokens_forwarded,
        budget.window,
        budget.window_source if budget.window_source != before.window_source else "set model_info.max_input_tokens",
        budget.margin,
    )
    call.budget = budget
    try:
        return await (await call.begin(budget)).finish()
    except ContextTooLong:
        return None  # not even the newest message fits the smaller budget: the upstream's own error stands
