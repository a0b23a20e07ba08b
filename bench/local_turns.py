"""Local turns (issue 32): the seconds of each turn, and the prompt tokens llama.cpp re-reads, when lcm-proxy
sits in front of a small local model.

A 40-turn chat (each user turn ~90 tokens with one new fact, answers capped at ``--max-tokens``) against
llama.cpp (``xllamacpp``, Qwen2.5-Coder-0.5B-Instruct by default, ``n_ctx`` 2,048, one slot) three ways:

- **lcm-proxy**: ``lcm-proxy serve`` in its own process with the example config (``config/proxy.yaml``,
  unchanged but for the server's address, port and data dir; the server's 2,048 is learned from ``GET /props``),
  the user pausing ``--pause`` seconds between turns (reading the answer, typing the next question);
- **client sends everything**: the whole transcript every turn, while llama.cpp accepts it;
- **client truncates**: the newest whole turns that fit the same window (o200k count x 1.1, the proxy's margin
  for local servers, plus ``max_tokens``), the oldest dropped one turn at a time.

Every call reaches llama.cpp through a recording forwarder (``bench.fidelity.RecordingUpstream``), which keeps
llama.cpp's ``timings.prompt_n`` (prompt tokens it evaluated: everything after the first token that differs
from what its slot holds) and tells the proxy's summariser calls from chat calls. Per turn: the client's
latency, chat ``prompt_n``, and the summariser calls made inside the turn or in the pause after it. The phases
are split at the turn where lcm-proxy's compaction starts (its ``x-lcm-compaction`` header is no longer
``none``), the same turn for every way.

``--fake`` runs the same against ``tests/support/slot.py`` (a one-slot fake llama.cpp that counts re-read
tokens with o200k): seconds there mean nothing, ``prompt_n`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.fidelity import DEFAULT_MODEL_FILE, MODEL_CACHE, RecordingUpstream
from bench.llama import free_port, llama_server
from proxy.tokens import count_messages
from tests.support.servers import serve_in_thread
from tests.support.sim import is_summary_request

REPO = Path(__file__).resolve().parent.parent
WINDOW = 2048
MARGIN = 1.1  # the proxy's token margin for a server on this machine (proxy.tokens.token_margin)
SYSTEM = "You are a friendly, concise assistant. Answer in two or three sentences."
PROJECTS = ["garden shed", "bread oven", "bike trip", "telescope", "chess club", "bird survey", "pottery kiln"]
THINGS = ["budget", "deadline", "supplier", "colour", "room number", "contact", "parts count"]


def user_text(turn: int) -> str:
    """One turn: a new fact and a question, about 90 o200k tokens."""
    project, thing = PROJECTS[turn % len(PROJECTS)], THINGS[turn * 3 % len(THINGS)]
    value = f"{(turn * 7919) % 9000 + 1000}"
    return (
        f"Turn {turn + 1}. A note for the {project}: its {thing} is now {value}, please remember that. "
        f"I am planning the next steps for the {project} this week and want to avoid the mistakes I made last "
        f"time, when I ran out of time and money halfway. What is one thing I should check first, given the "
        f"{thing} I just told you about and that I only have weekends to work on it?"
    )


@dataclass
class Turn:
    status: int
    seconds: float
    prompt_n: int | None  # llama.cpp's evaluated prompt tokens, the turn's chat calls together
    compaction: str = "-"
    summaries_inside: int = 0  # summariser calls that started while the client waited for this turn
    summaries_after: int = 0  # ... that started in the pause after it
    summary_prompt_n: int = 0  # their evaluated prompt tokens


@dataclass
class Way:
    name: str
    turns: list[Turn] = field(default_factory=list)
    failed_from: int | None = None  # the first turn llama.cpp refused (a client sending everything stops there)
    changes_from: int | None = None  # the first turn its forwarded context is not the plain transcript
    retries: int = 0  # requests a truncating client sent again, cut deeper, after a refusal


CallLog = Callable[[], list[tuple[float, bool, int | None]]]  # (started, summariser?, prompt_n) of every call


class Truncating:
    """A client that truncates: the system message and the newest whole turns that fit the window by its own
    count (o200k times a margin); refused, it raises the margin by a tenth and sends again (``drive``)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.margin = MARGIN

    def __call__(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return truncated(messages, self.max_tokens, self.margin)


def truncated(messages: list[dict[str, Any]], max_tokens: int, margin: float = MARGIN) -> list[dict[str, Any]]:
    """The system message and the newest whole turns that fit the window."""
    system, rest = messages[:1], messages[1:]
    while len(rest) > 1 and count_messages(system + rest) * margin + max_tokens > WINDOW:
        rest = rest[2:] if len(rest) > 2 and rest[1].get("role") == "assistant" else rest[1:]
    return system + rest


def drive(
    name: str,
    url: str,
    model: str,
    log: CallLog,
    turns: int,
    max_tokens: int,
    pause: float,
    shape: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
) -> Way:
    way = Way(name)
    windows: list[tuple[float, float]] = []  # each turn's request and answer times
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    with httpx.Client(timeout=1800) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": user_text(turn)})
            sent = shape(messages) if shape else messages
            if sent != messages and way.changes_from is None:
                way.changes_from = turn + 1
            before = time.perf_counter()
            body = {"model": model, "messages": sent, "max_tokens": max_tokens, "temperature": 0}
            response = client.post(f"{url}/v1/chat/completions", json=body)
            while response.status_code == 400 and isinstance(shape, Truncating) and shape.margin < 2:
                shape.margin += 0.1  # refused: the server counts more than the client thought; cut deeper
                way.retries += 1
                body["messages"] = shape(messages)
                response = client.post(f"{url}/v1/chat/completions", json=body)
            after = time.perf_counter()
            compaction = response.headers.get("x-lcm-compaction", "-")
            if compaction not in ("-", "none") and way.changes_from is None:
                way.changes_from = turn + 1
            if pause and turn < turns - 1:
                time.sleep(pause)
            windows.append((before, after))
            chat = [c[2] for c in log() if not c[1] and before <= c[0] <= after and c[2] is not None]
            prompt_n = sum(n or 0 for n in chat) if chat else None  # (a refused request evaluates nothing)
            way.turns.append(Turn(response.status_code, after - before, prompt_n, compaction))
            print(f"{name}, turn {turn + 1}: HTTP {response.status_code}, {after - before:.1f} s, prompt_n {prompt_n},"
                  f" {compaction}", file=sys.stderr, flush=True)  # fmt: skip
            if response.status_code != 200:
                if way.failed_from is None:
                    way.failed_from = turn + 1
                if shape is None and "x-lcm-compaction" not in response.headers:
                    break  # a client sending everything cannot go on: every later turn is longer still
                messages.pop()
                continue
            answer = response.json()["choices"][0]["message"]
            messages.append({"role": "assistant", "content": answer.get("content") or ""})
    if pause:
        time.sleep(pause)  # the summaries the last answer scheduled
    attribute(way, windows, log())
    return way


def attribute(way: Way, windows: list[tuple[float, float]], calls: list[tuple[float, bool, int | None]]) -> None:
    """Each summariser call to the turn it started in (the client was waiting) or the pause after it."""
    for started, summary, prompt_n in calls:
        if not summary or not windows or started < windows[0][0]:
            continue
        index = max(i for i, (before, _) in enumerate(windows) if before <= started)
        turn = way.turns[index]
        if started <= windows[index][1]:
            turn.summaries_inside += 1
            if way.changes_from is None or way.changes_from > index + 1:
                way.changes_from = index + 1
        else:
            turn.summaries_after += 1
        turn.summary_prompt_n += prompt_n or 0


@contextlib.contextmanager
def proxy_process(upstream: str, data_dir: str) -> Iterator[str]:
    """``lcm-proxy serve`` with the example config, pointed at ``upstream``; yields its base URL."""
    raw = yaml.safe_load((REPO / "config" / "proxy.yaml").read_text())
    (entry,) = raw["model_list"]
    entry["litellm_params"]["api_base"] = f"{upstream}/v1"
    port = free_port()
    raw["general_settings"].update({"port": port, "data_dir": data_dir})
    config = Path(data_dir) / "proxy.yaml"
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=REPO,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    out.seek(0)
                    raise RuntimeError("lcm-proxy did not start:\n" + out.read()[-3000:].decode(errors="replace"))
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


WAYS = ("proxy", "everything", "truncate")


def run_ways(upstream: str, log: CallLog, args: argparse.Namespace) -> list[Way]:
    ways = []
    if "proxy" in args.ways:
        with tempfile.TemporaryDirectory() as tmp, proxy_process(upstream, f"{tmp}/proxy") as proxy:
            ways.append(drive("lcm-proxy", proxy, "local", log, args.turns, args.max_tokens, args.pause))
    if "everything" in args.ways:
        ways.append(drive("client sends everything", upstream, "local-model", log, args.turns, args.max_tokens, 0))
    if "truncate" in args.ways:
        trim = Truncating(args.max_tokens)
        ways.append(drive("client truncates", upstream, "local-model", log, args.turns, args.max_tokens, 0, trim))
    return ways


def run_real(args: argparse.Namespace) -> list[Way]:
    recorder = RecordingUpstream(backend=None)
    with llama_server(args.model, WINDOW, args.threads) as llama:
        recorder.backend = llama

        def log() -> list[tuple[float, bool, int | None]]:
            return [(c.started, is_summary_request(c.body), c.prompt_n) for c in list(recorder.calls)]

        with serve_in_thread(recorder.app) as upstream:
            return run_ways(upstream, log, args)


def run_fake(args: argparse.Namespace) -> list[Way]:
    from tests.support.slot import SlotServer

    slot = SlotServer(n_ctx=WINDOW, verbose=True)  # answers and summaries as long as they may be

    def log() -> list[tuple[float, bool, int | None]]:
        return [(c.started, c.summary, c.prompt_n) for c in list(slot.calls)]

    with serve_in_thread(slot.app) as upstream:
        return run_ways(upstream, log, args)


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def print_tables(ways: list[Way], args: argparse.Namespace, model: str) -> None:
    proxied = next((w for w in ways if w.name == "lcm-proxy"), Way("lcm-proxy"))
    others = [w.changes_from for w in ways if w.changes_from]
    start = proxied.changes_from or (others[0] if others else None) or args.turns + 1
    print(
        f"\n## local turns: {model}, llama.cpp n_ctx {WINDOW}, {args.turns} turns, max_tokens {args.max_tokens},"
        f" {args.threads} threads, pause between lcm-proxy's turns {args.pause:g} s\n"
    )
    print(
        f"Phases split at turn {start}, where lcm-proxy's compaction starts (else where the context first changes).\n"
    )
    print(
        "| way | turns answered | refused from turn | context changes from turn | median s before | median s after |"
        " after / before | max s | median prompt_n before | median prompt_n after | max prompt_n after |"
        " chat prompt_n total | summariser calls inside turns / between | summariser prompt_n total |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for way in ways:
        ok = [(i + 1, t) for i, t in enumerate(way.turns) if t.status == 200]
        before = [t for i, t in ok if i < start]
        after = [t for i, t in ok if i >= start]
        s_before = [t.seconds for t in before]
        s_after = [t.seconds for t in after]
        ratio = f"{statistics.median(s_after) / statistics.median(s_before):.2f}x" if s_before and s_after else "-"
        n_before = [float(t.prompt_n) for t in before if t.prompt_n is not None]
        n_after = [float(t.prompt_n) for t in after if t.prompt_n is not None]
        total = sum(t.prompt_n or 0 for _, t in ok)
        inside = sum(t.summaries_inside for t in way.turns)
        between = sum(t.summaries_after for t in way.turns)
        print(
            f"| {way.name} | {len(ok)}/{args.turns} | {way.failed_from or '-'} | {way.changes_from or '-'} |"
            f" {_median(s_before)} | {_median(s_after)} | {ratio} | {max((t.seconds for _, t in ok), default=0):.1f} |"
            f" {_median(n_before)} | {_median(n_after)} | {max(n_after, default=0):.0f} | {total} |"
            f" {inside} / {between} | {sum(t.summary_prompt_n for t in way.turns)} |"
        )
    for way in ways:
        if way.retries:
            print(f"\n{way.name}: {way.retries} requests refused by the server and sent again, cut deeper.")
    print("\n### per turn (seconds / llama.cpp prompt_n; lcm-proxy also: x-lcm-compaction, summariser calls inside"
          " + after the turn, their prompt_n)\n")  # fmt: skip
    print(
        "| turn | "
        + " | ".join(w.name for w in ways)
        + " | lcm-proxy compaction | summaries in + after | their prompt_n |"
    )
    print("|---:|" + "---:|" * len(ways) + "---|---:|---:|")
    for i in range(args.turns):
        cells = []
        for way in ways:
            t = way.turns[i] if i < len(way.turns) else None
            if t is None:
                cells.append("-")
            elif t.status != 200:
                cells.append(f"HTTP {t.status}")
            else:
                cells.append(f"{t.seconds:.1f} / {t.prompt_n if t.prompt_n is not None else '?'}")
        p = proxied.turns[i] if i < len(proxied.turns) else Turn(0, 0, None)
        print(f"| {i + 1} | " + " | ".join(cells) + f" | {p.compaction} | {p.summaries_inside} + {p.summaries_after}"
              f" | {p.summary_prompt_n} |")  # fmt: skip


def parse_args(argv: list[str], quick: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench local-turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL_CACHE / DEFAULT_MODEL_FILE, help="GGUF file")
    parser.add_argument("--turns", type=int, default=16 if quick else 40)
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every chat request")
    parser.add_argument("--pause", type=float, help="seconds the user waits between lcm-proxy's turns (default 10)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="llama.cpp threads")
    parser.add_argument("--fake", action="store_true", help="a one-slot fake llama.cpp (tests/support/slot.py)")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)} (default: all)")
    args = parser.parse_args(argv)
    args.ways = args.ways.split(",")
    if unknown := set(args.ways) - set(WAYS):
        parser.error(f"unknown ways {', '.join(sorted(unknown))}")
    if args.pause is None:
        args.pause = 0.5 if args.fake else 10.0
    return args


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    args = parse_args(argv or [], quick)
    start = time.perf_counter()
    if args.fake:
        ways = run_fake(args)
        print_tables(ways, args, "fake one-slot llama.cpp (tests/support/slot.py)")
    else:
        if not args.model.exists():
            print(
                f"\n## local turns: skipped, no model at {args.model} (--model PATH, or python -m bench fidelity --fetch-model)"
            )
            return
        ways = run_real(args)
        print_tables(ways, args, f"{args.model.name} ({args.model.stat().st_size / 1e6:.0f} MB)")
    print(f"\nwall time of the whole run: {time.perf_counter() - start:.0f} s")
