"""Standing instructions: does what the user set stay in force, without anyone asking for it again?

``python -m bench fidelity --standing``. The sessions of ``bench/standing_data.py`` (about twenty planted
rules, hard constraints, preferences, goals and task state, decisions and names per ~130-exchange session,
some updated later in other words) are built turn by turn through the real proxy, exactly as the question
benchmark (``bench/fidelity.py``) builds its histories, at forwarded budgets of 10%, 20% and 30% of the
history's tokens (the model's ``max_input_tokens`` set to the budget plus ``max_tokens``). Then come rounds
of continued conversation (new filler exchanges). At the end of every round, what the upstream received for
that chat request is scored, without asking anything: per item, is its current value present, and is any
of its stale values present. Two baselines, on the same transcript and budget:

- **truncation**: the newest whole messages that fit the budget;
- **summarise once**: when the transcript first exceeds the budget, everything but the newest message
  becomes one summary written by the same weak fake summariser the proxy's summary calls get (the first
  words of its source); from then on the summary goes first and the newest messages that fit follow.

With ``--real`` the proxy's summaries come from the real local model; the chat requests stay on the fake
and the scoring is still presence in what is forwarded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.fidelity import (
    BUILD,
    MODEL_ENV,
    SUMMARIZER,
    ProxyUnderTest,
    RecordingUpstream,
    default_model_path,
    forwarded_tokens,
    llama_server,
    message_text,
    proxy_config,
    proxy_warnings,
    truncated,
    weak_summary,
)
from bench.standing_data import Item, Message, Session, sessions
from proxy.store.records import LEDGER_KINDS
from proxy.tokens import count_messages
from tests.support.servers import serve_in_thread

SHARES = (0.10, 0.20, 0.30)
QUICK_SHARES = (0.20,)
WAYS = ("truncation", "summarise once", "lcm-proxy")
MAX_TOKENS = 48
SUMMARY_WINDOW = 8192  # the summary model's window (and llama.cpp's n_ctx with --real)


# --- scoring -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemScore:
    item: Item
    current: bool  # one of its current values is in the forwarded text
    stale: int  # how many of its stale values are


def score(items: list[Item], messages: list[Message]) -> list[ItemScore]:
    """Presence, case-insensitive, anywhere in the forwarded messages (summaries, ledger, raw tail)."""
    text = message_text(messages).lower()
    return [
        ItemScore(
            item,
            any(v.lower() in text for v in item.current),
            sum(v.lower() in text for v in item.stale),
        )
        for item in items
    ]


@dataclass(frozen=True)
class RoundScore:
    session: str
    share: float  # the budget as a share of the history's tokens
    way: str
    round: int  # 1-based
    tokens: int  # forwarded (messages + tool schemas)
    items: list[ItemScore]

    @property
    def current(self) -> tuple[int, int]:
        return sum(s.current for s in self.items), len(self.items)

    @property
    def stale(self) -> tuple[int, int]:
        return sum(s.stale for s in self.items), sum(len(s.item.stale) for s in self.items)

    def by_kind(self, kind: str) -> tuple[int, int]:
        """Items of ``kind`` whose current value is present."""
        of_kind = [s for s in self.items if s.item.kind == kind]
        return sum(s.current for s in of_kind), len(of_kind)

    @property
    def safety(self) -> tuple[int, int]:
        """Safety rules and hard constraints kept exactly: current present, no stale value present."""
        safe = [s for s in self.items if s.item.safety]
        return sum(s.current and not s.stale for s in safe), len(safe)


# --- the baselines -----------------------------------------------------------------------------------------


def summarised_once(transcripts: Iterator[list[Message]], budget: int) -> Iterator[list[Message]]:
    """What a client that summarises once sends for each successive transcript (each extends the previous)."""
    summary: Message | None = None
    covered = 0
    for transcript in transcripts:
        if summary is None and count_messages(transcript) > budget:
            covered = len(transcript) - 1
            source = "\n".join(f"{m['role']}: {m['content']}" for m in transcript[:covered])
            summary = {"role": "user", "content": weak_summary({"messages": [{"role": "user", "content": source}]})}
        if summary is None:
            yield transcript
            continue
        tail = truncated(transcript[covered:-1], transcript[-1], budget - count_messages([summary]))
        yield [summary, *tail]


# --- one session at one budget, every way ------------------------------------------------------------------


@dataclass
class Run:
    session: Session
    share: float
    budget: int
    scores: list[RoundScore] = field(default_factory=list)
    summarizer_calls: int = 0
    summarizer_seconds: float = 0.0
    compaction: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def requests(session: Session) -> Iterator[tuple[list[Message], int]]:
    """Every chat request a client sends, turn by turn: the transcript ending with a user message, and the
    round it scores (0 while the history is built; ``r`` on round ``r``'s last request)."""
    transcript: list[Message] = []
    turns = [(list(session.messages), 0)] + [(r, i + 1) for i, r in enumerate(session.rounds)]
    for messages, round_ in turns:
        for i in range(0, len(messages), 2):
            transcript.append(messages[i])
            yield list(transcript), round_ if i == len(messages) - 2 else 0
            transcript.append(messages[i + 1])


def run_baselines(run: Run) -> None:
    items = run.session.items
    once = summarised_once((t for t, _ in requests(run.session)), run.budget)
    for (transcript, round_), summarised in zip(requests(run.session), once, strict=True):
        if round_:
            cut = truncated(transcript[:-1], transcript[-1], run.budget)
            for way, sent in (("truncation", cut), ("summarise once", summarised)):
                tokens = count_messages(sent)
                run.scores.append(RoundScore(run.session.script, run.share, way, round_, tokens, score(items, sent)))


def run_proxy(run: Run, upstream: RecordingUpstream, upstream_url: str, real: bool) -> None:
    first = len(upstream.calls)
    with tempfile.TemporaryDirectory() as tmp:
        config = proxy_config(upstream_url, tmp, run.budget, MAX_TOKENS, SUMMARY_WINDOW, real)
        proxy = ProxyUnderTest(config, settle_timeout=3600 if real else 120)
        with serve_in_thread(proxy) as url, httpx.Client(base_url=f"{url}/v1", timeout=3600) as client:
            proxy.watch()
            for transcript, round_ in requests(run.session):
                before = len(upstream.calls)
                body = {"model": "build", "messages": transcript, "max_tokens": MAX_TOKENS, "temperature": 0}
                response = client.post("/chat/completions", json=body)
                if "x-lcm-compaction" in response.headers:
                    run.compaction[response.headers["x-lcm-compaction"]] += 1
                if response.status_code != 200:
                    run.errors.append(f"{response.status_code} {response.text[:300]}")
                proxy.settle(response)
                if round_:
                    calls = upstream.since(before, BUILD)
                    sent = calls[0].body["messages"] if calls else []
                    tokens = forwarded_tokens(calls[0].body) if calls else 0
                    items = score(run.session.items, sent)
                    run.scores.append(RoundScore(run.session.script, run.share, "lcm-proxy", round_, tokens, items))
    summaries = upstream.since(first, SUMMARIZER)
    run.summarizer_calls = len(summaries)
    run.summarizer_seconds = sum(c.seconds for c in summaries)


def run(
    shares: tuple[float, ...], quick: bool, rounds: int, backend: str | None = None, verbose: bool = False
) -> tuple[list[Run], Counter[str]]:
    """Every session at every budget, every way; ``backend`` is a real model's URL for the summaries."""
    runs: list[Run] = []
    upstream = RecordingUpstream(backend)
    with serve_in_thread(upstream.app) as upstream_url, proxy_warnings(verbose) as warnings:
        for session in sessions(quick, rounds):
            for share in shares:
                current = Run(session, share, round(share * session.tokens))
                start = time.perf_counter()
                run_baselines(current)
                run_proxy(current, upstream, upstream_url, backend is not None)
                current.seconds = time.perf_counter() - start
                runs.append(current)
                print(  # progress: a real summariser takes minutes per run
                    f"  {session.script} at {share:.0%}: {current.summarizer_calls} summaries, {current.seconds:.0f} s",
                    file=sys.stderr,
                )
    return runs, warnings


# --- tables ------------------------------------------------------------------------------------------------


def _cell(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part * 100 / whole:.0f}%)" if whole else "-"


