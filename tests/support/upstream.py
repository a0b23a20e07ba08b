"""An in-process upstream for the relay's tests (``proxy.relay.calls.ModelCalls``), the way httpx's
``MockTransport`` serves httpx's: scripted answers, every request recorded as sent, no socket. Tests of the
tool loop and the summariser use it where a real server would prove nothing more; the fake HTTP upstream
(``tests/support/fakes.py``) serves the tests that need LiteLLM and a socket."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from proxy.types import ChatBody, Chunk, JSONObject
from proxy.upstream.routing import ResolvedModel

Script = JSONObject | list[Chunk]  # an answer in full, or a streamed one


@dataclass
class Sent:
    target: ResolvedModel
    body: ChatBody  # a copy as sent: the tool loop's message list grows afterwards


class ScriptedStream:
    """One streamed answer: its chunks, then the end; closed exactly once."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.closed = 0

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed += 1


class ScriptedUpstream:
    """Answers calls in order from ``rounds``: for ``complete`` a JSON result, for ``open_stream`` a list of
    chunks."""

    def __init__(self, rounds: Iterable[Script]) -> None:
        self.rounds = list(rounds)
        self.sent: list[Sent] = []
        self.streams: list[ScriptedStream] = []

    @property
    def requests(self) -> list[ChatBody]:
        return [s.body for s in self.sent]

    def _next(self, target: ResolvedModel, body: ChatBody) -> Script:
        self.sent.append(Sent(target, copy.deepcopy(body)))
        if not self.rounds:
            raise AssertionError(f"unscripted call to {target.alias}: {body}")
        return self.rounds.pop(0)

    async def complete(self, target: ResolvedModel, body: ChatBody) -> JSONObject:
        answer = self._next(target, body)
        assert isinstance(answer, dict), "a streamed round was scripted for a call answered in full"
        return copy.deepcopy(answer)

    async def open_stream(self, target: ResolvedModel, body: ChatBody) -> ScriptedStream:
        chunks = self._next(target, body)
        assert isinstance(chunks, list), "a round answered in full was scripted for a streamed call"
        stream = ScriptedStream(chunks)
        self.streams.append(stream)
        return stream
