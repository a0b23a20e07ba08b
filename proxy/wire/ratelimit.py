"""Per-key rate limits of the admin API's costly calls (``DELETE /lcm/conversations/{id}``): a token bucket per
caller (the tenant its key names; the callers are the configured keys, so the buckets are few). A call over
the limit is a 429 in OpenAI's shape with ``Retry-After``: the seconds until the bucket holds a token again."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from proxy.errors import ProxyError


class RateLimitError(ProxyError):
    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds: the Retry-After header of the response


class TokenBuckets:
    """``per_minute`` calls a minute per key on average, up to ``burst`` at once; ``per_minute`` None: no limit."""

    def __init__(
        self, per_minute: float | None, burst: int, what: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = None if per_minute is None else per_minute / 60.0  # tokens a second
        self.burst = float(burst)
        self.what = what
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when counted)

    def take(self, key: str) -> None:
        """One call of ``key``, or ``RateLimitError`` (nothing taken)."""
        if self.rate is None:
            return
        now = self.clock()
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            wait = max(1, math.ceil((1.0 - tokens) / self.rate))
            raise RateLimitError(
                f"Rate limit reached for {self.what}: {self.rate * 60:g} per minute per key"
                f" (bursts of {self.burst:g}). Try again in {wait} s.",
                retry_after=wait,
            )
        self._buckets[key] = (tokens - 1.0, now)
