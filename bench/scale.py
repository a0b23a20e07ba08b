"""The proxy's own time per request as a conversation grows, whole and by piece.

For conversations of 10, 100, 1,000 and 5,000 messages, four kinds of request: the first turn of a new
conversation (every message stored), a continuation that appends one exchange to a conversation below the
soft threshold (forwarded untouched: a 1M-token window), the same on a compacted conversation (an
8,192-token window: summaries and a fresh tail are forwarded), and an identical re-send of the last request.

1. In process, one request at a time, with an instant summariser: the engine's ``prepare`` and, around it, the
   door's own work on the body (parse, validation, serialising what is forwarded), split into pieces by
   ``bench.pieces`` (exclusive times, medians over the repeats; the pieces of one request add up to its total).
2. Over HTTP on 127.0.0.1: the whole request through the proxy against the same request sent straight to the
   fake upstream (the baseline, measured in the same run); the difference is what the proxy adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.compaction import InstantSummarizer
from bench.ingest import transcript
from bench.pieces import Pieces
from proxy.app import create_app
from proxy.config.lcm import LcmSettings
from proxy.config.loading import parse_config
from proxy.engine import auto_recall, ingest
from proxy.engine.compose import Composer
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.seen import Seen
from proxy.engine.standing.intake import Intake
from proxy.engine.sweeps import Sweeps
from proxy.store.files import FileStore
from proxy.store.sqlite.store import SQLiteStore
from proxy.store.sqlite.writes import WriteTransaction
from proxy.tokens import count_text
from proxy.wire.chat.validation import fingerprint, validate_chat_request
from tests.support.fakes import FakeUpstream
from tests.support.servers import serve_in_thread

SIZES = (10, 100, 1000, 5000)
BIG, SMALL = 1_000_000, 8192  # windows: nothing compacts / the conversation is compacted
KINDS = ("first turn", "continue", "continue (compacted)", "re-send")
PIECES = (
    "parse body",
    "fingerprint (messages seen before)",
    "validate",
    "hashing (canonical form, chain)",
    "identity (lookup)",
    "rows (canonical JSON, token counts, text)",
    "standing instructions",
    "insert rows + FTS",
    "write transaction (begin, commit, rest)",
    "ingest result (overrides, token sums)",
    "view (roles, costs)",
    "auto-recall",
    "assemble (rest)",
    "engine (rest)",
    "serialise forwarded body",
)


def install(pieces: Pieces) -> None:
    pieces.wrap(Seen, "chains", "hashing (canonical form, chain)")
    pieces.wrap(ingest, "locate", "identity (lookup)")
    pieces.wrap(ingest, "locate_locked", "identity (lookup)")
    pieces.wrap(ingest.Ingestor, "prepare_message", "rows (canonical JSON, token counts, text)")
    for name in ("read", "prepare", "write"):
        pieces.wrap(Intake, name, "standing instructions")
    pieces.wrap(WriteTransaction, "append_messages", "insert rows + FTS")
    pieces.wrap(ingest.Ingestor, "_commit", "write transaction (begin, commit, rest)")
    pieces.wrap(ingest.Ingestor, "_result", "ingest result (overrides, token sums)")
    pieces.wrap(ContextEngine, "_view", "view (roles, costs)")
    pieces.wrap(auto_recall, "place", "auto-recall")
    pieces.wrap(Composer, "compose", "assemble (rest)")
    pieces.wrap(Sweeps, "wait_inline", "inline compaction")
    pieces.wrap(ContextEngine, "prepare", "engine (rest)")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def numbered(n: int, tag: str) -> list[dict[str, Any]]:
    """``transcript(n)`` made unique by ``tag`` (a new conversation each time)."""
    messages = transcript(n)
    if n:
        messages[1] = {**messages[1], "content": f"[{tag}] {messages[1]['content']}"}
    return messages


def extended(messages: list[dict[str, Any]], answer: str, r: int) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": f"next question {r}"}]


class InProcess:
    """One engine over one SQLite store; each ``request`` is measured whole and by piece."""

    def __init__(self, data_dir: Path, pieces: Pieces) -> None:
        self.store = SQLiteStore(data_dir)
        self.engine = ContextEngine(self.store, FileStore(data_dir), LcmSettings())
        self.pieces = pieces

    async def request(self, scope: str, messages: list[dict[str, Any]], window: int) -> tuple[Any, dict[str, float]]:
        budget = Budget(window=window, output_reserve=4096, tools=0)
        body = orjson.dumps({"model": "m", "messages": messages})
        self.pieces.reset()
        start = time.perf_counter()
        with self.pieces.timing("parse body"):
            parsed = orjson.loads(body)
        with self.pieces.timing("fingerprint (messages seen before)"):
            seen = await fingerprint(self.engine.seen, "tenant", parsed, len(body))  # as the chat door does
        with self.pieces.timing("validate"):
            validate_chat_request(parsed, seen)
        prepared = await self.engine.prepare(scope, parsed["messages"], budget, InstantSummarizer(), seen=seen)
        with self.pieces.timing("serialise forwarded body"):
            orjson.dumps({"model": "m", "messages": prepared.messages})
        took = time.perf_counter() - start
        figures = dict(self.pieces.totals)
        figures["total"] = took
        await self.engine.wait_idle(300)  # a background compaction, outside the measurement
        return prepared, figures


async def in_process(n: int, repeats: int, pieces: Pieces) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        run = InProcess(Path(tmp), pieces)
        await run.store.open()
        await run.request("warm-up", numbered(4, "warm-up"), BIG)  # one-time costs (lexicons, detectors)
        for r in range(1 if n >= 1000 else repeats):
            out["first turn"].append((await run.request(f"first-{r}", numbered(n, f"first {r}"), BIG))[1])
        for kind, window in (("continue", BIG), ("continue (compacted)", SMALL)):
            messages = numbered(n, kind)
            prepared, _ = await run.request(kind, messages, window)
            if window == SMALL and n >= 100:
                for _ in range(64):  # until the whole history is compacted and the view is stable
                    if prepared.compaction == "none" and prepared.sent.summaries:
                        break
                    messages = extended(messages, "ok", -1 - _)
                    prepared, _f = await run.request(kind, messages, window)
            for r in range(repeats):
                messages = extended(messages, f"reply {r}", r)
                prepared, figures = await run.request(kind, messages, window)
                out[kind].append(figures)
                if window == BIG:
                    out["re-send"].append((await run.request(kind, messages, window))[1])
        await run.store.close()
    return out


def proxy_config(upstream: str, data_dir: str) -> Any:
    models = [
        {
            "model_name": name,
            "litellm_params": {"model": f"openai/{name}", "api_base": f"{upstream}/v1", "api_key": "k-12345678"},
            "model_info": {"max_input_tokens": window},
        }
        for name, window in (("big", BIG), ("small", SMALL))
    ]
    return parse_config({"model_list": models, "general_settings": {"data_dir": data_dir, "request_timeout": 120}})


def over_http(proxy: str, upstream: str, n: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Per kind: median time through the proxy, and straight to the fake upstream."""
    out: dict[str, tuple[float, float]] = {}
    with httpx.Client(timeout=300) as client:

        def both(model: str, messages: list[dict[str, Any]]) -> tuple[float, float, httpx.Response]:
            start = time.perf_counter()
            client.post(f"{upstream}/v1/chat/completions", json={"model": model, "messages": messages})
            direct = time.perf_counter() - start
            start = time.perf_counter()
            response = client.post(f"{proxy}/v1/chat/completions", json={"model": model, "messages": messages})
            via = time.perf_counter() - start
            assert response.status_code == 200, response.text
            return via, direct, response

        firsts = [both("big", numbered(n, f"http first {r}"))[:2] for r in range(1 if n >= 1000 else repeats)]
        out["first turn"] = (statistics.median(v for v, _ in firsts), statistics.median(d for _, d in firsts))
        for kind, model in (("continue", "big"), ("continue (compacted)", "small")):
            messages = numbered(n, f"http {kind}")
            *_, response = both(model, messages)
            if model == "small" and n >= 100:
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:  # until the background compaction is done
                    answer = response.json()["choices"][0]["message"]["content"]
                    messages = extended(messages, answer, -1)
                    *_, response = both(model, messages)
                    if response.headers["x-lcm-compaction"] == "none" and response.headers["x-lcm-summaries"] != "0":
                        break
                    time.sleep(0.2)
            via, direct, resend_via, resend_direct = [], [], [], []
            for r in range(repeats):
                messages = extended(messages, response.json()["choices"][0]["message"]["content"], r)
                v, d, response = both(model, messages)
                via.append(v)
                direct.append(d)
                if model == "big":
                    v, d, _response = both(model, messages)
                    resend_via.append(v)
                    resend_direct.append(d)
            out[kind] = (statistics.median(via), statistics.median(direct))
            if resend_via:
                out["re-send"] = (statistics.median(resend_via), statistics.median(resend_direct))
    return out


