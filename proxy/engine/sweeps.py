"""The compaction sweeps this process runs: one at a time per conversation, inline or in the background.

A request over its context share starts a sweep and waits for it (``wait_inline``) for at most
``inline_compaction_seconds``; past that the sweep goes on in the background and the request is answered
from what fits. Whoever asks for a sweep of a conversation that is being swept gets the running one (single
flight), so nothing is summarised twice. A background sweep's summarizer calls give way to chat requests.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.config.lcm import LcmSettings
from proxy.engine.budget import Sizes
from proxy.engine.compaction import Compactor, SweepReport
from proxy.engine.prepared import Compaction
from proxy.engine.summarize import SWEEP_MODE, Summarizer, Yielding

log = logging.getLogger("lcm_proxy.engine")


class Sweeps:
    def __init__(self, compactor: Compactor, settings: LcmSettings) -> None:
        self.compactor = compactor
        self.settings = settings
        self.running: dict[str, asyncio.Task[SweepReport]] = {}
        self._modes: dict[str, Yielding] = {}  # of the running sweeps: background work or awaited by a request

    def current(self, conversation_id: str) -> asyncio.Task[SweepReport] | None:
        """The sweep of ``conversation_id`` still running, if any."""
        task = self.running.get(conversation_id)
        return task if task is not None and not task.done() else None

    def start(
        self,
        conversation_id: str,
        summarizer: Summarizer | None,
        sizes: Sizes | None,
        count: int | None,
        kind: str,
    ) -> asyncio.Task[SweepReport]:
        """The sweep of ``conversation_id``: the running one if there is one (single flight: a second request
        waits for it and then looks at the context again), else a new one."""
        running = self.current(conversation_id)
        if running is not None:
            return running
        self._modes[conversation_id] = Yielding(background=kind == "background")
        task = asyncio.create_task(self._sweep(conversation_id, summarizer, sizes, count, kind))
        self.running[conversation_id] = task
        return task

    async def wait_inline(self, conversation_id: str, task: asyncio.Task[SweepReport]) -> Compaction:
        """Wait for the compaction this request needs, for at most ``inline_compaction_seconds``; past that it
        goes on in the background and the request is answered from what fits."""
        done, _ = await asyncio.wait({task}, timeout=self.settings.inline_compaction_seconds)
        if not done:
            if conversation_id in self._modes:
                self._modes[conversation_id].background = True
            log.warning(
                "inline compaction of %s still running after %.0f s: answering from what fits",
                conversation_id,
                self.settings.inline_compaction_seconds,
            )
            return "deferred"
        if not task.cancelled() and task.result().busy:
            return "deferred"  # another process kept sweeping it: its result lands, or a background sweep follows
        return "inline"

    async def _sweep(
        self,
        conversation_id: str,
        summarizer: Summarizer | None,
        sizes: Sizes | None,
        count: int | None,
        kind: str,
    ) -> SweepReport:
        # This task's own context: a background sweep's summarizer calls give way to chat requests, and so do an
        # inline sweep's once its request stopped waiting for it (``wait_inline``).
        SWEEP_MODE.set(self._modes[conversation_id])
        # How long to wait for a sweep of the same conversation in another process (``proxy.engine.lease``): a
        # request at most as long as it waits anyway, background work not at all, the operator's until it ends.
        waits = {"inline": self.settings.inline_compaction_seconds, "background": 0.0}
        wait = waits.get(kind, self.settings.sweep_deadline_seconds)
        try:
            report = await self.compactor.sweep(conversation_id, summarizer, sizes=sizes, count=count, lease_wait=wait)
            log.info("%s compaction of %s: %s", kind, conversation_id, report)
            return report
        except Exception:
            log.exception("%s compaction of %s failed", kind, conversation_id)
            return SweepReport()
        finally:
            if self.running.get(conversation_id) is asyncio.current_task():
                del self.running[conversation_id]
                self._modes.pop(conversation_id, None)

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait for the running sweeps (tests, shutdown)."""
        tasks = [t for t in self.running.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def close(self) -> None:
        for task in list(self.running.values()):
            task.cancel()
        await self.wait_idle(timeout=5)