def print_tables(runs: list[Run], warnings: Counter[str], model_name: str | None) -> None:
    judge = f"summaries by {model_name}" if model_name else "fake summariser"
    for script in dict.fromkeys(r.session.script for r in runs):
        mine = [r for r in runs if r.session.script == script]
        session = mine[0].session
        print(
            f"\n## standing instructions: {script} session ({len(session.messages) // 2} exchanges,"
            f" {session.tokens} tokens, {len(session.items)} items), {judge}\n"
        )
        print(
            "| budget | way | round | current present | stale present | "
            + " | ".join(LEDGER_KINDS)
            + " | safety 100%? | forwarded tokens |"
        )
        print("|---|---|---:|---:|---:|" + "---:|" * len(LEDGER_KINDS) + "---|---:|")
        for r in mine:
            for way in WAYS:
                for s in (s for s in r.scores if s.way == way):
                    kinds = " | ".join(f"{a}/{b}" for a, b in (s.by_kind(kind) for kind in LEDGER_KINDS))
                    safe, total = s.safety
                    print(
                        f"| {r.share:.0%} ({r.budget}) | {way} | {s.round} | {_cell(*s.current)} |"
                        f" {_cell(*s.stale)} | {kinds} | {'yes' if safe == total else 'no'} ({safe}/{total}) |"
                        f" {s.tokens} |"
                    )
        print()
        for r in mine:
            heads = ", ".join(f"{k} {v}" for k, v in sorted(r.compaction.items()))
            print(
                f"{r.share:.0%}: lcm-proxy made {r.summarizer_calls} summarizer calls"
                f" ({r.summarizer_seconds:.1f} s in the summariser); x-lcm-compaction: {heads}; wall {r.seconds:.1f} s"
            )
            for error in r.errors[:3]:
                print(f"  error: {error}")
    for message, count in warnings.most_common(4):
        print(f"  proxy warning x{count}: {message}")


def main(args: argparse.Namespace, quick: bool) -> None:
    shares = QUICK_SHARES if quick else SHARES
    if args.shares:
        shares = tuple(int(share) / 100 for share in args.shares.split(","))
    rounds = 2 if quick else 3
    start = time.perf_counter()
    if args.real or args.model is not None:
        model = args.model or default_model_path()
        if model is None or not Path(model).exists():
            raise SystemExit(f"no model: pass --model PATH, set ${MODEL_ENV}, or run with --fetch-model")
        with llama_server(model, SUMMARY_WINDOW, args.threads) as backend:
            runs, warnings = run(shares, quick, rounds, backend, args.verbose)
        print_tables(runs, warnings, f"{model.name} ({model.stat().st_size / 1e6:.0f} MB)")
    else:
        runs, warnings = run(shares, quick, rounds, verbose=args.verbose)
        print_tables(runs, warnings, None)
    print(f"\nwall time of the whole run: {time.perf_counter() - start:.0f} s")
