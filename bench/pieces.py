"""Time spent in named pieces of the proxy, measured from outside it (the proxy carries no timers).

``Pieces.wrap`` replaces a function or method with one that adds its time to a label. Times are exclusive: a
wrapped call made inside another wrapped call is counted under its own label only, so the labels of one
request add up to the outermost call's time. Awaited time counts too (the worker thread of a store read, a
hop to the writer's thread), which is what a request waits for; the benchmark runs one request at a time.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_frame: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("bench_piece", default=None)


class Pieces:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._undo: list[tuple[Any, str, Any]] = []

    def reset(self) -> None:
        self.totals.clear()

    @contextmanager
    def timing(self, label: str) -> Iterator[None]:
        parent = _frame.get()
        frame = [0.0]
        token = _frame.set(frame)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            _frame.reset(token)
            self.totals[label] += elapsed - frame[0]
            if parent is not None:
                parent[0] += elapsed

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = inspect.getattr_static(owner, name)
        function = original.__func__ if isinstance(original, staticmethod) else original
        timing = self.timing

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def timed(*args: Any, **kwargs: Any) -> Any:
                with timing(label):
                    return await function(*args, **kwargs)

        else:

            @functools.wraps(function)
            def timed(*args: Any, **kwargs: Any) -> Any:
                with timing(label):
                    return function(*args, **kwargs)

        setattr(owner, name, staticmethod(timed) if isinstance(original, staticmethod) else timed)
        self._undo.append((owner, name, original))

    def unwrap(self) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def per_request(self, requests: int) -> dict[str, float]:
        return {label: total / max(1, requests) for label, total in self.totals.items()}


def timed_call(function: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start
