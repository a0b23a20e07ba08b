"""The recall-tool loop in Anthropic's tool format, for a Messages request to an Anthropic deployment: the
proxy offers ``lcm_*`` tools beside the client's, runs the model's calls to them itself, and the client sees one
ordinary answer (``proxy.relay.toolloop`` is the same loop for Chat Completions, which translated requests use).

A round asks the upstream with the client's tools and the recall tools; when its only calls are recall calls (and
it is not the last round, which is offered the client's tools only), the round's assistant message and a user
message with the results are appended to the proxy's own copy of the messages, never to the client's transcript,
and the next round is asked. Results are clipped by ``run_tool``; when the calls with their results would not fit
the tokens left (``room``), the next round is the last one.

Streamed, the rounds are one message to the client: the first round's ``message_start``, every round's text and
client tool calls as they arrive (block indexes renumbered across rounds), the recall calls held back, later
rounds' thinking blocks held back too (they are bound to a prefix the client never sees), and one
``message_delta`` / ``message_stop`` at the end with the rounds' usage summed.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from proxy.engine.recall import RECALL_TOOLS
from proxy.relay.turn import Services
from proxy.tokens import count_text
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.translate import sse_bytes

RunTool = Callable[[str, str], Awaitable[str]]
PREFIX = "lcm_"
THINKING = ("thinking", "redacted_thinking")


def anthropic_recall_tools(client_tools: list[Any] | None) -> list[dict[str, Any]]:
    """The recall tools in Anthropic's shape, those the client's own tools do not already name."""
    taken = {t.get("name") for t in client_tools or [] if isinstance(t, dict)}
    tools = []
    for tool in RECALL_TOOLS:
        function = tool["function"]
        if function["name"] not in taken:
            tools.append(
                {
                    "name": function["name"],
                    "description": function["description"],
                    "input_schema": function["parameters"],
                }
            )
    return tools


class MessagesRecallLoop:
    def __init__(
        self,
        state: Services,
        target: ResolvedModel,
        headers: dict[str, str],
        run_tool: RunTool,
        max_rounds: int,
        room: int,
    ) -> None:
        self.state, self.target, self.headers = state, target, headers
        self.run_tool = run_tool
        self.max_rounds = max_rounds
        self.room = room

    def _is_recall(self, block: dict[str, Any], client_names: set[Any]) -> bool:
        name = block.get("name")
        return (
            block.get("type") == "tool_use"
            and isinstance(name, str)
            and name.startswith(PREFIX)
            and name not in client_names
        )

    def _request(self, body: dict[str, Any], messages: list[dict[str, Any]], final: bool) -> dict[str, Any]:
        client_tools = body.get("tools") or []
        tools = list(client_tools) if final else [*client_tools, *anthropic_recall_tools(client_tools)]
        out = {**body, "messages": messages}
        if tools:
            out["tools"] = tools
        else:
            out.pop("tools", None)
            out.pop("tool_choice", None)
        return out

    async def _results(self, calls: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The user message answering ``calls``, or None when it would not fit the room left."""
        blocks = []
        for call in calls:
            text = await self.run_tool(str(call.get("name")), orjson.dumps(call.get("input") or {}).decode())
            blocks.append({"type": "tool_result", "tool_use_id": call.get("id"), "content": text})
        cost = count_text(orjson.dumps(blocks).decode()) + count_text(orjson.dumps(calls).decode())
        if cost > self.room:
            return None
        self.room -= cost
        return {"role": "user", "content": blocks}

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        client_names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        messages = list(body["messages"])
        usage: dict[str, int] = {}
        earlier: list[dict[str, Any]] = []
        final = self.max_rounds <= 1
        for round_index in range(self.max_rounds):
            result = await self.state.upstream.messages(self.target, self._request(body, messages, final), self.headers)
            _add(usage, result.get("usage"))
            content = [b for b in result.get("content") or [] if isinstance(b, dict)]
            calls = [b for b in content if b.get("type") == "tool_use"]
            recall = [b for b in calls if self._is_recall(b, client_names)]
            if recall and len(recall) == len(calls) and not final:
                answer = await self._results(recall)
                if answer is not None:
                    messages += [{"role": "assistant", "content": content}, answer]
                    earlier += [b for b in content if b.get("type") == "text" and b.get("text")]
                final = final or round_index + 2 >= self.max_rounds or answer is None
                continue
            kept = [b for b in content if not self._is_recall(b, client_names)]
            if round_index > 0:
                kept = [b for b in kept if b.get("type") not in THINKING]
            out = {**result, "content": [*earlier, *kept], "usage": {**(result.get("usage") or {}), **usage}}
            if recall and not any(b.get("type") == "tool_use" for b in kept):
                out["stop_reason"] = "end_turn"
            return out
        raise AssertionError("the last round is always final")  # pragma: no cover

    async def open_stream(self, body: dict[str, Any]) -> tuple[AsyncIterator[tuple[bytes, dict[str, Any]]], Any]:
        """Open the first round (early failures raise here) and return the relay and its closer."""
        client_names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        final = self.max_rounds <= 1
        stream = await self.state.upstream.open_messages_stream(
            self.target, self._request(body, body["messages"], final), self.headers
        )
        current = {"stream": stream}

        async def close() -> None:
            await current["stream"].aclose()

        return self._rounds(body, client_names, current, final), close

    async def _rounds(
        self, body: dict[str, Any], client_names: set[Any], current: dict[str, Any], final: bool
    ) -> AsyncIterator[tuple[bytes, dict[str, Any]]]:
        messages = list(body["messages"])
        usage: dict[str, int] = {}
        index = 0  # the next block index the client sees
        for round_index in range(self.max_rounds):
            stream = current["stream"]
            blocks: dict[int, dict[str, Any]] = {}
            partial: dict[int, str] = {}
            held: set[int] = set()
            shown: dict[int, int] = {}
            closing: dict[str, Any] | None = None
            async for item in stream:
                data = item.data
                kind, at = data.get("type"), data.get("index")
                if kind == "message_start":
                    _add(usage, (data.get("message") or {}).get("usage"))
                    if round_index == 0:
                        yield item.raw, data
                    continue
                if kind == "content_block_start" and isinstance(at, int):
                    block = copy.deepcopy(data.get("content_block") or {})
                    blocks[at] = block
                    if block.get("type") == "tool_use":
                        partial[at] = ""
                    hide = self._is_recall(block, client_names) or (round_index > 0 and block.get("type") in THINKING)
                    if hide:
                        held.add(at)
                        continue
                    shown[at] = index
                    index += 1
                elif kind == "content_block_delta" and isinstance(at, int):
                    delta = data.get("delta") or {}
                    if delta.get("type") == "input_json_delta":
                        partial[at] = partial.get(at, "") + str(delta.get("partial_json", ""))
                    elif at in blocks:
                        _apply(blocks[at], delta)
                elif kind == "message_delta":
                    closing = data
                    _add(usage, data.get("usage"))
                    continue
                elif kind == "message_stop":
                    break
                if isinstance(at, int) and kind and kind.startswith("content_block"):
                    if at in held:
                        continue
                    data = {**data, "index": shown.get(at, at)}
                    yield sse_bytes(data), data
                    continue
                yield item.raw, data  # ping, error, and types to come
            for at, raw in partial.items():
                try:
                    blocks[at]["input"] = orjson.loads(raw) if raw.strip() else {}
                except orjson.JSONDecodeError:
                    blocks[at]["input"] = {}
            content = [blocks[i] for i in sorted(blocks)]
            calls = [b for b in content if b.get("type") == "tool_use"]
            recall = [b for b in calls if self._is_recall(b, client_names)]
            if recall and len(recall) == len(calls) and not final:
                answer = await self._results(recall)
                if answer is not None:
                    messages += [{"role": "assistant", "content": content}, answer]
                final = final or round_index + 2 >= self.max_rounds or answer is None
                await stream.aclose()
                current["stream"] = await self.state.upstream.open_messages_stream(
                    self.target, self._request(body, messages, final), self.headers
                )
                continue
            closing = dict(
                closing or {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
            )
            if recall and not any(b.get("type") == "tool_use" for b in calls if not self._is_recall(b, client_names)):
                closing["delta"] = {**(closing.get("delta") or {}), "stop_reason": "end_turn"}
            closing["usage"] = {**(closing.get("usage") or {}), **usage}
            yield sse_bytes(closing), closing
            stop = {"type": "message_stop"}
            yield sse_bytes(stop), stop
            return


def _apply(block: dict[str, Any], delta: dict[str, Any]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = str(delta.get("signature", ""))


def _add(total: dict[str, int], usage: Any) -> None:
    for key, value in (usage or {}).items() if isinstance(usage, dict) else ():
        if isinstance(value, int) and key != "output_tokens":
            total[key] = (
                max(total.get(key, 0), value) if key.startswith(("input", "cache")) else total.get(key, 0) + value
            )
        elif isinstance(value, int):
            total[key] = total.get(key, 0) + value
