"""The recall-tool loop: the proxy runs ``lcm_*`` tool calls itself and the client sees one normal answer.

When the upstream answers with calls to recall tools only, the proxy executes them, appends the call and
its results to *its own* copy of the messages (never to the client's transcript, never to the store) and
asks again, up to ``max_tool_rounds`` rounds; the last round is offered only the client's own tools, so it
must answer. Calls to the client's tools are returned to the client as usual (recall calls mixed into the
same answer are dropped). Usage is summed over the rounds. Streaming relays text as it arrives, holds tool
call deltas and the finish chunk until the round's outcome is known, and never repeats what was sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from proxy.engine.recall import RECALL_TOOL_NAMES, RECALL_TOOLS, clip_to_tokens
from proxy.engine.tokens import count_message
from proxy.routing import ResolvedModel
from proxy.types import ChatBody, Chunk, JSONObject, Message
from proxy.upstream import Upstream

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


def _is_recall(call: dict[str, Any], client_names: set[str | None]) -> bool:
    name = tool_name(call)
    return name in RECALL_TOOL_NAMES and name not in client_names


def _add_usage(total: dict[str, Any], usage: dict[str, Any] | None) -> None:
    for key, value in (usage or {}).items():
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


ROOM_FLOOR = 200  # below this many free tokens, the next round is the final one (no more recall tools)
CALL_OVERHEAD = 24  # tokens of an appended assistant call / tool result message beyond its text
# Recall calls run per round. A prompt-injected model could ask for hundreds of expensive greps at once;
# calls past this many are answered with an error and not run.
MAX_CALLS_PER_ROUND = 8


class RecallLoop:
    def __init__(
        self, upstream: Upstream, target: ResolvedModel, run_tool: RunTool, max_rounds: int, room: int
    ) -> None:
        self.upstream = upstream
        self.target = target
        self.run_tool = run_tool
        self.max_rounds = max_rounds
        # Tokens still free in the budget after the assembled context: every round's additions come out of
        # it, so no round's request can exceed the budget (Bounded holds for the whole loop).
        self.room = room
        self.final_round = max_rounds - 1

    def _request(
        self, body: ChatBody, messages: list[Message], round_index: int, client_tools: list[Any] | None
    ) -> ChatBody:
        request = {**body, "messages": messages}
        if round_index >= self.final_round:
            request = without_recall_tools(request, client_tools)
        return request

    async def _append_round(
        self, messages: list[Message], content: str | None, calls: list[dict[str, Any]], round_index: int
    ) -> None:
        """Append the recall calls and their results, clipped to the room left; end the loop when full."""
        call_message: Message = {"role": "assistant", "content": content, "tool_calls": calls}
        self.room -= count_message(call_message) + CALL_OVERHEAD
        share = max(0, self.room // max(1, len(calls)) - CALL_OVERHEAD)
        results: list[Message] = []
        for position, call in enumerate(calls):
            fn = call.get("function") or {}
            if position >= MAX_CALLS_PER_ROUND:
                text = f"Error: at most {MAX_CALLS_PER_ROUND} recall calls run per round; this one was not run."
            elif share < 50:
                text = "Error: the context has no room left for more recall results; answer with what you have."
            else:
                text = clip_to_tokens(await self.run_tool(str(fn.get("name")), str(fn.get("arguments") or "{}")), share)
            result = {"role": "tool", "tool_call_id": call.get("id"), "content": text}
            self.room -= count_message(result) + CALL_OVERHEAD
            results.append(result)
        messages += [call_message, *results]
        if self.room < ROOM_FLOOR:
            self.final_round = min(self.final_round, round_index + 1)

    async def complete(self, body: ChatBody, client_tools: list[Any] | None) -> JSONObject:
        client_names = {tool_name(t) for t in client_tools or []}
        messages = list(body["messages"])
        usage: dict[str, Any] = {}
        earlier_text: list[str] = []  # text said before a recall call: streaming shows it, so this does too
        for round_index in range(self.max_rounds):
            result = await self.upstream.complete(self.target, self._request(body, messages, round_index, client_tools))
            _add_usage(usage, result.get("usage"))
            choices = result.get("choices") or []
            message = choices[0].get("message", {}) if len(choices) == 1 else {}
            calls = message.get("tool_calls") or []
            recall = [c for c in calls if _is_recall(c, client_names)]
            if recall and len(recall) == len(calls) and round_index < self.final_round:
                if isinstance(message.get("content"), str) and message["content"]:
                    earlier_text.append(message["content"])
                await self._append_round(messages, message.get("content"), recall, round_index)
                continue
            if earlier_text and message:
                message["content"] = "".join(earlier_text) + (message.get("content") or "")
            if recall:  # mixed with the client's calls, or out of rounds: the client never sees recall calls
                kept = [c for c in calls if not _is_recall(c, client_names)]
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
        self, stream: Any, body: ChatBody, messages: list[Message], client_tools: list[Any] | None, include_usage: bool
    ) -> AsyncIterator[Chunk]:
        try:
            async for chunk in self._rounds(stream, body, messages, client_tools, include_usage):
                yield chunk
        finally:
            await self._current.aclose()

    _current: Any

    async def _rounds(
        self, stream: Any, body: ChatBody, messages: list[Message], client_tools: list[Any] | None, include_usage: bool
    ) -> AsyncIterator[Chunk]:
        client_names = {tool_name(t) for t in client_tools or []}
        usage: dict[str, Any] = {}
        base: dict[str, Any] = {}  # id/object/created/model of the first answer chunk, reused for every round
        self._current = stream
        for round_index in range(self.max_rounds):
            calls: dict[int, dict[str, Any]] = {}
            call_deltas: dict[int, list[Chunk]] = {}
            finish: Chunk | None = None
            text: list[str] = []
            async for chunk in stream:
                choices = chunk.get("choices") or []
                if not choices:  # usage, or a provider's preamble (Azure's content-filter chunk has empty ids)
                    _add_usage(usage, chunk.get("usage"))
                    continue
                if not base:
                    base = {k: chunk[k] for k in ("id", "object", "created", "model") if chunk.get(k)}
                chunk = {**chunk, **base}
                choice = choices[0]
                delta = choice.get("delta") or {}
                if round_index > 0 and "role" in delta:  # one role delta per answer, not one per round
                    delta = {k: v for k, v in delta.items() if k != "role"}
                    choice = {**choice, "delta": delta}
                    chunk = {**chunk, "choices": [choice]}
                    if not delta and not choice.get("finish_reason"):
                        continue
                if delta.get("tool_calls"):
                    for tool_delta in delta["tool_calls"]:
                        index = int(tool_delta.get("index", 0))
                        entry = calls.setdefault(
                            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                        )
                        entry["id"] = tool_delta.get("id") or entry["id"]
                        fn = tool_delta.get("function") or {}
                        entry["function"]["name"] += fn.get("name") or ""
                        entry["function"]["arguments"] += fn.get("arguments") or ""
                        single = {
                            **chunk,
                            "choices": [{**choice, "delta": {"tool_calls": [tool_delta]}, "finish_reason": None}],
                        }
                        call_deltas.setdefault(index, []).append(single)
                    rest = {k: v for k, v in delta.items() if k != "tool_calls"}
                    if choice.get("finish_reason"):  # some providers finish in the same chunk as the last delta
                        finish = {**chunk, "choices": [{**choice, "delta": {}}]}
                    if not rest.get("content"):
                        continue
                    # The content of the same chunk goes on now; its finish (kept above) goes last.
                    delta, choice = rest, {**choice, "delta": rest, "finish_reason": None}
                    chunk = {**chunk, "choices": [choice]}
                if choice.get("finish_reason"):
                    finish = chunk
                    continue
                if isinstance(delta.get("content"), str):
                    text.append(delta["content"])
                yield chunk
            recall = [i for i, c in calls.items() if _is_recall(c, client_names)]
            if recall and len(recall) == len(calls) and round_index < self.final_round:
                recall_calls = [calls[i] for i in sorted(recall)]
                await self._append_round(messages, "".join(text) or None, recall_calls, round_index)
                stream = await self.upstream.open_stream(
                    self.target, self._request(body, messages, round_index + 1, client_tools)
                )
                self._current = stream
                continue
            kept = [i for i in sorted(calls) if i not in recall]
            for position, index in enumerate(kept):  # the client's own calls, renumbered without the recall ones
                for piece in call_deltas[index]:
                    tool_delta = {**piece["choices"][0]["delta"]["tool_calls"][0], "index": position}
                    yield {**piece, "choices": [{**piece["choices"][0], "delta": {"tool_calls": [tool_delta]}}]}
            if finish is not None:
                if recall and not kept:
                    finish = {**finish, "choices": [{**finish["choices"][0], "finish_reason": "stop"}]}
                yield finish
            if include_usage and usage:
                yield {**base, "choices": [], "usage": usage}
            return
