"""Calls to tools the proxy did not offer: a model that makes up an ``lcm_`` name (or calls a recall tool it
was not given this request) gets neither the call run nor passed on. The client offered no such tool, so a call
to it would break the client's loop; it never reaches the client, in any door, streamed or not.

Chat: the calls are dropped from a whole answer (``chat_message``) or from a stream (``chat_stream``: a call is
known by its first delta, which names it; later deltas of its index are dropped, the others renumbered), and a
``tool_calls`` finish with no call left becomes ``stop``. Messages: ``tool_use`` blocks are dropped likewise
(``messages_answer``, ``MessagesFilter`` for a stream's events, whose block indexes are renumbered).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from proxy.types import Chunk
from proxy.upstream.rounds import Round

PREFIX = "lcm_"


def unoffered(name: Any, client_names: Iterable[str | None]) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX) and name not in set(client_names)


def chat_message(message: dict[str, Any], client_names: set[str | None]) -> tuple[dict[str, Any], bool]:
    """``message`` without its unoffered calls, and whether any was dropped."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message, False
    kept = [c for c in calls if not unoffered(((c or {}).get("function") or {}).get("name"), client_names)]
    if len(kept) == len(calls):
        return message, False
    out = {**message, "tool_calls": kept} if kept else {k: v for k, v in message.items() if k != "tool_calls"}
    return out, True


def chat_result(result: dict[str, Any], client_names: set[str | None]) -> dict[str, Any]:
    choices = []
    for choice in result.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict):
            message, dropped = chat_message(message, client_names)
            choice = {**choice, "message": message}
            if dropped and not message.get("tool_calls") and choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
        choices.append(choice)
    return {**result, "choices": choices} if choices else result


async def chat_stream(
    chunks: AsyncIterator[Chunk], client_names: set[str | None], source: str | None = None
) -> AsyncGenerator[Chunk, None]:
    """``chunks`` without the unoffered calls. With ``source`` (the upstream's name) every chunk is first read as
    the recall loop reads it (``proxy.upstream.rounds.Round``): a malformed answer (two calls under one id) still
    ends as ``upstream_bad_stream``, whatever the calls' names."""
    check = Round(source) if source is not None else None
    try:
        async for chunk in _chat_stream(_checked(chunks, check), client_names):
            yield chunk
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


async def _checked(chunks: AsyncIterator[Chunk], check: Round | None) -> AsyncIterator[Chunk]:
    async for chunk in chunks:
        if check is not None:
            check.add(chunk)
        yield chunk


async def _chat_stream(chunks: AsyncIterator[Chunk], client_names: set[str | None]) -> AsyncIterator[Chunk]:
    dropped: set[int] = set()
    kept: dict[int, int] = {}
    async for chunk in chunks:
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            yield chunk
            continue
        choice: dict[str, Any] = choices[0]
        raw = choice.get("delta")
        delta: dict[str, Any] = raw if isinstance(raw, dict) else {}
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            out = []
            for position, call in enumerate(calls):
                index = call.get("index", position) if isinstance(call, dict) else position
                name = ((call or {}).get("function") or {}).get("name") if isinstance(call, dict) else None
                if index not in kept and index not in dropped:
                    if unoffered(name, client_names):
                        dropped.add(index)
                    else:
                        kept[index] = len(kept)
                if index in kept:
                    out.append({**call, "index": kept[index]})
            delta = {**delta, "tool_calls": out} if out else {k: v for k, v in delta.items() if k != "tool_calls"}
            choice = {**choice, "delta": delta}
        if choice.get("finish_reason") == "tool_calls" and dropped and not kept:
            choice = {**choice, "finish_reason": "stop"}
        yield {**chunk, "choices": [choice, *choices[1:]]}


def messages_answer(result: dict[str, Any], client_names: set[str | None]) -> dict[str, Any]:
    """A whole Messages answer without its ``tool_use`` blocks of unoffered tools."""
    content = result.get("content")
    if not isinstance(content, list):
        return result
    kept = [b for b in content if not (isinstance(b, dict) and _unoffered_use(b, client_names))]
    if len(kept) == len(content):
        return result
    out = {**result, "content": kept}
    if out.get("stop_reason") == "tool_use" and not any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in kept
    ):
        out["stop_reason"] = "end_turn"
    return out


def _unoffered_use(block: dict[str, Any], client_names: set[str | None]) -> bool:
    return block.get("type") == "tool_use" and unoffered(block.get("name"), client_names)


class MessagesFilter:
    """A Messages stream's events without the blocks of unoffered tools; the other blocks renumbered. Returns
    the event to send (itself when unchanged), or None to send nothing."""

    def __init__(self, client_names: set[str | None]) -> None:
        self.client_names = client_names
        self.dropped: set[int] = set()
        self.uses = 0  # tool_use blocks kept

    def __call__(self, data: dict[str, Any]) -> dict[str, Any] | None:
        kind, index = data.get("type"), data.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            block = data.get("content_block")
            if isinstance(block, dict) and _unoffered_use(block, self.client_names):
                self.dropped.add(index)
                return None
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self.uses += 1
        if isinstance(index, int) and kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            if index in self.dropped:
                return None
            shift = sum(1 for d in self.dropped if d < index)
            return {**data, "index": index - shift} if shift else data
        if kind == "message_delta" and self.dropped and not self.uses:
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
                return {**data, "delta": {**delta, "stop_reason": "end_turn"}}
        return data
