"""Added latency and throughput of lcm-proxy against comparators, all on loopback, measured in one run.

Every server runs in its own process: the fake upstream, a bare aiohttp pass-through (the floor for a
Python proxy), a bare ``litellm.acompletion`` forwarder (the cost of LiteLLM itself) and lcm-proxy. For each,
a short non-streaming chat request is sent at 1, 8 and 64 concurrent clients; the table gives p50/p99
latency, the p50 added over calling the upstream directly (the baseline), and requests per second.
(LiteLLM's own proxy server, in its own virtualenv, is the next comparator to add.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(args: list[str], port: int) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    child = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/healthz", timeout=0.5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        child.terminate()
        child.wait(timeout=20)


async def measure(url: str, concurrency: int, total: int) -> tuple[list[float], float]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello there, how are you today?"}]}
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        for _ in range(min(20, total)):  # warm-up (LiteLLM's first call imports a lot)
            await client.post("/v1/chat/completions", json=body)
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                queue.pop()
                start = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                latencies.append(time.perf_counter() - start)
                assert response.status_code == 200, response.text

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, total / elapsed


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * q))] * 1000


def main(quick: bool = False) -> None:
    total = 100 if quick else 1000
    levels = (1, 8) if quick else (1, 8, 64)
    upstream_port = free_port()
    rows = []
    with (
        process([sys.executable, "-m", "bench.servers", "fake", str(upstream_port)], upstream_port) as upstream,
        tempfile.TemporaryDirectory() as tmp,
    ):
        config = Path(tmp) / "proxy.yaml"
        proxy_port = free_port()
        config.write_text(
            f"model_list: [{{model_name: m, litellm_params: {{model: openai/m, api_base: '{upstream}/v1', api_key: k-12345678}}}}]\n"
            f"general_settings: {{port: {proxy_port}, data_dir: '{tmp}/data', log_level: warning}}\n"
        )
        candidates = [("upstream directly (baseline)", None, [])]
        for name, kind in (("bare aiohttp forwarder", "aiohttp"), ("bare litellm.acompletion forwarder", "litellm")):
            port = free_port()
            candidates.append((name, port, [sys.executable, "-m", "bench.servers", kind, str(port), upstream]))
        candidates.append(("lcm-proxy", proxy_port, [sys.executable, "-m", "proxy", "serve", "--config", str(config)]))
        baseline: dict[int, float] = {}
        for name, port, args in candidates:
            for concurrency in levels:
                if port is None:
                    latencies, rps = asyncio.run(measure(upstream, concurrency, total))
                    baseline[concurrency] = statistics.median(latencies)
                else:
                    with process(args, port) as url:
                        latencies, rps = asyncio.run(measure(url, concurrency, total))
                added = (statistics.median(latencies) - baseline[concurrency]) * 1000
                rows.append((name, concurrency, p(latencies, 0.5), p(latencies, 0.99), added, rps))
    print(f"\n## overhead: short non-streaming request, {total} requests per cell, every server in its own process\n")
    print("| in front of the fake upstream | clients | p50 ms | p99 ms | added p50 ms | req/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, concurrency, p50, p99, added, rps in rows:
        print(f"| {name} | {concurrency} | {p50:.2f} | {p99:.2f} | {added:.2f} | {rps:.0f} |")