def median_of(rows: list[dict[str, float]], label: str) -> float:
    return statistics.median(row.get(label, 0.0) for row in rows) if rows else 0.0


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="conversation lengths (messages)")
    parser.add_argument("--repeats", type=int, default=None, help="requests per cell (default 15, --quick 3)")
    parser.add_argument("--no-http", action="store_true", help="the in-process tables only")
    args = parser.parse_args(argv or [])
    sizes = [int(s) for s in args.sizes.split(",")]
    repeats = args.repeats or (3 if quick else 15)
    count_text("warm up the tokenizer outside the measurements")
    pieces = Pieces()
    install(pieces)
    try:
        measured = {n: asyncio.run(in_process(n, repeats, pieces)) for n in sizes}
    finally:
        pieces.unwrap()
    print(f"\n## scale: the proxy's own time per request, in process (median ms of {repeats} requests)\n")
    print("| messages | " + " | ".join(KINDS) + " |")
    print("|---:|" + "---:|" * len(KINDS))
    for n in sizes:
        print(f"| {n} | " + " | ".join(ms(median_of(measured[n][kind], "total")) for kind in KINDS) + " |")
    for kind in KINDS:
        print(f"\n## scale: {kind}, by piece (median ms per request; exclusive times)\n")
        labels = [p for p in (*PIECES, "inline compaction") if any(median_of(measured[n][kind], p) for n in sizes)]
        print("| piece | " + " | ".join(f"{n} msgs" for n in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for label in [*labels, "total"]:
            cells = " | ".join(ms(median_of(measured[n][kind], label)) for n in sizes)
            print(f"| {'**total**' if label == 'total' else label} | {cells} |")
    if args.no_http:
        return
    fake = FakeUpstream()
    print(
        "\n## scale: whole request over HTTP, added by the proxy (median ms; baseline: straight to the fake upstream)\n"
    )
    print("| messages | " + " | ".join(f"{kind} added" for kind in KINDS) + " | baseline (continue) |")
    print("|---:|" + "---:|" * (len(KINDS) + 1))
    with serve_in_thread(fake.app) as upstream, tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            with serve_in_thread(create_app(proxy_config(upstream, f"{tmp}/{n}"))) as proxy:
                result = over_http(proxy, upstream, n, repeats)
            cells = " | ".join(ms(result[kind][0] - result[kind][1]) for kind in KINDS)
            print(f"| {n} | {cells} | {ms(result['continue'][1])} |")
