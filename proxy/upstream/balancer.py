"""Which deployment a call tries first, and which next: LiteLLM's routing strategies, kept in this process.

A model with several deployments (model_list entries sharing a ``model_name``), plus the deployments of its
fallback models, forms a chain (``ResolvedModel.chain``). ``Upstream._call`` walks it in the order given here:

* **simple-shuffle** (the default, as LiteLLM): a random order, weighted by ``litellm_params.weight``, else
  ``rpm``, else ``tpm`` (the first of them that some deployment of the model sets; a deployment without it
  then comes after those with it). Without any of them, uniformly.
* **least-busy**: fewest calls in flight in this process first (a stream counts until it is closed); ties
  keep model_list order.

The deployments of the model come before those of its first fallback model, and so on. A deployment that
failed ``allowed_fails`` times in a row (a retryable failure, see ``switchable``) cools down: it is left out
for ``cooldown_time`` seconds, unless every deployment of the chain is cooling down. A deployment that answers
(tried while every one was cooling down) leaves its cooldown at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from proxy.config.settings import GeneralSettings
from proxy.errors import UpstreamError
from proxy.upstream.errors import DEFAULT_UPSTREAM, describe_upstream, is_context_length_error
from proxy.upstream.routing import ResolvedModel, Tier, deployment_of

log = logging.getLogger("lcm_proxy.upstream")

WEIGHTS = ("weight", "rpm", "tpm")  # LiteLLM's simple-shuffle weights, in the order it looks for them
NOT_SWITCHED = frozenset({"upstream_bad_response", "upstream_bad_stream"})  # answered (and billed): not sent again


def switchable(error: UpstreamError) -> bool:
    """Whether another try (the next deployment, or a retry) may answer: 429, 5xx, connection failures and
    timeouts. Not the client's errors (400, 401, 403, 404), a refusal of the context as too long (the
    proxy's own context retry handles it), or an answer that came but could not be read."""
    return (
        (error.status == 429 or error.status >= 500)
        and error.code not in NOT_SWITCHED
        and not (is_context_length_error(error))
    )


def backoff(attempt: int) -> float:
    """Seconds before pass ``attempt`` (1, 2...) over the chain: 0.5, 1, 2... at most 8."""
    return min(8.0, 0.5 * float(2 ** (attempt - 1)))


def _key(target: ResolvedModel) -> str:
    return target.deployment or target.upstream_model


class Balancer:
    def __init__(self, settings: GeneralSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.strategy = settings.routing_strategy
        self.allowed_fails = settings.allowed_fails
        self.cooldown_time = settings.cooldown_time
        self.rng = random.Random()  # tests seed it
        self.clock = clock
        self.in_flight: dict[str, int] = {}
        self._failures: dict[str, int] = {}  # retryable failures in a row
        self._cooling_until: dict[str, float] = {}

    def order(self, target: ResolvedModel) -> list[ResolvedModel]:
        """The deployments to try for one pass over ``target``'s chain, first first."""
        chain: list[ResolvedModel] = []
        seen: set[tuple[str, str]] = set()
        for tier in target.chain():
            for candidate in self._ordered(tier):
                if (_key(candidate), candidate.upstream_model) not in seen:
                    seen.add((_key(candidate), candidate.upstream_model))
                    chain.append(candidate)
        now = self.clock()
        ready = [c for c in chain if self._cooling_until.get(_key(c), 0.0) <= now]
        return ready or chain

    def _ordered(self, tier: Tier) -> list[ResolvedModel]:
        if len(tier) == 1:
            return list(tier)
        if self.strategy == "least-busy":
            return sorted(tier, key=lambda c: self.in_flight.get(_key(c), 0))  # stable: ties keep their order
        for name in WEIGHTS:
            weights = [_weight(c, name) for c in tier]
            if any(w > 0 for w in weights):
                return self._weighted(list(tier), weights)
        return self.rng.sample(tier, len(tier))

    def _weighted(self, tier: list[ResolvedModel], weights: list[float]) -> list[ResolvedModel]:
        """Weighted draws without replacement; deployments of no weight last, in model_list order."""
        out: list[ResolvedModel] = []
        while any(w > 0 for w in weights):
            index = self.rng.choices(range(len(tier)), weights=weights)[0]
            out.append(tier.pop(index))
            weights.pop(index)
        return out + tier

    def start(self, target: ResolvedModel) -> Callable[[], None]:
        """A call to ``target`` starts; returns what ends it (idempotent)."""
        key = _key(target)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        done = False

        def end() -> None:
            nonlocal done
            if not done:
                done = True
                self.in_flight[key] -= 1

        return end

    def succeeded(self, target: ResolvedModel) -> None:
        """``target`` answered: its failures in a row start again from none, and a cooldown it was in (tried
        because every deployment of the chain was cooling down) is over, so the next call tries it first."""
        self._failures.pop(_key(target), None)
        self._cooling_until.pop(_key(target), None)

    def failed(self, target: ResolvedModel) -> None:
        """A retryable failure of ``target``: the ``allowed_fails``-th in a row starts its cooldown."""
        key = _key(target)
        self._failures[key] = self._failures.get(key, 0) + 1
        if self.cooldown_time > 0 and self._failures[key] >= self.allowed_fails:
            self._failures[key] = 0
            self._cooling_until[key] = self.clock() + self.cooldown_time
            log.warning(
                "model %s: deployment %s (%s) failed %d times in a row; it is skipped for %g s",
                target.alias, _key(target), deployment_of(target), self.allowed_fails, self.cooldown_time,
            )  # fmt: skip


def _weight(target: ResolvedModel, name: str) -> float:
    value = target.litellm_params.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


def switch_line(failed: ResolvedModel, error: UpstreamError, following: ResolvedModel) -> str:
    """The WARNING logged when a call moves on to the next deployment: aliases, models, safe api_bases, the
    status; never a key or any content."""
    code = f" {error.code}" if error.code else ""
    then = f"fallback model {following.alias}: " if following.alias != failed.alias else ""
    return (
        f"model {failed.alias}: {deployment_of(failed)} failed before the first byte ({error.status}{code});"
        f" trying {then}{deployment_of(following)}"
    )


def _quoted(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def exhausted(target: ResolvedModel, chain: list[ResolvedModel], error: UpstreamError) -> UpstreamError:
    """The error the client gets when a whole pass over ``chain`` failed: the last failure (its status, type
    and code, so a 429 stays a 429), worded for the model the client asked for when fallback models were
    tried too, else it would name only the last of them. Never with an ``api_base``: the client has no use
    for the proxy's internal addresses (the log lines name them)."""
    fallbacks = list(dict.fromkeys(c.alias for c in chain if c.alias != target.alias))
    if not fallbacks:
        return error
    message = error.message
    for candidate in chain:
        message = message.replace(describe_upstream(candidate), f"{DEFAULT_UPSTREAM} for model '{candidate.alias}'")
    plural = "s" if len(fallbacks) > 1 else ""
    # Reworded in place: every other attribute of the last failure (status, code, a Retry-After) stays.
    error.message = (
        f"Model '{target.alias}' failed, and so did its fallback{plural} {_quoted(fallbacks)}."
        f" The last error, from '{chain[-1].alias}': {message}"
    )
    error.args = (error.message,)
    return error
