"""Added latency, CPU and throughput of lcm-proxy against comparators, all on loopback, measured in one run.

Every server runs in its own process, one at a time, in front of the same fake upstream: a bare aiohttp
pass-through (the floor for a Python proxy), a bare ``litellm.acompletion`` forwarder (the cost of LiteLLM
itself, chat only), LiteLLM's own proxy server (its own virtualenv, no database; see ``bench/litellm_proxy.py``)
and lcm-proxy. The baseline is the fake upstream called directly by the same client.

1. Latency, one client at a time, per door and kind of deployment (``bench/overhead_doors.py``): a first turn, a
   continuation, a re-send, a streamed first turn (first SSE data line, and the end). p50/p99, both minus the
   baseline's ("added"), and the server process's CPU time per request (user + system, all its threads, from
   /proc: unlike wall time it hardly moves with the machine's load).
2. Chat only: a long conversation (300 messages, ~12k tokens) that lcm-proxy has already compacted (an 8k-token
   window; compacted during warm-up).
3. Throughput of first turns at 1, 8 and 64 concurrent clients (chat), and at 64 for the other doors.
4. lcm-proxy's figures divided by each comparator's, next to the targets of the performance issue.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import yaml

from bench import litellm_proxy, overhead_tables
from bench.ingest import transcript
from bench.overhead_doors import (
    AIOHTTP,
    BASELINE,
    CHAT_DOOR,
    DOORS,
    JSON_HEADERS,
    LCM,
    LITELLM_PROXY,
    LITELLM_SDK,
    REQUESTS,
    Door,
    lcm_deployments,
    litellm_deployments,
)

REPO = Path(__file__).resolve().parent.parent

CLIENTS = (1, 8, 64)
LONG_MESSAGES = 300  # system prompt + 299 turns, ending with a user turn
LONG_WINDOW = 8000  # lcm-proxy's max_input_tokens for the long conversation: well under its ~12k tokens
LONG_BODY = orjson.dumps({"model": "long", "messages": transcript(LONG_MESSAGES - 1)})


class BenchError(Exception):
    """A server failed to start or answered wrongly."""


@dataclass(frozen=True)
class Counts:
    requests: int  # per latency cell and per throughput cell
    warmup: int  # per cell, before measuring (LiteLLM's first calls import a lot)

    def at(self, clients: int) -> Counts:
        # Every client must send a few requests, or a throughput cell measures the ramp-up, not the server.
        return Counts(max(self.requests, 4 * clients), max(self.warmup, clients))

    @classmethod
    def pick(cls, quick: bool) -> Counts:
        return cls(requests=40, warmup=8) if quick else cls(requests=400, warmup=30)


@dataclass(frozen=True)
class Server:
    name: str
    args: list[str]
    port: int
    ready_path: str = "/healthz"
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = REPO
    startup_timeout: float = 90.0


@dataclass
class Cell:
    """One cell's measurements: seconds to the end (and to the first SSE data line), the server's CPU ms per
    request, requests per second."""

    total: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    cpu_ms: float = 0.0
    rps: float = 0.0


# (server, door path, kind of deployment, request kind or "load<clients>" or "long") -> Cell
Results = dict[tuple[str, str, str, str], Cell]


# --- processes ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def process(server: Server, log: Path) -> Iterator[tuple[str, float, int]]:
    """Start ``server``, wait until its readiness path answers 200, yield its URL, the seconds that took and
    its process id."""
    env = {**os.environ, **server.env}
    started = time.monotonic()
    with log.open("wb") as out:
        child = subprocess.Popen(server.args, cwd=server.cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{server.port}"
    try:
        wait_ready(child, url + server.ready_path, server.startup_timeout, log)
        yield url, time.monotonic() - started, child.pid
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def wait_ready(child: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise BenchError(f"exited with status {child.returncode} before it was ready:\n{tail(log)}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise BenchError(f"not ready after {timeout:.0f} s ({url}):\n{tail(log)}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process (all its threads) so far, from /proc (Linux); 0 elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), from /proc (Linux); 0 when unavailable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def our_server(name: str, args: list[str], port: int, ready_path: str = "/healthz") -> Server:
    env = {"PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return Server(name, [sys.executable, *args], port, ready_path=ready_path, env=env)


def lcm_proxy_server(upstream: str, tmp: Path) -> Server:
    port = free_port()
    long = {
        "model_name": "long",
        "litellm_params": {"model": "openai/long", "api_base": f"{upstream}/v1", "api_key": "k-12345678"},
        "model_info": {"max_input_tokens": LONG_WINDOW},  # small, so lcm-proxy compacts it (during warm-up)
    }
    settings = {
        "model_list": [*lcm_deployments(upstream), long],
        "general_settings": {"port": port, "data_dir": str(tmp / "lcm-data"), "log_level": "warning"},
    }
    config = tmp / "lcm-proxy.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    return our_server(LCM, ["-m", "proxy", "serve", "--config", str(config)], port)


def comparators(upstream: str, tmp: Path, litellm_exe: Path | None) -> list[Server]:
    servers = []
    for name, kind in ((AIOHTTP, "aiohttp"), (LITELLM_SDK, "litellm")):
        port = free_port()
        servers.append(our_server(name, ["-m", "bench.servers", kind, str(port), upstream], port))
    if litellm_exe is not None:
        port = free_port()
        config = tmp / "litellm-proxy.yaml"
        litellm_proxy.write_config(config, upstream, ["long"], litellm_deployments(upstream))
        servers.append(
            Server(
                LITELLM_PROXY,
                litellm_proxy.command(litellm_exe, config, port),
                port,
                ready_path=litellm_proxy.READY_PATH,
                env=litellm_proxy.ENV,
                cwd=tmp,  # nothing of this repository (a .env, our packages) leaks into it
                startup_timeout=litellm_proxy.STARTUP_TIMEOUT,
            )
        )
    return servers


# --- requests ----------------------------------------------------------------------------------------------


async def send(session: aiohttp.ClientSession, door: Door, body: bytes, stream: bool) -> tuple[float, float]:
    """One request: (seconds to the first SSE data line, or to the whole body; seconds to the end)."""
    start = time.perf_counter()
    async with session.post(door.path, data=body, headers=door.headers) as response:
        if response.status != 200:
            raise BenchError(f"{door.path}: HTTP {response.status}: {(await response.read())[:300]!r}")
        if not stream:
            await response.read()
            total = time.perf_counter() - start
            return total, total
        first: float | None = None
        last = b""
        ended = False
        async for line in response.content:
            if line.startswith(b"data:"):
                if first is None:
                    first = time.perf_counter() - start
                last = line.strip()
                ended = ended or door.end in last
        if first is None or not ended:
            raise BenchError(f"the {door.path} stream ended without {door.end!r}: {last[:200]!r}")
        return first, time.perf_counter() - start


async def drive(url: str, pid: int, door: Door, bodies: Any, stream: bool, clients: int, counts: Counts) -> Cell:
    """``counts.requests`` requests from ``clients`` concurrent clients (each with its own kept-alive connection)
    after a warm-up through the same clients. ``bodies(i)`` is request i's body (warm-up first: the same ``i``
    for the same counts, so a continuation row continues the first-turn row's conversations)."""
    connector = aiohttp.TCPConnector(limit=clients)
    numbers = itertools.count()
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def run(total: int) -> list[tuple[float, float]]:
            remaining = total
            timings: list[tuple[float, float]] = []

            async def client() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    timings.append(await send(session, door, bodies(next(numbers)), stream))

            await asyncio.gather(*(client() for _ in range(clients)))
            return timings

        await run(max(counts.warmup, clients))  # also opens every client's kept-alive connection
        cpu, started = cpu_seconds(pid), time.perf_counter()
        timings = await run(counts.requests)
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    return Cell(
        total=[t for _, t in timings],
        first=[f for f, _ in timings],
        cpu_ms=cpu * 1000 / counts.requests,
        rps=counts.requests / elapsed,
    )


