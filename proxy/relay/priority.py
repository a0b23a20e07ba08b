"""Users first: background summaries give way to chat requests on the same upstream.

A local model server (llama.cpp, Ollama) usually has one slot: a background summary started just before the
user's next turn makes that turn wait for the whole summary (a measured turn waited 121 s). For such an
upstream, a background summarizer call starts only while no chat request to it is in flight (it gives way
at once instead of queueing), and a chat request that arrives cancels the background calls running there
(closing the connection makes llama.cpp stop generating); the sweep stops there, keeps what it finished, and
is scheduled again by a later request. An inline compaction that overran its deadline becomes background
work at that moment: the request it no longer holds up must not wait behind its summary either.

On a machine too slow to write a summary in the pause between two turns (or a server never idle), every
summary would be cancelled or refused and none ever written. After ``PREEMPTIONS_BEFORE_HOLDING`` background
calls in a row gave way on a server, the next one there does not: it starts even behind a chat request, and
the chat request that arrives meanwhile waits for its end (once); the calls after it yield again.

Which upstreams yield is ``lcm_settings.background_yields``: ``auto`` (servers on this machine: loopback
``api_base``), ``always`` or ``never``. Keys are the deployment's ``api_base`` (one server, one queue).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from proxy.engine.summarize import SummaryPreempted, Yielding
from proxy.upstream.routing import ResolvedModel

T = TypeVar("T")
PREEMPTIONS_BEFORE_HOLDING = 2


def is_local(api_base: str | None) -> bool:
    if not api_base:
        return False
    host = urlsplit(api_base).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Priority:
    def __init__(self, mode: str = "auto") -> None:
        self.mode = mode
        self._busy: dict[str, int] = {}
        self._running: dict[str, dict[asyncio.Task[Any], Yielding]] = {}
        self._preempted: dict[str, int] = {}  # background calls cancelled in a row, per server
        self._held: set[asyncio.Task[Any]] = set()  # calls a chat request does not cancel

    def key(self, target: ResolvedModel) -> str | None:
        """The queue a deployment's requests share, or None when its background work need not yield."""
        api_base = target.litellm_params.get("api_base")
        if self.mode == "never" or (self.mode == "auto" and not is_local(api_base)):
            return None
        return str(api_base or target.upstream_model)

    def enter(self, key: str | None) -> Callable[[], None]:
        """A chat request to ``key`` starts: background calls there are cancelled and new ones wait. Returns
        the function to call when the request (its whole stream) is done."""
        if key is None:
            return lambda: None
        self._busy[key] = self._busy.get(key, 0) + 1
        for task, mode in self._running.get(key, {}).items():
            if mode.background and task not in self._held:  # an inline sweep the user waits for keeps its call
                task.cancel()
        done = False

        def leave() -> None:
            nonlocal done
            if done:
                return
            done = True
            self._busy[key] -= 1

        return leave

    async def background(self, key: str | None, call: Callable[[], Awaitable[T]], mode: Yielding | None) -> T:
        """Run ``call``, cancelled (``SummaryPreempted``) if a chat request to ``key`` arrives while ``mode``
        says the sweep is background work; when such a request is already in flight, give way at once rather
        than queue behind it (the sweep keeps what it finished and a later request schedules the rest)."""
        if key is None or mode is None:  # no sweep (an operator's compact): nothing to give way to
            return await call()
        hold = self._preempted.get(key, 0) >= PREEMPTIONS_BEFORE_HOLDING
        if mode.background and self._busy.get(key) and not hold:
            self._preempted[key] = self._preempted.get(key, 0) + 1
            raise SummaryPreempted("a chat request to the same upstream is in flight")

        async def run() -> T:
            return await call()

        task = asyncio.create_task(run())
        running = self._running.setdefault(key, {})
        running[task] = mode
        if hold:
            self._held.add(task)
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                self._preempted[key] = self._preempted.get(key, 0) + 1
                raise SummaryPreempted("a chat request to the same upstream arrived") from None
            task.cancel()  # this caller was cancelled (shutdown): the call goes too
            raise
        finally:
            running.pop(task, None)
            self._held.discard(task)
        self._preempted[key] = 0
        return result
