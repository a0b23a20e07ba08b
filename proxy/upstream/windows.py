"""The server's own context size: what a deployment's server says its window is, when that is smaller than the
config says.

An OpenAI-compatible local server runs with whatever context it was started with (llama.cpp's ``-c 2048``,
vLLM's ``--max-model-len``), whatever ``model_info.max_input_tokens`` claims. Budgeting for the configured
window then forwards requests the server refuses, turn after turn. The proxy learns the real size two ways:

* **asking** (``probe``): at startup, for each deployment with an ``api_base`` that speaks OpenAI's protocol,
  ``GET /props`` (llama.cpp: ``default_generation_settings.n_ctx``, the size of one slot), else
  ``GET {api_base}/models`` (vLLM: ``max_model_len``; llama.cpp: ``meta.n_ctx``). A short timeout, in the
  background; the first request to a deployment waits for its probe to end.
* **being refused** (``stated_window``): a refusal of the context as too long that states the size, in the words
  of llama.cpp ("exceeds the available context size (2048 tokens)"), vLLM, OpenAI or SGLang ("maximum context
  length is 4096 tokens").

What is learned is kept per deployment (a ``model_list`` entry and the model it calls), in memory: each worker
process learns for itself, by its own probe or, at worst, one refusal (which is retried within the new window,
so no client sees it). ``proxy.relay.policy.ModelPolicy.window_of`` uses a learned size only when it is smaller
than the configured one: the proxy never widens a window on a server's word.

What is learned does not last for ever (``recheck_after``, ``lcm_settings.context_window_recheck_seconds``): a
server restarted with a larger context, or one refusal quoting a tiny window, would otherwise shrink the model
for every tenant until the proxy restarts. Once that long has passed, the next request to a deployment whose
server is asked asks it again (and waits, as the first request waits for the startup probe): the size it states
now replaces the old one, larger or not; a server that answers without one leaves the configured window in
force until it or a refusal says otherwise; one that cannot be reached keeps what was learned, asked again
after another interval. A deployment whose server is not asked forgets a refusal's size after that long: the
configured window holds again until another refusal teaches it. Time is ``clock`` (monotonic; tests inject one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from proxy.upstream.routing import ResolvedModel

log = logging.getLogger("lcm_proxy.upstream")

PROBE_TIMEOUT = 3.0  # seconds for each GET of a probe; a server on this machine answers in milliseconds
RECHECK_SECONDS = 600.0  # how long a learned size holds before it is asked again (or, not asked, forgotten)
MIN_WINDOW = 256  # a stated size below this is not believed (a misread number, not a context)
MAX_WINDOW = 100_000_000
MAX_MESSAGE_CHARS = 2_000  # refusals are read this far: the numbers come first in every known wording

# The window in each provider's wording; bounded repetitions only, on bounded text.
_WINDOW_PATTERNS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"available context size \((\d{1,9}) tokens?\)",  # llama.cpp
        r"maximum context length is (\d{1,9}) tokens?",  # OpenAI, vLLM
        r"maximum context length of (\d{1,9}) tokens?",  # SGLang
        r"model's context length \((\d{1,9}) tokens?\)",  # SGLang, older
    )
)


# The server's own count of the prompt it refused, in the same wordings (the first that matches).
_PROMPT_PATTERNS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"^request \((\d{1,9}) tokens?\)",  # llama.cpp
        r"\((\d{1,9}) in the messages",  # vLLM, OpenAI: "(4000 in the messages, 1000 in the completion)"
        r"requested (\d{1,9}) tokens in the messages",  # vLLM
        r"prompt contains at least (\d{1,9}) input tokens",  # vLLM
        r"request has (\d{1,9}) input tokens",  # vLLM
        r"messages resulted in (\d{1,9}) tokens",  # OpenAI
        r"^the input \((\d{1,9}) tokens?\)",  # SGLang
    )
)
MARGIN_SAFETY = 1.05  # on top of a measured ratio: the next request's text may count a little higher still
MAX_LEARNED_MARGIN = 4.0


def stated_prompt_tokens(message: str) -> int | None:
    """The server's count of the prompt it refused, when the refusal states it."""
    text = message[:MAX_MESSAGE_CHARS]
    for pattern in _PROMPT_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def key_of(target: ResolvedModel) -> str:
    """A deployment's key: its model_list entry and the model it calls (a wildcard entry calls several)."""
    return f"{target.deployment or target.alias}:{target.upstream_model}"


def stated_window(message: str) -> int | None:
    """The context size a provider's refusal states, or None when it states none."""
    text = message[:MAX_MESSAGE_CHARS]
    for pattern in _WINDOW_PATTERNS:
        match = pattern.search(text)
        if match:
            window = int(match.group(1))
            return window if MIN_WINDOW <= window <= MAX_WINDOW else None
    return None


@dataclass(frozen=True)
class Learned:
    window: int
    how: str  # "GET /props", "GET /v1/models", "a refusal"
    at: int  # unix time
    checked: float = 0.0  # ``ServerWindows.clock`` when learned or last asked again


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if MIN_WINDOW <= value <= MAX_WINDOW else None


def _from_props(body: Any) -> int | None:
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    return _int(settings.get("n_ctx")) if isinstance(settings, dict) else None


def _from_models(body: Any, model: str) -> int | None:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    entries = [e for e in data if isinstance(e, dict)]
    name = model.partition("/")[2] or model
    named = [e for e in entries if e.get("id") in (name, model)]
    chosen = named or (entries if len(entries) == 1 else [])
    for entry in chosen:
        meta = entry.get("meta")
        found = _int(entry.get("max_model_len")) or (_int(meta.get("n_ctx")) if isinstance(meta, dict) else None)
        if found:
            return found
    return None


