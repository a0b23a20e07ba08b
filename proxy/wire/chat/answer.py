"""The answer on its way to the client: relayed chunk by chunk as SSE (``relay_sse``, ``streaming``), and kept
(``Answer``) as the conversation's newest message before the response ends."""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask

from proxy.errors import InternalError
from proxy.types import Chunk, Message
from proxy.upstream.rounds import DEFAULT_SOURCE, Round
from proxy.wire.http import REPORTED, to_proxy_error
from proxy.wire.sse import DONE, sse_event
from proxy.wire.streaming import ClosingStream, aclose_iterator

log = logging.getLogger("lcm_proxy.wire")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Answer:
    """The answer the client received, once complete, handed to ``record`` (which stores it as the
    conversation's newest message) before the response ends: once a client has its answer, so has the store."""

    def __init__(self, record: Callable[[Any], Awaitable[None]] | None = None) -> None:
        self.record = record
        self.message: Any = None

    async def keep(self, message: Any) -> None:
        self.message = message
        if self.record is not None:
            await self.record(message)

    async def keep_result(self, result: dict[str, Any]) -> None:
        """A non-streamed answer: kept when it has exactly one choice (with several there is no one answer)."""
        choices = result.get("choices")
        if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
            await self.keep(choices[0].get("message"))


def streaming(
    chunks: AsyncIterator[bytes], headers: dict[str, str], background: BackgroundTask | None, leave: Callable[[], None]
) -> ClosingStream:
    response = ClosingStream(
        chunks, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}, background=background
    )
    # The relay ends the request's turn when it finishes; should it never start (the client left before the
    # first byte), the response's collection does.
    weakref.finalize(response, leave)
    return response


async def relay_sse(
    stream: AsyncIterable[Chunk],
    on_delta: Callable[[Any], None] | None = None,
    leave: Callable[[], None] | None = None,
    answer: Answer | None = None,
    source: str = DEFAULT_SOURCE,
) -> AsyncIterator[bytes]:
    """Relay chunks as SSE. After the first byte the status is sent, so errors become an error event.
    ``on_delta`` sees each choice's delta (to learn which models make structured tool calls); ``leave`` runs
    when the stream is over, however it ends; ``answer`` keeps what the client received when the stream
    reached its end, before ``[DONE]``. Every chunk is read as the recall loop reads it (``source`` names the
    upstream): an answer the ``Round`` finds malformed (two calls under one id, a call without a name) ends
    with ``upstream_bad_stream`` in place of the chunk that showed it, as it is a 502 when not streamed.
    Closed before its end (the client left: ``proxy.wire.streaming``), it closes ``stream`` at once."""
    collected = Round(source)
    chunks = aiter(stream)
    try:
        async for chunk in chunks:
            if on_delta is not None:
                for choice in chunk.get("choices") or []:
                    on_delta(choice.get("delta") if isinstance(choice, dict) else None)
            collected.add(chunk)
            yield sse_event(chunk)
    except REPORTED as error:
        yield sse_event(to_proxy_error(error).to_json())
        return
    except Exception:
        log.exception("unexpected error while streaming")
        yield sse_event(InternalError("Internal error in lcm-proxy while streaming.").to_json())
        return
    finally:
        if leave is not None:
            leave()
        await aclose_iterator(chunks)
    if answer is not None and collected.finish_reason is not None:
        await answer.keep(collected.message())
    yield DONE


def answer_message(message: Any) -> Message | None:
    """The chat assistant message to store for the chat response the client received (None: nothing worth
    storing): its text, tool calls and refusal, none of the response's other fields."""
    if not isinstance(message, dict):
        return None
    out: Message = {"role": "assistant", "content": None}
    content = message.get("content")
    if isinstance(content, str) and content:
        out["content"] = content
    calls = [
        {"id": c.get("id"), "type": c.get("type") or "function", "function": c["function"]}
        for c in message.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]
    if calls:
        out["tool_calls"] = calls
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        out["refusal"] = message["refusal"]
    if out["content"] is None and len(out) == 2:
        return None
    return out
