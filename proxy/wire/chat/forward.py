"""One chat request's upstream call (``forward``): the answer relayed as the client asked for it, with the
recall-tool loop when offered. The turn around it (budget, preparation, recorded answer, compacted retry) is
``proxy.relay.turn``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response

from proxy.engine.engine import Prepared
from proxy.engine.recall import clip_to_tokens
from proxy.relay import unoffered
from proxy.relay.toolloop import RecallLoop, tool_name, with_recall_tools
from proxy.relay.turn import Call
from proxy.types import ChatBody
from proxy.upstream.errors import describe_upstream
from proxy.wire.chat.answer import Answer, answer_message, relay_sse, streaming
from proxy.wire.http import JSONResponse


def _answer(call: Call, prepared: Prepared | None, body: ChatBody) -> Answer | None:
    """Where the relayed answer goes: the request's stored conversation, when there is one answer."""
    record = call.answer_to(prepared) if body.get("n") in (None, 1) else None
    if record is None:
        return None

    async def keep(message: Any) -> None:
        await record(answer_message(message))

    return Answer(keep)


def _client_names(body: ChatBody) -> set[str | None]:
    return {tool_name(t) for t in body.get("tools") or []}


def _after(call: Call, prepared: Prepared | None) -> BackgroundTask | None:
    compact = call.after(prepared)
    return BackgroundTask(compact) if compact is not None else None


async def forward(call: Call, prepared: Prepared | None, headers: dict[str, str]) -> Response:
    """Send the request upstream (with the recall loop when offered). From here the upstream is busy with a
    user's request: background summaries there give way to it until the answer is done."""
    state, target = call.state, call.target
    body = call.body
    if prepared is not None and prepared.messages is not body["messages"]:
        body = {**body, "messages": prepared.messages}
    single = body.get("n") in (None, 1)
    answer = _answer(call, prepared, body)
    background = _after(call, prepared)
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
                unoffered.chat_stream(aiter(stream), _client_names(body), describe_upstream(target)),
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
        result = unoffered.chat_result(result, _client_names(body))
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
