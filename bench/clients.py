"""The HTTP client the proxy sends its own calls with: httpx (LiteLLM's OpenAI SDK, and the proxy's first direct
path) against aiohttp (``proxy.upstream.pool``), each posting the same chat request to the same fake upstream on
loopback, one request at a time, through one kept-alive connection, the answer read whole and parsed.

Reported per client: CPU time per request of this process (user + system: what the proxy's event loop spends on
the client, whatever the machine's load) and the wall-clock median, each measured twice, alternating.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import orjson

from bench.overhead import free_port, our_server, process

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hello there, how are you today?"}]})
HEADERS = {"content-type": "application/json", "authorization": "Bearer k-12345678"}


async def with_httpx(url: str, requests: int) -> tuple[float, list[float]]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5)) as client:

        async def one() -> None:
            request = client.build_request("POST", url, content=BODY, headers=HEADERS)
            response = await client.send(request, stream=True)
            data = b"".join([chunk async for chunk in response.aiter_raw()])
            await response.aclose()
            orjson.loads(data)

        return await timed(one, requests)


async def with_aiohttp(url: str, requests: int) -> tuple[float, list[float]]:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def one() -> None:
            async with session.post(url, data=BODY, headers=HEADERS, allow_redirects=False) as response:
                data = await response.read()
            orjson.loads(data)

        return await timed(one, requests)


async def timed(one: Callable[[], Awaitable[None]], requests: int) -> tuple[float, list[float]]:
    for _ in range(max(20, requests // 10)):  # warm-up: the connection opened, the code paths warm
        await one()
    walls = []
    cpu = time.process_time()
    for _ in range(requests):
        started = time.perf_counter()
        await one()
        walls.append(time.perf_counter() - started)
    return (time.process_time() - cpu) * 1000 / requests, walls


def main(quick: bool = False) -> None:
    requests = 200 if quick else 2000
    port = free_port()
    fake = our_server("fake upstream", ["-m", "bench.servers", "fake", str(port)], port, ready_path="/v1/models")
    rows: dict[str, list[tuple[float, float]]] = {"httpx": [], "aiohttp": []}
    with tempfile.TemporaryDirectory() as tmp, process(fake, Path(tmp) / "fake.log") as (base, _, _):
        url = f"{base}/v1/chat/completions"
        for _ in range(2):
            for name, run in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
                cpu, walls = asyncio.run(run(url, requests))
                rows[name].append((cpu, statistics.median(walls) * 1000))
    print(f"\n## clients: one chat request to the fake upstream, {requests} per run, two runs each\n")
    print("| client | CPU ms/request (runs) | wall p50 ms (runs) | CPU ÷ aiohttp |")
    print("|---|---:|---:|---:|")
    best = {name: min(cpu for cpu, _ in runs) for name, runs in rows.items()}
    for name, runs in rows.items():
        cpus = " / ".join(f"{cpu:.3f}" for cpu, _ in runs)
        walls = " / ".join(f"{wall:.3f}" for _, wall in runs)
        print(f"| {name} | {cpus} | {walls} | {best[name] / best['aiohttp']:.2f}x |")
    sys.stdout.flush()