class ServerWindows:
    """The sizes learned per deployment, and the probes that learn them (and ask again once they are due)."""

    def __init__(
        self, recheck_after: float | None = RECHECK_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.recheck_after = recheck_after  # None: what is learned holds until the process ends
        self.clock = clock
        self._learned: dict[str, Learned] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._asked: dict[str, ResolvedModel] = {}  # the deployments whose server is asked (``start``)
        self._margins: dict[str, float] = {}  # the server's count over the proxy's, measured on a refusal

    def get(self, target: ResolvedModel) -> Learned | None:
        key = key_of(target)
        known = self._learned.get(key)
        if known is not None and key not in self._asked and self._due(known):
            # Nobody to ask: a refusal's size lapses, and the configured window holds until a refusal says again.
            del self._learned[key]
            log.info("deployment %s: the context size learned from %s has lapsed", target.deployment, known.how)
            return None
        return known

    def learn(self, target: ResolvedModel, window: int, how: str) -> None:
        """Keep the smallest size a deployment's server stated (of those not yet due to be asked again)."""
        key = key_of(target)
        known = self._learned.get(key)
        if known is None or window < known.window or self._due(known):
            self._learned[key] = Learned(window, how, int(time.time()), self.clock())

    def _due(self, known: Learned) -> bool:
        return self.recheck_after is not None and self.clock() - known.checked >= self.recheck_after

    def learn_from_refusal(self, target: ResolvedModel, message: str) -> None:
        window = stated_window(message)
        if window is not None:
            self.learn(target, window, "a refusal")

    def margin(self, target: ResolvedModel) -> float | None:
        """How much more than o200k this deployment's server was seen to count (with a safety factor)."""
        return self._margins.get(key_of(target))

    def learn_margin(self, target: ResolvedModel, message: str, counted: int) -> None:
        """A refusal that states the server's count of a prompt the proxy counted ``counted`` (o200k) tokens:
        their ratio is the least margin the next budget must divide by."""
        server = stated_prompt_tokens(message)
        if server is None or counted <= 0:
            return
        margin = min(MAX_LEARNED_MARGIN, round(server / counted * MARGIN_SAFETY, 3))
        key = key_of(target)
        self._margins[key] = max(margin, self._margins.get(key, 0.0))

    # --- probes ------------------------------------------------------------------------------------------

    def start(self, targets: Iterable[ResolvedModel]) -> None:
        """Probe each deployment once, in the background; ``ready`` asks again once what it learned is due."""
        for target in targets:
            key = key_of(target)
            self._asked.setdefault(key, target)
            if key not in self._probes:
                self._probes[key] = asyncio.get_running_loop().create_task(self._probe(target))

    async def ready(self, target: ResolvedModel) -> None:
        """Wait for the probes of the deployments that may answer ``target`` (at once, once they ended), after
        starting one for each whose learned size is due to be asked again."""
        for candidate in target.candidates():
            key = key_of(candidate)
            known, probe = self._learned.get(key), self._probes.get(key)
            if key in self._asked and known is not None and self._due(known) and (probe is None or probe.done()):
                self._probes[key] = asyncio.get_running_loop().create_task(self._probe(candidate, known))
        pending = [p for c in target.candidates() if (p := self._probes.get(key_of(c))) and not p.done()]
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        for task in self._probes.values():
            with contextlib.suppress(BaseException):
                await task

    async def _probe(self, target: ResolvedModel, again: Learned | None = None) -> None:
        """Ask the server for its size. ``again``: what was learned before, now due: the answer replaces it."""
        key = key_of(target)
        try:
            found = await self._ask(target)
        except (httpx.HTTPError, OSError) as error:
            # The server may not be up yet: a refusal will teach the size instead (or, asking again, what was
            # learned holds for another interval).
            log.debug("could not ask %s for its context size: %s", target.deployment, type(error).__name__)
            if again is not None and self._learned.get(key) is again:
                self._learned[key] = replace(again, checked=self.clock())
            return
        if again is None or self._learned.get(key) is not again:  # first asked, or a refusal taught it meanwhile
            if found is not None:
                self.learn(target, *found)
            return
        if found is None:
            del self._learned[key]  # the server no longer says: the configured window, until it or a refusal does
        else:
            self._learned[key] = Learned(found[0], found[1], int(time.time()), self.clock())
        if found is None or found[0] != again.window:
            log.info(
                "deployment %s: asked again, the server's context is %s (was %d tokens, from %s)",
                target.deployment, f"{found[0]} tokens" if found else "not stated", again.window, again.how,
            )  # fmt: skip

    async def _ask(self, target: ResolvedModel) -> tuple[int, str] | None:
        """The size the server states and the request that said it; None when it answers without one."""
        api_base = str(target.litellm_params["api_base"]).rstrip("/")
        root = api_base[: -len("/v1")] if api_base.endswith("/v1") else api_base
        key = target.litellm_params.get("api_key")
        headers = {"authorization": f"Bearer {key}"} if isinstance(key, str) and key else {}
        timeout = httpx.Timeout(PROBE_TIMEOUT, connect=min(1.0, PROBE_TIMEOUT))
        async with httpx.AsyncClient(timeout=timeout, headers=headers, follow_redirects=False) as client:
            for path, url, read in (
                ("GET /props", f"{root}/props", _from_props),
                ("GET /v1/models", f"{api_base}/models", lambda b: _from_models(b, target.upstream_model)),
            ):
                response = await client.get(url)
                if response.status_code != 200 or len(response.content) > 1_000_000:
                    continue
                try:
                    window = read(response.json())
                except ValueError:
                    continue
                if window is not None:
                    return window, path
        return None