async def measure(server: str, url: str, pid: int, counts: Counts, results: Results, notes: list[str]) -> None:
    """Every cell of ``server``: each door it has, each kind of deployment, each request, then the loads. A
    comparator's cell that fails costs that cell (and a note), not the server's other cells."""

    async def cell(key: tuple[str, str, str, str], door: Door, bodies: Any, stream: bool, clients: int) -> None:
        try:
            results[key] = await drive(url, pid, door, bodies, stream, clients, counts.at(clients))
        except (BenchError, aiohttp.ClientError, TimeoutError) as error:
            if server == LCM:
                raise
            notes.append(f"{server}, {door.path} {key[2]} {key[3]}: skipped ({str(error)[:160]})")

    for door in DOORS:
        if server not in (BASELINE, LCM, *door.servers):
            continue
        # The fake speaks each door natively, and the aiohttp forwarder only passes a door's path through.
        kinds = door.kinds[:1] if server in (BASELINE, AIOHTTP) else door.kinds
        for kind, model in kinds:
            tag = f"{door.path}:{model}"
            for _, request, stream in REQUESTS:
                turns = "first" if request == "continue" else request  # the first-turn row's conversations
                bodies = functools.partial(door.body, model, request, f"{tag}:{turns}")
                await cell((server, door.path, kind, request), door, bodies, stream, 1)
            for clients in CLIENTS if door is CHAT_DOOR else CLIENTS[-1:]:
                bodies = functools.partial(door.body, model, "first", f"{tag}:load{clients}")
                await cell((server, door.path, kind, f"load{clients}"), door, bodies, False, clients)
    await cell((server, CHAT_DOOR.path, CHAT_DOOR.kinds[0][0], "long"), CHAT_DOOR, lambda i: LONG_BODY, False, 1)


