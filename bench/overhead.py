"""Added latency and throughput of lcm-proxy against comparators, all on loopback, measured in one run.

Every server runs in its own process, one at a time, in front of the same fake upstream: a bare aiohttp
pass-through (the floor for a Python proxy), a bare ``litellm.acompletion`` forwarder (the cost of LiteLLM
itself), LiteLLM's own proxy server (its own virtualenv, no database; see ``bench/litellm_proxy.py``) and
lcm-proxy. The baseline is the fake upstream called directly by the same client.

1. Latency, one client at a time: a short non-streaming request; a short streaming request (time to the first
   SSE ``data:`` line, and to the end of the stream); and a long conversation (300 messages, ~12k tokens) that
   lcm-proxy has already compacted (an 8k-token window; compacted during warm-up). p50/p99, and both minus the
   baseline's ("added").
2. Anthropic's ``/v1/messages``, one client at a time: a short request, non-streaming and streaming, through
   lcm-proxy's Messages door to an Anthropic deployment (native: the fake's own ``/v1/messages``) and to an
   OpenAI-compatible one (translated to the fake's ``/v1/chat/completions``), and through LiteLLM proxy's
   ``/v1/messages`` to the same two kinds of deployment. The baseline is the fake's ``/v1/messages`` called
   directly. The bare forwarders have no such route.
3. OpenAI's ``/v1/responses``, the same way: through lcm-proxy's Responses door to an ``openai/responses/``
   deployment (native: the fake's own ``/v1/responses``) and to an ``openai/`` chat one (translated), and
   through LiteLLM proxy's ``/v1/responses`` to the same two. The baseline is the fake's ``/v1/responses``.
   (``bench/overhead_doors.py`` holds both doors' requests, deployments and tables.)
4. Throughput of the short non-streaming request at 1, 8 and 64 concurrent clients.
5. lcm-proxy's figures divided by each comparator's, next to the targets of the performance issue.
"""

from __future__ import annotations

import asyncio
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

from bench import litellm_proxy
from bench.ingest import transcript
from bench.overhead_doors import (
    AIOHTTP,
    BASELINE,
    COMPARATORS,
    DOOR_ROWS,
    DOORS,
    JSON_HEADERS,
    LCM,
    LITELLM_PROXY,
    LITELLM_SDK,
    SHORT_MESSAGES,
    Door,
    DoorResult,
    added_p50,
    door_ratio_rows,
    latency_rows,
    lcm_deployments,
    litellm_deployments,
    p,
    print_door_table,
    ratio,
)

REPO = Path(__file__).resolve().parent.parent

CLIENTS = (1, 8, 64)
LONG_MESSAGES = 300  # system prompt + 299 turns, ending with a user turn
LONG_WINDOW = 8000  # lcm-proxy's max_input_tokens for the long conversation: well under its ~12k tokens

SHORT = {"model": "m", "messages": SHORT_MESSAGES}
# Bodies are encoded once: the client's own JSON encoding would otherwise be part of every figure.
SHORT_BODY = orjson.dumps(SHORT)
STREAM_BODY = orjson.dumps({**SHORT, "stream": True})
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
        return cls(requests=40, warmup=8) if quick else cls(requests=500, warmup=30)


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
class Result:
    """One server's timings in seconds (``first`` is the time to the first SSE data line)."""

    name: str
    short: list[float] = field(default_factory=list)
    stream_first: list[float] = field(default_factory=list)
    stream_total: list[float] = field(default_factory=list)
    long: list[float] = field(default_factory=list)
    load: dict[int, list[float]] = field(default_factory=dict)  # clients -> latencies
    rps: dict[int, float] = field(default_factory=dict)  # clients -> requests per second


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

    def model(name: str, **info: int) -> dict[str, Any]:
        params = {"model": f"openai/{name}", "api_base": f"{upstream}/v1", "api_key": "k-12345678"}
        return {"model_name": name, "litellm_params": params, "model_info": info}

    config = tmp / "lcm-proxy.yaml"
    settings = {
        # The long conversation's model has a small window, so lcm-proxy compacts it (once, during warm-up).
        "model_list": [
            model("m"),
            model("long", max_input_tokens=LONG_WINDOW),
            *lcm_deployments(upstream),
        ],
        "general_settings": {"port": port, "data_dir": str(tmp / "lcm-data"), "log_level": "warning"},
    }
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
        litellm_proxy.write_config(config, upstream, ["m", "long"], litellm_deployments(upstream))
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


