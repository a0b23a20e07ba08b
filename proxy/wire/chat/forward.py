"""One chat request on its way upstream (``Call``): the budget and summariser its model's policy gives it,
the engine's preparation of its messages, the upstream call with the recall-tool loop when offered, and the
one compacted retry when the upstream refuses a context the proxy's count said would fit."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starlette.background import BackgroundTask
from starlette.responses import Response

from proxy.engine.engine import Budget, Preparation, Prepared
from proxy.engine.errors import ContextTooLong
from proxy.engine.recall import clip_to_tokens
from proxy.errors import UpstreamError
from proxy.relay.summarizer import UpstreamSummarizer
from proxy.relay.toolloop import RecallLoop, with_recall_tools
from proxy.types import ChatBody
from proxy.upstream.errors import describe_upstream, is_context_length_error
from proxy.upstream.routing import ResolvedModel
from proxy.wire.chat.answer import Answer, answer_message, relay_sse, streaming
from proxy.wire.http import JSONResponse

if TYPE_CHECKING:
    from proxy.wire.state import AppState

log = logging.getLogger("lcm_proxy.wire")

CONVERSATION_HEADER = "x-lcm-conversation-id"


@dataclass
class Call:
    """One chat request on its way through: who asked, for which model, and what the engine made of it."""

    state: AppState
    scope: str  # the key's tenant, or an end user within it (``proxy.scopes.user_scope``)
    target: ResolvedModel
    body: ChatBody  # as the client sent it
    conversation_key: str | None  # X-LCM-Conversation-Id, when the client sends one
    asked_at: float  # when the request arrived: of several answers to one transcript, the latest asked stays
    gone: Callable[[], Awaitable[bool]] | None = None  # whether the client hung up (``Request.is_disconnected``)
    summarizer: UpstreamSummarizer | None = None
    budget: Budget | None = None

    async def begin(self, budget: Budget) -> Preparation:
        return await self.state.engine.begin(
            self.scope,
            self.body["messages"],
            budget,
            self.summarizer,
            conversation_key=self.conversation_key,
            model=self.body["model"],
            tools_offered=self.state.policy.offers_recall_tools(self.target),
        )

    def after(self, prepared: Prepared | None) -> BackgroundTask | None:
        """The compaction the request calls for, once its response is sent."""
        if prepared is None or prepared.compaction not in ("scheduled", "deferred"):
            return None
        return BackgroundTask(self.state.engine.after_response, prepared, self.summarizer)

    def answer(self, prepared: Prepared | None, body: ChatBody) -> Answer | None:
        """Where the relayed answer goes: the request's stored conversation, when there is one answer."""
        if prepared is None or prepared.conversation_id is None or body.get("n") not in (None, 1):
            return None
        engine, scope = self.state.engine, self.scope

        async def record(message: Any) -> None:
            if self.gone is not None and await self.gone():
                # Nobody received it: storing it would put an answer in the conversation that its client never
                # saw (the client's retry, or its next request, carries the one it did see).
                log.info("the answer of %s was not stored: the client hung up", prepared.conversation_id)
                return
            try:
                await engine.record_answer(scope, prepared, answer_message(message), self.asked_at)
            except Exception as error:  # the client gets its answer anyway; its next request stores it
                log.warning(
                    "the relayed answer of %s was not stored: %s", prepared.conversation_id, type(error).__name__
                )

        return Answer(record)


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
    more. A refusal that stated the server's window taught it (``proxy.upstream.windows``): the retry, and every later
    request, is budgeted for that window. Otherwise the retry gets three quarters of what was refused. None
    when there is nothing to retry."""
    if prepared is None or prepared.conversation_id is None or call.budget is None:
        return None
    if not is_context_length_error(error):
        return None
    before = call.budget
    if error.deployment is not None:  # the server's count of what it refused, against the proxy's
        counted = prepared.tokens_forwarded + before.tools
        call.state.upstream.windows.learn_margin(error.deployment, error.message, counted)
    budget = call.state.policy.budget_for(call.target, call.body)
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


async def forward(call: Call, prepared: Prepared | None, headers: dict[str, str]) -> Response:
    """Send the request upstream (with the recall loop when offered). From here the upstream is busy with a
    user's request: background summaries there give way to it until the answer is done."""
    state, target = call.state, call.target
    body = call.body
    if prepared is not None and prepared.messages is not body["messages"]:
        body = {**body, "messages": prepared.messages}
    single = body.get("n") in (None, 1)
    answer = call.answer(prepared, body)
    background = call.after(prepared)
    leave = state.priority.enter(state.priority.key(target))
    try:
        # The recall loop answers for one choice: with n > 1 each choice could call tools of its own, so such
        # requests are forwarded without the recall tools.
        recall = prepared is not None and prepared.recall and prepared.conversation_id is not None
        if recall and call.summarizer is not None and single:
            assert prepared is not None
            return await _with_recall(call, prepared, body, headers, background, leave, answer)
        if body.get("stream"):
            # Open the upstream stream before answering, so that an early upstream failure becomes a real
            # HTTP status instead of an error event inside a 200.
            stream = await state.upstream.open_stream(target, body)
            relay = relay_sse(
                stream,
                lambda delta: state.policy.learn_tool_calls(target, delta),
                leave,
                answer,
                describe_upstream(target),
            )
            return streaming(relay, headers, background, leave)
        try:
            result = await state.upstream.complete(target, body)
        finally:
            leave()
        for choice in result.get("choices") or []:
            state.policy.learn_tool_calls(target, choice.get("message") if isinstance(choice, dict) else None)
        if answer is not None:
            await answer.keep_result(result)
        return JSONResponse(result, headers=headers, background=background)
    except BaseException:
        leave()
        raise


async def _with_recall(
    call: Call,
    prepared: Prepared,
    body: ChatBody,
    headers: dict[str, str],
    background: BackgroundTask | None,
    leave: Callable[[], None],
    answer: Answer | None,
) -> Response:
    """Offer the recall tools and run the tool loop (the client sees one ordinary answer)."""
    state, target = call.state, call.target
    assert prepared.conversation_id is not None and call.summarizer is not None
    summarizer = call.summarizer
    window = state.policy.budget_for(target, body)
    result_cap = max(500, (window.window - window.output_reserve) // 4)  # a tool result never floods the window
    # The request's own length bounds what it may recall: a re-send of an earlier point sees no more than it sent.
    scope = await state.recall.scope(call.scope, prepared.conversation_id, prepared.transcript_length)

    async def run_tool(name: str, arguments: str) -> str:
        return clip_to_tokens(await state.recall.run(scope, name, arguments, summarizer), result_cap)

    client_tools = body.get("tools")
    loop = RecallLoop(state.upstream, target, run_tool, state.config.lcm_settings.max_tool_rounds, prepared.room)
    offered = with_recall_tools(body)
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = await loop.open_stream(offered, client_tools, include_usage)
        relay = relay_sse(chunks, None, leave, answer, describe_upstream(target))
        return streaming(relay, headers, background, leave)
    try:
        result = await loop.complete(offered, client_tools)
    finally:
        leave()
    if answer is not None:
        await answer.keep_result(result)
    return JSONResponse(result, headers=headers, background=background)
