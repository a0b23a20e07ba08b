"""What the relay asks of the upstream: a completion, and a streamed one. The tool loop and the summariser
are typed against these protocols rather than ``proxy.upstream.client.Upstream``, so they can be driven in
process by a scripted upstream (``tests/support/upstream.py``) where a real server would prove nothing more.
``Upstream`` implements both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from proxy.types import ChatBody, Chunk, JSONObject
from proxy.upstream.routing import ResolvedModel


class ChunkStream(Protocol):
    """An open streamed completion: OpenAI chunk dicts, closed exactly once (``UpstreamStream``)."""

    def __aiter__(self) -> AsyncIterator[Chunk]: ...

    async def aclose(self) -> None: ...


class Completion(Protocol):
    """One model call answered in full: all a summariser needs."""

    async def complete(self, target: ResolvedModel, body: ChatBody) -> JSONObject:
        """The chat completion ``target`` (or another of its deployments) answered to ``body``."""
        ...


class ModelCalls(Completion, Protocol):
    """Completions, streamed or not: all the recall-tool loop needs."""

    async def open_stream(self, target: ResolvedModel, body: ChatBody) -> ChunkStream:
        """The stream ``target`` answers ``body`` with, its first chunk already read (early failures raise)."""
        ...