async def send(
    session: aiohttp.ClientSession, body: bytes, stream: bool, door: Door | None = None
) -> tuple[float, float]:
    """One chat request, or one to ``door``: (seconds to the first SSE data line, or to the whole body; seconds
    to the end)."""
    start = time.perf_counter()
    path, headers = (door.path, door.headers) if door else ("/v1/chat/completions", JSON_HEADERS)
    async with session.post(path, data=body, headers=headers) as response:
        if response.status != 200:
            raise BenchError(f"HTTP {response.status}: {(await response.read())[:300]!r}")
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
                ended = ended or (door is not None and door.end in last)
        if first is None:
            raise BenchError(f"the {path} stream ended without data lines")
        if door and not ended:
            raise BenchError(f"the {door.path} stream ended without {door.end!r}: {last[:200]!r}")
        if not door and last != b"data: [DONE]":
            raise BenchError("the stream ended without [DONE]")
        return first, time.perf_counter() - start


async def drive(
    url: str, body: bytes, stream: bool, clients: int, counts: Counts, door: Door | None = None
) -> tuple[list[tuple[float, float]], float]:
    """``counts.requests`` requests from ``clients`` concurrent clients (each with its own kept-alive connection)
    after a warm-up through the same clients; returns the timings and requests per second."""
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:

        async def run(total: int) -> list[tuple[float, float]]:
            remaining = total
            timings: list[tuple[float, float]] = []

            async def client() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    timings.append(await send(session, body, stream, door))

            await asyncio.gather(*(client() for _ in range(clients)))
            return timings

        await run(max(counts.warmup, clients))  # also opens every client's kept-alive connection
        started = time.perf_counter()
        timings = await run(counts.requests)
        return timings, counts.requests / (time.perf_counter() - started)


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


async def measure(name: str, url: str, counts: Counts) -> Result:
    result = Result(name)
    timings, result.rps[1] = await drive(url, SHORT_BODY, False, 1, counts)
    result.short = result.load[1] = [total for _, total in timings]
    timings, _ = await drive(url, STREAM_BODY, True, 1, counts)
    result.stream_first = [first for first, _ in timings]
    result.stream_total = [total for _, total in timings]
    timings, _ = await drive(url, LONG_BODY, False, 1, counts)
    result.long = [total for _, total in timings]
    for clients in CLIENTS[1:]:
        timings, result.rps[clients] = await drive(url, SHORT_BODY, False, clients, counts.at(clients))
        result.load[clients] = [total for _, total in timings]
    return result


async def measure_door(door: Door, name: str, url: str, model: str, counts: Counts) -> DoorResult:
    result = DoorResult(name)
    timings, _ = await drive(url, door.body(model, False), False, 1, counts, door)
    result.short = [total for _, total in timings]
    timings, _ = await drive(url, door.body(model, True), True, 1, counts, door)
    result.stream_first = [first for first, _ in timings]
    result.stream_total = [total for _, total in timings]
    return result


# --- tables ------------------------------------------------------------------------------------------------


LATENCY_ROWS = (
    *DOOR_ROWS,
    (f"long ({LONG_MESSAGES} messages)¹", "long"),
)


# (comparator, bound, "le" or "ge") per row of the ratio table: the performance issue's targets.
LATENCY_TARGETS = [(LITELLM_SDK, 1.25, "le"), (LITELLM_PROXY, 0.5, "le")]
THROUGHPUT_TARGETS = [(LITELLM_PROXY, 2.0, "ge")]


def verdicts(ours: float, by_name: dict[str, float], targets: list[tuple[str, float, str]]) -> tuple[str, str]:
    wanted, met = [], []
    for name, bound, sense in targets:
        wanted.append(f"{'≤' if sense == 'le' else '≥'} {bound:g}x {name}")
        theirs = by_name.get(name, 0.0)
        if theirs <= 0 or ours <= 0:
            met.append("n/a")
        else:
            value = ours / theirs
            met.append("yes" if (value <= bound if sense == "le" else value >= bound) else "no")
    return ", ".join(wanted), ", ".join(met)


def ratio_rows(results: dict[str, Result]) -> list[str]:
    baseline, ours = results[BASELINE], results[LCM]
    rows = []
    for label, attr in (
        ("added p50: short non-streaming", "short"),
        ("added p50: streaming first byte", "stream_first"),
        ("added p50: long¹", "long"),
    ):
        theirs = {name: added_p50(r, baseline, attr) for name, r in results.items() if name in COMPARATORS}
        mine = added_p50(ours, baseline, attr)
        wanted, met = verdicts(mine, theirs, LATENCY_TARGETS)
        cells = " | ".join(ratio(mine, theirs[n]) if n in theirs else "skipped" for n in COMPARATORS)
        rows.append(f"| {label} | {cells} | {wanted} | {met} |")
    theirs = {name: r.rps[64] for name, r in results.items() if name in COMPARATORS}
    wanted, met = verdicts(ours.rps[64], theirs, THROUGHPUT_TARGETS)
    cells = " | ".join(ratio(ours.rps[64], theirs[n]) if n in theirs else "skipped" for n in COMPARATORS)
    rows.append(f"| req/s at 64 clients | {cells} | {wanted} | {met} |")
    return rows