async def lcm_long_state(url: str) -> str:
    """What lcm-proxy did with the long conversation on one more request, from its response headers."""
    async with (
        aiohttp.ClientSession(url) as session,
        session.post("/v1/chat/completions", data=LONG_BODY, headers=JSON_HEADERS) as response,
    ):
        await response.read()
        sent = response.headers.get("x-lcm-tokens-sent")
        forwarded = response.headers.get("x-lcm-tokens-forwarded")
        state = response.headers.get("x-lcm-compaction")
    note = f"lcm-proxy forwarded {forwarded} of the {sent} tokens it was sent (compaction on that request: {state})"
    if state != "none" or forwarded is None or sent is None or int(forwarded) >= int(sent):
        note += " — NOT the steady compacted state this row is meant to measure"
    return note


def main(quick: bool = False) -> None:
    counts = Counts.pick(quick)
    litellm_exe, skipped = litellm_proxy.executable(create=not quick)
    notes = [
        "added = the server's p50 (p99) minus the baseline's: the fake upstream called directly by the same client,"
        " on the door's own route (a translated row's added time includes the fake's chat answer instead).",
        "CPU = the server process's user + system CPU time (all threads) per request over the cell.",
        f"¹ long: the same {LONG_MESSAGES}-message transcript is sent to every server. The comparators forward all"
        f" of it; lcm-proxy ({LONG_WINDOW}-token window, compacted during warm-up) forwards far less, so this row"
        " also credits lcm-proxy with what forwarding less saves downstream.",
    ]
    notes += [skipped] if litellm_exe is None else []
    startups: list[str] = []
    peaks: list[str] = []
    load_before = os.getloadavg()[0]
    results: Results = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        upstream_port = free_port()
        args = ["-m", "bench.servers", "fake", str(upstream_port)]
        fake = our_server("fake upstream", args, upstream_port, ready_path="/v1/models")  # it has no /healthz
        with process(fake, tmp / "fake.log") as (upstream, _, fake_pid):
            asyncio.run(measure(BASELINE, upstream, fake_pid, counts, results, notes))
            for server in [*comparators(upstream, tmp, litellm_exe), lcm_proxy_server(upstream, tmp)]:
                try:
                    with process(server, tmp / f"{server.port}.log") as (url, startup, pid):
                        startups.append(f"{server.name} {startup:.1f}")
                        asyncio.run(measure(server.name, url, pid, counts, results, notes))
                        peaks.append(f"{server.name} {peak_rss_mib(pid):.0f}")
                        if server.name == LCM:
                            notes.append(asyncio.run(lcm_long_state(url)) + ".")
                except (BenchError, aiohttp.ClientError, TimeoutError) as error:
                    if server.name == LCM:
                        raise
                    # A comparator that cannot run costs its columns, not the whole benchmark.
                    results = {k: v for k, v in results.items() if k[0] != server.name}
                    notes.append(f"{server.name} skipped: {error}")
    notes.append(f"seconds from start to ready: {', '.join(startups)}")
    notes.append(f"peak RSS of the server process after its run, MiB: {', '.join(peaks)}")
    notes.append(f"load average (1 min) before / after the run: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    overhead_tables.print_all(results, counts.requests, counts.at(64).requests, notes)
