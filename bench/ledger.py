"""The ledger of standing instructions under the hostile probe: rule-dense requests, bounded and off the loop.

The probe (the issue "bounded ledger"): 4 KB user messages made of nothing but rules, limits, decisions and
lifts (``tests/support/rule_dense.py``), 10 of them and 300 of them (1.2 MB) in one request, from any key, on
loopback, to a fake upstream. Before: supersession compared every statement with every item, on the event
loop, inside the write transaction; 10 messages took 5.5 s and made 1,042 items, 300 were still being
reconciled after 21 minutes with ``/healthz`` at 3-19 s and no tenant able to write.

Two tables:

* **planning** (in process, one core): what the statements of a request cost to reconcile with the index of
  ``proxy/engine/standing/index.py`` and the caps, against comparing every pair (the same function with an
  exhaustive index) and against the old all-pairs reconcile without caps (``--before``; the 300-message row
  of that is the issue's figure, it is not run);
* **through HTTP** (the proxy under uvicorn, the fake upstream on 127.0.0.1), each request with the ledger off
  (the baseline: what the rest of the path costs) and on: the request's time, how long the writer was held,
  the worst and the 99th-percentile ``/healthz`` answer while it was handled (a probe every 10 ms), as a ratio
  to the 100 ms bound, and the items stored.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import orjson

from proxy.app import create_app
from proxy.engine.standing import flow, languages, ledger
from proxy.store.sqlite.store import SQLiteStore
from tests.support.fakes import FakeUpstream
from tests.support.proxies import make_config
from tests.support.rule_dense import rule_dense_request
from tests.support.servers import probe_healthz_while, serve_in_thread

BOUND = 0.100  # seconds: the issue's bound for /healthz while a request is handled
ISSUE = {10: "5.5 s, 1,042 items", 300: "> 21 min, unfinished"}  # the old code, as the issue measured it


def said_of(messages: int) -> tuple[float, flow.Said]:
    """(seconds, statements) of the request's messages, read as ingest reads them (``flow.heard``: the language
    of a message the reader took nothing from is detected too)."""
    transcript = rule_dense_request(messages)
    start = time.perf_counter()
    said = [(role, statements) for role, statements, _ in map(flow.heard, transcript)]
    return time.perf_counter() - start, said


@contextlib.contextmanager
def uncapped() -> Iterator[None]:
    with (
        mock.patch.object(flow, "MAX_NEW_PER_MESSAGE", 10**9),
        mock.patch.object(flow, "MAX_OPEN_ITEMS", 10**9),
    ):
        yield


def timed_plan(said: flow.Said, exhaustive: bool) -> tuple[float, flow.Plan]:
    start = time.perf_counter()
    plan = flow.plan([], 0, said, exhaustive=exhaustive)
    return time.perf_counter() - start, plan


def planning(sizes: tuple[int, ...], before: bool) -> None:
    print("\n## ledger: planning a request's items (in process, one thread)\n")
    print("| messages | statements | extraction s | indexed + caps s | all pairs + caps s | all pairs / indexed |"
          " items written | before: all pairs, no caps s | items before |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        extraction, said = said_of(n)
        statements = sum(len(s) for _, s in said)
        indexed, plan = timed_plan(said, exhaustive=False)
        if n <= 30:
            exhaustive, same = timed_plan(said, exhaustive=True)
            assert same == plan, "the indexed plan differs from the all-pairs one"
            pairs, ratio = f"{exhaustive:.2f}", f"{exhaustive / indexed:.1f}"
        else:
            pairs, ratio = "not run", ""
        old, old_items = ISSUE.get(n, ""), ""
        if before and n <= 10:
            with uncapped():
                seconds, unbounded = timed_plan(said, exhaustive=True)
            old, old_items = f"{seconds:.2f}", str(len(unbounded.writes))
        elif n in ISSUE:
            old, old_items = f"issue: {ISSUE[n]}", ""
        print(f"| {n} | {statements} | {extraction:.2f} | {indexed:.2f} | {pairs} | {ratio} | {len(plan.writes)} |"
              f" {old} | {old_items} |")  # fmt: skip


@contextlib.asynccontextmanager
async def _held(store: Any, held: list[float]) -> AsyncIterator[Any]:
    start = time.perf_counter()
    try:
        async with store._write_unit() as tx:
            yield tx
    finally:
        held.append(time.perf_counter() - start)


def through_http(sizes: tuple[int, ...], small: int) -> None:
    print("\n## ledger: the hostile request through HTTP (uvicorn on 127.0.0.1, fake upstream)\n")
    print("| request | MB | ledger | status | request s | writer held max ms | /healthz probes | /healthz max ms |"
          " /healthz p99 ms | max / 100 ms | open items | items stored |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fake = FakeUpstream()
    with serve_in_thread(fake.app) as upstream:
        cases: list[tuple[str, list[dict[str, Any]]]] = [(f"{n} × 4 KB of rules", rule_dense_request(n)) for n in sizes]
        if small:
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Never push branch {i} to main."}
                        for i in range(small - 1)] + [{"role": "user", "content": "Thanks."}]  # fmt: skip
            cases.append((f"{small:,} small messages", messages))
        for label, transcript in cases:
            for standing in ("off", "auto"):  # the same request without the ledger: the baseline of this run
                row = run_request(upstream, transcript, standing)
                print(f"| {label} | {row['mb']:.2f} | {standing} | {row['status']} | {row['seconds']:.1f} |"
                      f" {row['held'] * 1000:.0f} | {row['probes']} | {row['max'] * 1000:.0f} |"
                      f" {row['p99'] * 1000:.0f} | {row['max'] / BOUND:.2f} | {row['open']} | {row['items']} |")  # fmt: skip


def run_request(upstream: str, transcript: list[dict[str, Any]], standing: str) -> dict[str, Any]:
    model = {
        "model_name": "big-model",
        "litellm_params": {"model": "openai/fake-model", "api_base": f"{upstream}/v1", "api_key": "sk-bench"},
        "model_info": {"max_input_tokens": 20_000_000},  # nothing is compacted: the ledger is what is measured
    }
    body = orjson.dumps({"model": "big-model", "messages": transcript})
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        lcm = {"standing_instructions": standing}
        app = create_app(make_config(upstream, data_dir, lcm, models=[model], request_timeout=600), serving=True)
        held: list[float] = []
        with serve_in_thread(app) as url:
            store = app.state.lcm.store
            store._write_unit, store.write = store.write, functools.partial(_held, store, held)
            warm = httpx.post(f"{url}/v1/chat/completions", json={"model": "test-model", "messages": [
                {"role": "user", "content": "hi"}]}, timeout=60)  # fmt: skip
            assert warm.status_code == 200
            held.clear()

            def send() -> tuple[int, float]:
                # The request, then its ledger: far below its window's threshold, its messages are read when
                # the ledger is first asked for (``proxy.engine.standing.reader``), within the probed time.
                start = time.perf_counter()
                response = httpx.post(f"{url}/v1/chat/completions", content=body,
                                      headers={"content-type": "application/json"}, timeout=900)  # fmt: skip
                conversation = response.headers.get("x-lcm-conversation-id")
                if response.status_code == 200 and conversation:
                    listed = httpx.get(f"{url}/lcm/conversations/{conversation}/ledger", timeout=900)
                    assert listed.status_code == 200, listed.text
                return response.status_code, time.perf_counter() - start

            probes, (status, seconds) = probe_healthz_while(url, send)
        items = asyncio.run(_items(data_dir))
    latencies = sorted(probes.latencies) or [0.0]
    return {
        "mb": len(body) / 1e6, "status": status, "seconds": seconds, "held": max(held, default=0.0),
        "probes": len(probes.latencies), "max": latencies[-1],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "open": sum(1 for item in items if item.superseded_seq is None), "items": len(items),
    }  # fmt: skip


async def _items(data_dir: Path) -> list[Any]:
    store = SQLiteStore(data_dir)
    await store.open()
    try:
        conversations = [c for c in await store.read.conversations() if c.message_count > 1]
        found = [await store.read.ledger(c.id, include_superseded=True) for c in conversations]
        return [item for items in found for item in items]
    finally:
        await store.close()


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench ledger", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", action="store_true", help="also time the old all-pairs reconcile without caps "
                        "on the 10-message request (about 5 s)")  # fmt: skip
    args = parser.parse_args(argv or [])
    ledger.extract("Never push to main.", "user")  # warm the readers' patterns up outside the measurements
    languages.detect("Antworte bitte immer auf Deutsch.")  # and build the language detector (once per process)
    sizes = (10, 30) if quick else (10, 300)
    planning(sizes, args.before)
    through_http(sizes, 0 if quick else 20_000)
    print(
        "\nmax / 100 ms: the worst /healthz answer as a share of the bound (the rest of the path counts too:"
        " validation, hashing, the forwarded body). Writer held: the longest write transaction."
    )
    print(f"caps: {flow.MAX_NEW_PER_MESSAGE} new items per message, {flow.MAX_OPEN_ITEMS} open items per conversation"
          " (proxy/engine/standing/flow.py); one run of each row.")  # fmt: skip