def print_tables(
    results: dict[str, Result], doors: dict[str, dict[str, DoorResult]], counts: Counts, notes: list[str]
) -> None:
    """The chat tables, each door's latency table (``doors``: by the door's path) and the ratio table."""
    baseline = results[BASELINE]
    print(
        f"\n## overhead: latency, one client at a time ({counts.requests} requests per cell,"
        " every server in its own process)\n"
    )
    print("| in front of the fake upstream | request | p50 ms | p99 ms | added p50 ms | added p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for result in results.values():
        print("\n".join(latency_rows(result, baseline, LATENCY_ROWS)))
    for door in DOORS:
        print_door_table(door, doors[door.path], counts.requests)
    at64 = counts.at(64).requests
    print(
        f"\n## overhead: throughput, short non-streaming request ({counts.requests} requests per cell,"
        f" {at64} at 64 clients)\n"
    )
    print("| in front of the fake upstream | clients | p50 ms | p99 ms | req/s |")
    print("|---|---:|---:|---:|---:|")
    for result in results.values():
        for clients in CLIENTS:
            values = result.load[clients]
            print(
                f"| {result.name} | {clients} | {p(values, 0.5):.2f} | {p(values, 0.99):.2f} | {result.rps[clients]:.0f} |"
            )
    print("\n## overhead: lcm-proxy ÷ comparator (added p50: lower is better; req/s: higher is better)\n")
    print(f"| figure | ÷ {' | ÷ '.join(COMPARATORS)} | targets | met |")
    print("|---|---:|---:|---:|---|---|")
    print("\n".join(ratio_rows(results)))
    for door in DOORS:
        print("\n".join(door_ratio_rows(door, doors[door.path])))
    print()
    for note in notes:
        print(note)


def main(quick: bool = False) -> None:
    counts = Counts.pick(quick)
    litellm_exe, skipped = litellm_proxy.executable(create=not quick)
    notes = [
        "added = the server's p50 (p99) minus the baseline's: the fake upstream called directly by the same client.",
        f"¹ long: the same {LONG_MESSAGES}-message transcript is sent to every server. The comparators forward all"
        f" of it; lcm-proxy ({LONG_WINDOW}-token window, compacted during warm-up) forwards far less, so this row"
        " also credits lcm-proxy with what forwarding less saves downstream (LiteLLM's per-message work, the"
        " upstream's parsing), not only its own cost.",
        "/v1/messages: the baseline is the fake's /v1/messages called directly, for every row: an openai/"
        " (translated) row's added time includes the fake's chat answer instead of its Messages answer. The same"
        " for /v1/responses: its baseline is the fake's /v1/responses.",
    ]
    notes += [skipped] if litellm_exe is None else []
    startups: list[str] = []
    peaks: list[str] = []  # of the process the bench started (children, if a server forks any, not counted)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        upstream_port = free_port()
        args = ["-m", "bench.servers", "fake", str(upstream_port)]
        fake = our_server("fake upstream", args, upstream_port, ready_path="/v1/models")  # it has no /healthz
        with process(fake, tmp / "fake.log") as (upstream, _, _):
            results = {BASELINE: asyncio.run(measure(BASELINE, upstream, counts))}
            doors: dict[str, dict[str, DoorResult]] = {door.path: {} for door in DOORS}
            for door in DOORS:
                for row, model in door.rows[BASELINE]:
                    doors[door.path][row] = asyncio.run(measure_door(door, row, upstream, model, counts))
            for server in [*comparators(upstream, tmp, litellm_exe), lcm_proxy_server(upstream, tmp)]:
                try:
                    with process(server, tmp / f"{server.port}.log") as (url, startup, pid):
                        startups.append(f"{server.name} {startup:.1f}")
                        results[server.name] = asyncio.run(measure(server.name, url, counts))
                        for door in DOORS:
                            for row, model in door.rows.get(server.name, []):
                                try:
                                    doors[door.path][row] = asyncio.run(measure_door(door, row, url, model, counts))
                                except (BenchError, aiohttp.ClientError, TimeoutError) as error:
                                    if server.name == LCM:
                                        raise
                                    notes.append(f"{row} on {door.path} skipped: {error}")
                        peaks.append(f"{server.name} {peak_rss_mib(pid):.0f}")
                        if server.name == LCM:
                            notes.insert(2, asyncio.run(lcm_long_state(url)) + ".")  # right under footnote ¹
                except (BenchError, aiohttp.ClientError, TimeoutError) as error:
                    if server.name == LCM:
                        raise
                    # A comparator that cannot run costs its columns, not the whole benchmark.
                    notes.append(f"{server.name} skipped: {error}")
    notes.append(f"seconds from start to ready: {', '.join(startups)}")
    notes.append(f"peak RSS of the server process after its run, MiB: {', '.join(peaks)}")
    notes.append(f"load average (1 min) before / after the run: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print_tables(results, doors, counts, notes)
