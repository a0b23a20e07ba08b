"""The overhead benchmark's tables (``bench/overhead.py`` measures; this module prints), markdown."""

from __future__ import annotations

import statistics
from typing import Any

from bench.overhead_doors import (
    AIOHTTP,
    BASELINE,
    CHAT_DOOR,
    COMPARATORS,
    DOORS,
    LCM,
    LITELLM_PROXY,
    REQUESTS,
    STREAM_TOTAL,
    Door,
)

SERVERS = (BASELINE, *COMPARATORS, LCM)
LOADS = (1, 8, 64)
# The performance issue's targets: (figure's request kind, comparator, bound, "le" or "ge").
TARGETS: dict[str, list[tuple[str, float, str]]] = {
    "first": [(AIOHTTP, 2.0, "le")],
    "continue": [(AIOHTTP, 2.0, "le")],
    "resend": [],
    "stream": [(AIOHTTP, 2.0, "le")],
    "load64": [(LITELLM_PROXY, 5.0, "ge"), (AIOHTTP, 0.8, "ge")],
}


def p(values: list[float], q: float) -> float:
    """The q-quantile in milliseconds (nearest rank)."""
    return sorted(values)[min(len(values) - 1, int(len(values) * q))] * 1000


def median_ms(values: list[float]) -> float:
    return float(statistics.median(values)) * 1000


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs > 0 and ours > 0 else "n/a"


def _row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def _latency(results: Any, server: str, door: Door, kind: str, request: str, label: str, first: bool) -> str | None:
    cell = results.get((server, door.path, kind, request))
    base = results.get((BASELINE, door.path, door.kinds[0][0], request))
    if cell is None:
        return None
    values = cell.first if first else cell.total
    cells = [server, kind, label, f"{p(values, 0.5):.2f}", f"{p(values, 0.99):.2f}"]
    if server == BASELINE or base is None:
        cells += ["", ""]
    else:
        base_values = base.first if first else base.total
        cells += [f"{p(values, 0.5) - p(base_values, 0.5):.2f}", f"{p(values, 0.99) - p(base_values, 0.99):.2f}"]
    cells.append(f"{cell.cpu_ms:.2f}")
    return _row(cells)


def latency_table(results: Any, door: Door, requests: int) -> None:
    print(
        f"\n## overhead: {door.name}, one client at a time ({requests} requests per cell, each server its own process)\n"
    )
    print(
        "| in front of the fake upstream | deployment | request | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU ms/request |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for server in SERVERS:
        for kind, _ in door.kinds:
            for label, request, stream in REQUESTS:
                for line in (
                    _latency(results, server, door, kind, request, label, stream),
                    _latency(results, server, door, kind, request, STREAM_TOTAL, False) if stream else None,
                ):
                    if line:
                        print(line)
            if door is CHAT_DOOR and (line := _latency(results, server, door, kind, "long", "long¹", False)):
                print(line)


def throughput_table(results: Any, requests: int, at64: int) -> None:
    print(f"\n## overhead: throughput, first turns ({requests} requests per cell, {at64} at 64 clients)\n")
    print("| in front of the fake upstream | door | deployment | clients | p50 ms | p99 ms | req/s | CPU ms/request |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for server in SERVERS:
        for door in DOORS:
            for kind, _ in door.kinds:
                for clients in LOADS:
                    cell = results.get((server, door.path, kind, f"load{clients}"))
                    if cell is not None:
                        figures = [f"{p(cell.total, 0.5):.2f}", f"{p(cell.total, 0.99):.2f}", f"{cell.rps:.0f}"]
                        print(_row([server, door.path, kind, str(clients), *figures, f"{cell.cpu_ms:.2f}"]))


def _added(results: Any, server: str, door: Door, kind: str, request: str) -> float | None:
    cell, base = (
        results.get((server, door.path, kind, request)),
        results.get((BASELINE, door.path, door.kinds[0][0], request)),
    )
    if cell is None or base is None:
        return None
    first = request == "stream"
    return median_ms(cell.first if first else cell.total) - median_ms(base.first if first else base.total)


def _figure(results: Any, server: str, door: Door, kind: str, request: str) -> float | None:
    if request.startswith("load"):
        cell = results.get((server, door.path, kind, request))
        return None if cell is None else float(cell.rps)
    return _added(results, server, door, kind, request)


def ratio_table(results: Any) -> None:
    print("\n## overhead: lcm-proxy ÷ comparator (added p50: lower is better; req/s: higher is better)\n")
    print(f"| door | deployment | figure | ÷ {' | ÷ '.join(COMPARATORS)} | targets | met |")
    print("|---|---|---|" + "---:|" * len(COMPARATORS) + "---|---|")
    labels = {"first": "added p50, first turn", "continue": "added p50, continuation", "resend": "added p50, re-send",
              "stream": "added p50, streaming first byte", "load64": "req/s at 64 clients"}  # fmt: skip
    for door in DOORS:
        for kind, _ in door.kinds:
            for request, label in labels.items():
                ours = _figure(results, LCM, door, kind, request)
                if ours is None:
                    continue
                theirs = {name: _figure(results, name, door, kind, request) for name in COMPARATORS}
                cells = [ratio(ours, v) if v is not None else "—" for v in theirs.values()]
                wanted, met = [], []
                for name, bound, sense in TARGETS[request]:
                    wanted.append(f"{'≤' if sense == 'le' else '≥'} {bound:g}x {name}")
                    value = theirs.get(name)
                    if value is None or value <= 0 or ours <= 0:
                        met.append("n/a")
                    else:
                        met.append(
                            "yes" if (ours / value <= bound if sense == "le" else ours / value >= bound) else "no"
                        )
                print(_row([door.path, kind, label, *cells, ", ".join(wanted) or "none", ", ".join(met) or "—"]))


def print_all(results: Any, requests: int, at64: int, notes: list[str]) -> None:
    for door in DOORS:
        latency_table(results, door, requests)
    throughput_table(results, requests, at64)
    ratio_table(results)
    print()
    for note in notes:
        print(note)
