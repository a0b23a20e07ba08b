"""The recall-tool loop: the proxy runs ``lcm_*`` tool calls itself and the client sees one normal answer.

When the upstream answers with calls to recall tools only, the proxy executes them, appends the call and
its results to *its own* copy of the messages (never to the client's transcript, never to the store) and
asks again, up to ``max_tool_rounds`` rounds; the last round is offered only the client's own tools, so it
must answer. Calls to the client's tools are returned to the client as usual (recall calls mixed into the
same answer are dropped: a recall call never reaches the client; nor does a call to any other ``lcm_`` name
the client did not offer, which the proxy answers with an error). Usage is summed over the rounds.

Every round is read by one ``proxy.upstream.rounds.Round``, streamed or not, so both paths see the same calls and the
same text. Streaming relays text as it arrives (also text that shares a chunk with a tool call or the
finish), holds tool-call deltas and the finish until the round's outcome is known, and never repeats what
was sent.

No round's request exceeds the budget: the loop starts with ``room``, the tokens left after the assembled
context, and every appended call and result comes out of it. When even the calls with one-line results
would not fit, nothing is appended and the next round is the final one, asked again without recall tools.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from proxy.engine.recall import RECALL_TOOLS, clip_to_tokens
from proxy.relay.calls import ChunkStream, ModelCalls
from proxy.tokens import count_message, count_text
from proxy.types import ChatBody, Chunk, JSONObject, Message
from proxy.upstream.errors import describe_upstream
from proxy.upstream.rounds import Round
from proxy.upstream.routing import ResolvedModel

RunTool = Callable[[str, str], Awaitable[str]]


def tool_name(tool: Any) -> str | None:
    """The function name of a tool or a tool call; None for other kinds (``custom`` tools, odd shapes)."""
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def with_recall_tools(body: ChatBody) -> ChatBody:
    client_tools = body.get("tools") or []
    taken = {tool_name(t) for t in client_tools}
    extra = [t for t in RECALL_TOOLS if t["function"]["name"] not in taken]  # the client's own tool wins a clash
    return {**body, "tools": [*client_tools, *extra]}


def without_recall_tools(body: ChatBody, client_tools: list[Any] | None) -> ChatBody:
    out = dict(body)
    if client_tools:
        out["tools"] = client_tools
    else:
        out.pop("tools", None)
        out.pop("tool_choice", None)
        out.pop("parallel_tool_calls", None)
    return out


RECALL_PREFIX = "lcm_"  # every recall tool's name starts so (RECALL_TOOL_NAMES)


def _is_recall(call: dict[str, Any], client_names: set[str | None]) -> bool:
    """A call the proxy answers itself: to any ``lcm_`` name the client did not offer. Besides the recall tools
    that is a recall call garbled by a provider's stream shape ("lcm_greplcm_describe") or one the model made
    up; run, it answers the model with an error naming the tool. None of them ever reaches the client."""
    name = tool_name(call)
    return name is not None and name.startswith(RECALL_PREFIX) and name not in client_names


def _add_usage(total: dict[str, Any], usage: dict[str, Any] | None) -> None:
    for key, value in (usage or {}).items():
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


def _split(chunk: Chunk, base: dict[str, Any], round_index: int) -> tuple[Chunk | None, Chunk | None]:
    """What of a streamed chunk goes to the client now, and its finish, held until the round's outcome is
    known. Tool-call deltas are held by the ``Round``; everything else in the delta goes on at once."""
    choice = next((c for c in chunk["choices"] if c.get("index", 0) == 0), None)
    if choice is None:
        return None, None
    envelope = {**{k: v for k, v in chunk.items() if k not in ("choices", "usage")}, **base}
    delta = choice.get("delta") or {}
    # One role delta per answer, not one per round.
    rest = {k: v for k, v in delta.items() if k != "tool_calls" and not (k == "role" and round_index > 0)}
    reason = choice.get("finish_reason")
    if not reason and rest == delta:
        return {**envelope, "choices": [choice]}, None
    finish = {**envelope, "choices": [{**choice, "delta": {}}]} if reason else None
    if not any(value not in (None, "") for value in rest.values()):
        return None, finish
    if finish is not None:  # the relayed part carries the logprobs; the finish does not repeat them
        finish["choices"][0].pop("logprobs", None)
    return {**envelope, "choices": [{**choice, "delta": rest, "finish_reason": None}]}, finish


ROOM_FLOOR = 200  # below this many free tokens, the next round is the final one (no more recall tools)
CALL_OVERHEAD = 24  # tokens of an appended assistant call / tool result message beyond its text
MIN_RESULT = 50  # a recall result smaller than this many tokens is useless: the call is not run
CLIP_NOTE = 24  # tokens of the note clip_to_tokens appends to a clipped result
# Recall calls run per round. A prompt-injected model could ask for hundreds of expensive greps at once;
# calls past this many are answered with an error and not run.
MAX_CALLS_PER_ROUND = 8
NO_ROOM = "Error: the context has no room left for more recall results; answer with what you have."
CAPPED = f"Error: at most {MAX_CALLS_PER_ROUND} recall calls run per round; this one was not run."


def _result(call: dict[str, Any], text: str) -> Message:
    return {"role": "tool", "tool_call_id": call.get("id"), "content": text}


def _cost(message: Message) -> int:
    return count_message(message) + CALL_OVERHEAD


class RecallLoop:
    def __init__(
        self, upstream: ModelCalls, target: ResolvedModel, run_tool: RunTool, max_rounds: int, room: int
    ) -> None:
        self.upstream = upstream
        self.target = target
        self.run_tool = run_tool
        self.max_rounds = max_rounds
        # Tokens still free in the budget after the assembled context: every round's additions come out of
        # it, so no round's request can exceed the budget (Bounded holds for the whole loop).
        self.room = room
        self.final_round = max_rounds - 1
        self.source = describe_upstream(target)  # names the upstream in errors about its answers

    def _request(
        self, body: ChatBody, messages: list[Message], round_index: int, client_tools: list[Any] | None
    ) -> ChatBody:
        request = {**body, "messages": messages}
        if round_index >= self.final_round:
            request = without_recall_tools(request, client_tools)
        return request

    async def _append_round(
        self, messages: list[Message], content: str | None, calls: list[dict[str, Any]], round_index: int
    ) -> bool:
        """Append the recall calls and their results, within the room left. False, with nothing appended and
        the next round made the final one, when not even the calls with one-line results fit."""
        call_message: Message = {"role": "assistant", "content": content, "tool_calls": calls}
        results = [_result(c, CAPPED if i >= MAX_CALLS_PER_ROUND else NO_ROOM) for i, c in enumerate(calls)]
        floor = _cost(call_message) + sum(_cost(r) for r in results)
        if floor > self.room:
            self.final_round = min(self.final_round, round_index + 1)
            return False
        running = calls[:MAX_CALLS_PER_ROUND]
        # Each result may grow past its one-line stand-in by an equal share of what the floor leaves free.
        share = (self.room - floor) // len(running)
        if share >= MIN_RESULT:
            allowance = share + count_text(NO_ROOM)
            for position, call in enumerate(running):
                fn = call["function"]
                text = clip_to_tokens(await self.run_tool(fn["name"], fn["arguments"] or "{}"), allowance - CLIP_NOTE)
                if count_text(text) <= allowance:
                    results[position] = _result(call, text)
        self.room -= _cost(call_message) + sum(_cost(r) for r in results)
        messages += [call_message, *results]
        if self.room < ROOM_FLOOR:
            self.final_round = min(self.final_round, round_index + 1)
        return True

    async def complete(self, body: ChatBody, client_tools: list[Any] | None) -> JSONObject:
        client_names = {tool_name(t) for t in client_tools or []}
        messages = list(body["messages"])
        usage: dict[str, Any] = {}
        earlier_text: list[str] = []  # text said before a recall call: streaming shows it, so this does too
        for round_index in range(self.max_rounds):
            result = await self.upstream.complete(self.target, self._request(body, messages, round_index, client_tools))
            answer = Round.from_response(result, self.source)
            _add_usage(usage, answer.usage)
            calls = answer.calls
            recall = [c for c in calls if _is_recall(c, client_names)]
            if recall and len(recall) == len(calls) and round_index < self.final_round:
                if answer.text:
                    earlier_text.append(answer.text)
                await self._append_round(messages, answer.text or None, calls, round_index)
                continue
            choices = result.get("choices") or []
            message = choices[0]["message"] if choices else None  # checked by Round.from_response
            if message is not None and earlier_text:
                message["content"] = "".join(earlier_text) + (message.get("content") or "")
            if message is not None and recall:  # mixed with the client's calls, or out of rounds
                kept = [c for c in message.get("tool_calls") or [] if not _is_recall(c, client_names)]
                if kept:
                    message["tool_calls"] = kept
                else:
                    message.pop("tool_calls", None)
                    choices[0]["finish_reason"] = "stop"
            if usage:
                result["usage"] = usage
            return result
        raise AssertionError("unreachable: the last round has no recall tools")

    async def open_stream(
        self, body: ChatBody, client_tools: list[Any] | None, include_usage: bool
    ) -> AsyncIterator[Chunk]:
        """Open the first round now (so early failures become HTTP errors) and return the relay."""
        messages = list(body["messages"])
        first = await self.upstream.open_stream(self.target, self._request(body, messages, 0, client_tools))
        return self._relay(first, body, messages, client_tools, include_usage)

    async def _relay(
        self,
        stream: ChunkStream,
        body: ChatBody,
        messages: list[Message],
        client_tools: list[Any] | None,
        include_usage: bool,
    ) -> AsyncIterator[Chunk]:
        try:
            async for chunk in self._rounds(stream, body, messages, client_tools, include_usage):
                yield chunk
        finally:
            await self._current.aclose()

    _current: ChunkStream

    async def _rounds(
        self,
        stream: ChunkStream,
        body: ChatBody,
        messages: list[Message],
        client_tools: list[Any] | None,
        include_usage: bool,
    ) -> AsyncIterator[Chunk]:
        client_names = {tool_name(t) for t in client_tools or []}
        usage: dict[str, Any] = {}
        base: dict[str, Any] = {}  # id/object/created/model of the first answer chunk, reused for every round
        self._current = stream
        for round_index in range(self.max_rounds):
            answer = Round(self.source)
            finish: Chunk | None = None
            async for chunk in stream:
                answer.add(chunk)  # checks the chunk: a malformed one ends the stream as upstream_bad_stream
                if not chunk.get("choices"):  # usage, or a provider's preamble (Azure's has empty ids)
                    continue
                if not base:
                    base = {k: chunk[k] for k in ("id", "object", "created", "model") if chunk.get(k)}
                now, held = _split(chunk, base, round_index)
                finish = held or finish
                if now is not None:
                    yield now
            answer.end()  # a call without a name ends the stream as upstream_bad_stream, never relayed
            _add_usage(usage, answer.usage)
            calls = answer.calls
            recall = [i for i, c in enumerate(calls) if _is_recall(c, client_names)]
            if recall and len(recall) == len(calls) and round_index < self.final_round:
                await self._append_round(messages, answer.text or None, calls, round_index)
                stream = await self.upstream.open_stream(
                    self.target, self._request(body, messages, round_index + 1, client_tools)
                )
                self._current = stream
                continue
            kept = [i for i in range(len(calls)) if i not in recall]
            for position, index in enumerate(kept):  # the client's own calls, renumbered without the recall ones
                for piece in answer.call_deltas(index):
                    delta = {"tool_calls": [{**piece, "index": position}]}
                    yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            if finish is not None:
                if recall and not kept:
                    finish = {**finish, "choices": [{**finish["choices"][0], "finish_reason": "stop"}]}
                yield finish
            if include_usage and usage:
                yield {**base, "choices": [], "usage": usage}
            return
