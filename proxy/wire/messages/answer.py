"""A Messages answer as the client receives it: the assistant message a stream adds up to (``Accumulator``,
which is what the conversation stores), and the proxy's own SSE events (``event``, ``ping``, ``error``).

A stream is read as Anthropic's SDKs read it: ``content_block_start`` opens block ``index``; ``text_delta``,
``thinking_delta`` and ``input_json_delta`` append to it; ``signature_delta`` replaces a thinking block's
signature; ``content_block_stop`` closes it (a tool's JSON input is parsed then); ``message_delta`` carries
the stop reason and the final usage.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from proxy.types import Message


def event(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data.get("type", "message")).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


PING = event({"type": "ping"})


class Accumulator:
    """The assistant message of a Messages stream, event by event; and the usage its events reported."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._pieces: dict[tuple[int, str], list[str]] = {}  # (block, field) -> its deltas, joined once at the end
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.complete = False

    def feed(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        index = data.get("index")
        if kind == "message_start":
            message = data.get("message") or {}
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_start" and isinstance(index, int):
            block = copy.deepcopy(data.get("content_block") or {})
            if block.get("type") in ("tool_use", "server_tool_use"):
                self._json[index] = []
            self.blocks[index] = block
        elif kind == "content_block_delta" and isinstance(index, int) and index in self.blocks:
            self._delta(self.blocks[index], index, data.get("delta") or {})
        elif kind == "content_block_stop" and isinstance(index, int) and index in self._json:
            raw = "".join(self._json.pop(index))
            try:
                self.blocks[index]["input"] = orjson.loads(raw) if raw.strip() else {}
            except orjson.JSONDecodeError:
                self.blocks[index]["input"] = {}
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            self.stop_reason = delta.get("stop_reason", self.stop_reason)
            self.usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.complete = True

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            self._piece(index, "text", block).append(str(delta.get("text", "")))
        elif kind == "thinking_delta":
            self._piece(index, "thinking", block).append(str(delta.get("thinking", "")))
        elif kind == "signature_delta":
            block["signature"] = str(delta.get("signature", ""))  # replaced, not appended
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "citations_delta" and "citation" in delta:
            block.setdefault("citations", []).append(delta["citation"])

    def _piece(self, index: int, field: str, block: dict[str, Any]) -> list[str]:
        """The deltas of ``field`` of block ``index``, after what its start held: appended, joined once."""
        key = (index, field)
        if key not in self._pieces:
            self._pieces[key] = [str(block.get(field, ""))]
        return self._pieces[key]

    def message(self) -> Message | None:
        """The assistant message to store (None when the stream gave nothing)."""
        for (index, field), pieces in self._pieces.items():
            self.blocks[index][field] = "".join(pieces)
        if not self.blocks:
            return None
        return {"role": "assistant", "content": [self.blocks[i] for i in sorted(self.blocks)]}


def answer_message(result: dict[str, Any]) -> Message | None:
    """The assistant message to store for a non-streamed answer: its content blocks, nothing else."""
    content = result.get("content")
    if not isinstance(content, list) or not content:
        return None
    return {"role": "assistant", "content": content}
