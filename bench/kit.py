"""compaction-conformance-kit: lcm-proxy on the kit's fixed-budget leaderboard, through a live proxy.

``python -m bench kit`` (needs ``pip install -e '.[bench]'``: compaction-conformance-kit 0.8.0, pinned).

The kit (MIT, on PyPI) plants typed canaries (safety rules, hard constraints, facts, goal state, user
preferences; some later superseded, some of those in other words) in generated sessions, hands each session to
a compactor as ``compact(turns, round_num, budget_chars) -> CompactedContext``, feeds round k's output text back
as round k+1's only input (one ``system`` turn), five rounds, and scores the last round's text by
case-insensitive substring presence of each canary's required tokens. Budgets are characters: 10%, 20% and
30% of the session's ``"\\n".join(f"[{role}] {text}")``, the same cap every round; one output over it in any
round of any session makes the compactor non-compliant, which ranks it below every compliant one.

lcm-proxy joins the kit's own eight reference compactors as one more contestant, ``lcm-proxy``, and each
``compact`` call goes through a real proxy (uvicorn on 127.0.0.1, a fresh data directory each time) in
front of a recording fake upstream whose summaries are the weak fake of ``bench/fidelity.py`` (the first 30
words of their source: facts must survive through the proxy's own mechanisms). The turns are sent as a chat
client sends them: the whole transcript on every request to ``/v1/chat/completions``, one request per user
turn (the fake upstream answers with the session's own next assistant turn), then the whole transcript, and
every background compaction is waited for. What the upstream received for that last request, rendered as the
kit renders turns (``[role] text`` per message), is lcm-proxy's compacted output. Round k+1 splits round k's
output back into those messages and sends them the same way to a new proxy: nothing but the previous output
reaches it, as the kit intends.

The proxy's budget is in tokens and the kit's in characters, so each call searches for the largest model
window (``model_info.max_input_tokens``; requests carry ``max_tokens`` 48) whose forwarded text fits the
call's character budget: it starts from the window that fitted the previous call of the same budget and
round (scaled), widens or shrinks by a quarter until the budget is bracketed, then bisects. A window whose
forwarded text is over the budget, or whose replay got a refusal, is shrunk and tried again; every attempt is
counted and reported. Output over the budget never reaches the kit unless no window fits at all.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.fidelity import (
    SUMMARIZER,
    ProxyUnderTest,
    completion,
    message_text,
    proxy_config,
    proxy_warnings,
    weak_summary,
)
from tests.support.servers import serve_in_thread

KIT_VERSION = "0.8.0"
NAME = "lcm-proxy"
BUDGETS = (0.10, 0.20, 0.30)
SEEDS = (1, 2, 3, 4)
ROUNDS = 5
QUICK_SEEDS = (1,)
QUICK_ROUNDS = 2
TOLERANCE = 0.01  # the window search's resolution, a fraction of the window
QUICK_TOLERANCE = 0.05
MAX_TOKENS = 48  # every request's max_tokens: the proxy reserves it out of the window
SUMMARY_WINDOW = 8192  # the summary model's window
STEP = 1.25  # the factor by which the window search widens or shrinks before it bisects
MIN_WINDOW = MAX_TOKENS + 16  # below this no request can fit
ROLES = ("system", "developer", "user", "assistant", "tool")
_SPLIT = re.compile(r"\n(?=\[(?:" + "|".join(ROLES) + r")\] )")
_TURN = re.compile(r"\[(" + "|".join(ROLES) + r")\] (.*)", re.S)

Message = dict[str, Any]


def kit_installed() -> bool:
    """Whether the kit can be imported (said, with the install command, when it cannot; a version other than
    the pinned one is said too: its scoring may differ)."""
    try:
        found = version("compaction-conformance-kit")
    except PackageNotFoundError:
        print(f"kit skipped: compaction-conformance-kit is not installed (pip install -e '.[bench]', {KIT_VERSION})")
        return False
    if found != KIT_VERSION:
        print(f"warning: compaction-conformance-kit {found} is installed; this benchmark is pinned to {KIT_VERSION}")
    return True


# --- the fake upstream: answers with the session's own next turn, summarises weakly, keeps the last request --


class KitUpstream:
    """OpenAI-compatible ``/v1/chat/completions`` on loopback. Chat requests (model ``BUILD``) are answered with
    ``reply`` (the client sets it to the session's next assistant turn before each request) and the last one's
    body is kept; summary requests (``SUMMARIZER``) get ``weak_summary``."""

    def __init__(self) -> None:
        self.reply = "Noted."
        self.last: dict[str, Any] | None = None
        self.chats = 0
        self.summaries = 0
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        model = str(body.get("model"))
        if model == SUMMARIZER:
            self.summaries += 1
            return JSONResponse(completion(model, weak_summary(body)))
        self.chats += 1
        self.last = body
        return JSONResponse(completion(model, self.reply))


# --- turns, messages and text --------------------------------------------------------------------------------


def render(messages: list[Message]) -> str:
    """Messages as the kit renders turns: ``[role] text``, one message after the other."""
    return "\n".join(f"[{m.get('role')}] {message_text([m])}" for m in messages)


def to_messages(turns: list[Any]) -> list[Message]:
    """The kit's turns as a chat client's messages. A later round's single ``system`` turn is the previous
    round's output: it is split back into the messages it was rendered from (text that is not such a rendering
    becomes one user message, which the proxy may compact; a system message it would forward verbatim)."""
    if len(turns) == 1 and turns[0].role == "system" and _TURN.match(turns[0].text):
        return parse(turns[0].text)
    if len(turns) == 1 and turns[0].role == "system":
        return [{"role": "user", "content": turns[0].text}]
    return [{"role": t.role if t.role in ROLES[:4] else "user", "content": t.text} for t in turns]


def parse(text: str) -> list[Message]:
    """``render``'s inverse (a message whose text holds a line starting ``[role] `` splits there)."""
    out: list[Message] = []
    for chunk in _SPLIT.split(text):
        match = _TURN.fullmatch(chunk)
        if match is None:
            out.append({"role": "user", "content": chunk})
            continue
        role, content = match.groups()
        out.append({"role": role if role in ROLES[:4] else "user", "content": content})
    return out


# --- one replay of a transcript through a fresh proxy --------------------------------------------------------


@dataclass
class Attempt:
    """One replay at one window."""

    window: int
    chars: int  # of the rendered forwarded text of the last request (0 when it was refused)
    text: str
    requests: int = 0
    refused: int = 0  # non-200 answers during the replay
    errors: list[str] = field(default_factory=list)
    compaction: Counter[str] = field(default_factory=Counter)
    summaries: int = 0  # summarizer calls
    ledger: list[dict[str, Any]] = field(default_factory=list)  # the conversation's items, superseded too
    seconds: float = 0.0
    unchanged: bool = False  # the last request was forwarded as the client sent it

    def fits(self, budget: int) -> bool:
        return self.refused == 0 and bool(self.text) and self.chars <= budget


def replay(upstream: KitUpstream, upstream_url: str, messages: list[Message], window: int) -> Attempt:
    """Send ``messages`` to a new proxy whose model window is ``window`` tokens as a chat client does (one
    request per user turn, the whole transcript each time, then the whole transcript) and keep what the
    upstream received for the last request."""
    attempt = Attempt(window, 0, "")
    start = time.perf_counter()
    summaries_before = upstream.summaries
    with tempfile.TemporaryDirectory() as tmp:
        config = proxy_config(upstream_url, tmp, window - MAX_TOKENS, MAX_TOKENS, SUMMARY_WINDOW, False)
        proxy = ProxyUnderTest(config, settle_timeout=120)
        with serve_in_thread(proxy) as url, httpx.Client(base_url=url, timeout=300) as client:
            proxy.watch()
            ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "user"]
            if not ends or ends[-1] != len(messages):
                ends.append(len(messages))
            conversation = ""
            for n, end in enumerate(ends):
                last = n == len(ends) - 1
                nxt = messages[end] if end < len(messages) else None
                upstream.reply = str(nxt["content"]) if nxt is not None and nxt["role"] == "assistant" else "Noted."
                upstream.last = None
                body = {"model": "build", "messages": messages[:end], "max_tokens": MAX_TOKENS, "temperature": 0}
                response = client.post("/v1/chat/completions", json=body)
                attempt.requests += 1
                if "x-lcm-compaction" in response.headers:
                    attempt.compaction[response.headers["x-lcm-compaction"]] += 1
                conversation = response.headers.get("x-lcm-conversation-id", conversation)
                if response.status_code != 200:
                    attempt.refused += 1
                    attempt.errors.append(f"{response.status_code} {response.text[:200]}")
                proxy.settle(response)
                if last and response.status_code == 200 and upstream.last is not None:
                    sent = upstream.last["messages"]
                    attempt.text = render(sent)
                    attempt.chars = len(attempt.text)
                    attempt.unchanged = sent == messages[:end]
            if conversation:
                answer = client.get(f"/lcm/conversations/{conversation}/ledger", params={"all": "true"})
                if answer.status_code == 200:
                    attempt.ledger = answer.json()["data"]
    attempt.summaries = upstream.summaries - summaries_before
    attempt.seconds = time.perf_counter() - start
    return attempt


# --- the window search ----------------------------------------------------------------------------------------


@dataclass
class Search:
    """The windows tried for one ``compact`` call and the one chosen."""

    budget: int
    attempts: list[Attempt] = field(default_factory=list)
    chosen: Attempt | None = None

    @property
    def over(self) -> int:
        """Windows tried whose forwarded text was over the budget (or refused): each was shrunk and retried."""
        return sum(not a.fits(self.budget) for a in self.attempts)


def largest_fitting_window(
    upstream: KitUpstream,
    url: str,
    messages: list[Message],
    budget: int,
    start: int,
    tolerance: float,
    step: float = STEP,
) -> Search:
    """The largest window whose forwarded text fits ``budget`` characters: bracket from ``start`` by factors of
    ``step`` (each step twice the one before), then bisect until the bracket is within ``tolerance`` (a
    fraction of the window, at least one token). A window at which the whole transcript is forwarded unchanged
    ends the search upwards (a larger one forwards the same). The forwarded size is not strictly monotonic in
    the window (the ledger's share starts at a 400-token message limit, for one), so this is the largest
    window of the bracket found, not of every window."""
    search = Search(budget)
    tried: dict[int, Attempt] = {}

    def probe(window: int) -> Attempt:
        if window not in tried:
            tried[window] = replay(upstream, url, messages, window)
            search.attempts.append(tried[window])
        return tried[window]

    window = max(MIN_WINDOW, start)
    first = probe(window)
    good: Attempt | None = first if first.fits(budget) else None
    bad: int | None = None if good else window
    if good is not None:
        while not good.unchanged:
            wider = probe(max(good.window + 1, math.ceil(good.window * step)))
            step *= step
            if not wider.fits(budget):
                bad = wider.window
                break
            good = wider
    else:
        while good is None:
            narrower = max(MIN_WINDOW, min(window - 1, math.floor(window / step)))
            step *= step
            if narrower >= window:
                break
            window = narrower
            attempt = probe(window)
            if attempt.fits(budget):
                good = attempt
            else:
                bad = window
    if good is not None and bad is not None:
        low, high = good.window, bad
        while high - low > max(1, int(low * tolerance)):
            middle = (low + high) // 2
            attempt = probe(middle)
            if attempt.fits(budget):
                low, good = middle, attempt
            else:
                high = middle
    search.chosen = good
    return search


# --- lcm-proxy as a kit compactor -----------------------------------------------------------------------------


@dataclass
class Call:
    """One ``compact`` call: its session (which kit corpus and seed), round and search."""

    corpus: str
    seed: int
    round: int
    budget_fraction: float
    search: Search
    input_text: str
    output: str


@dataclass
class Contest:
    """What every ``compact`` call of the run left, for the tables after the kit's leaderboard."""

    upstream: KitUpstream | None  # None: a run read back from its JSON file
    url: str
    tolerance: float
    calls: list[Call] = field(default_factory=list)
    ratios: dict[tuple[float, int], float] = field(default_factory=dict)  # (fraction, round) -> window/budget
    sessions: list[tuple[str, int]] = field(default_factory=list)  # the kit's order: (corpus, seed)
    fraction: float = 0.0
    session: int = -1

    def factory(self) -> LcmProxyCompactor:
        self.session += 1
        return LcmProxyCompactor(self, self.session)


class LcmProxyCompactor:
    """The kit's ``Compactor`` protocol, answered by a live lcm-proxy."""

    name = NAME

    def __init__(self, contest: Contest, session: int) -> None:
        self.contest = contest
        self.index = session

    def compact(self, turns: list[Any], round_num: int = 1, budget_chars: int | None = None) -> Any:
        from compaction_kit import CompactedContext

        contest = self.contest
        assert contest.upstream is not None, "a contest read back from JSON runs nothing"
        messages = to_messages(turns)
        budget = budget_chars if budget_chars is not None else 10**9
        # Start where the previous call of this budget and round ended (scaled to this budget), else a guess of
        # four characters per token; a known start needs only a small first step to bracket the budget.
        ratio = contest.ratios.get((contest.fraction, round_num)) or contest.ratios.get((contest.fraction, 1))
        start = round(budget * ratio) if ratio else MAX_TOKENS + budget // 4
        step = 1.04 if ratio else STEP
        search = largest_fitting_window(contest.upstream, contest.url, messages, budget, start, contest.tolerance, step)
        chosen = search.chosen
        if chosen is None:  # no window fits: the smallest one tried goes to the kit, and is over its budget
            chosen = min(search.attempts, key=lambda a: (a.text == "", a.chars))
        else:
            contest.ratios[(contest.fraction, round_num)] = chosen.window / budget
        corpus, seed = contest.sessions[self.index % len(contest.sessions)]
        input_text = "\n".join(f"[{t.role}] {t.text}" for t in turns)
        contest.calls.append(Call(corpus, seed, round_num, contest.fraction, search, input_text, chosen.text))
        return CompactedContext(text=chosen.text, compactor_name=NAME, round_num=round_num)


# --- the run --------------------------------------------------------------------------------------------------


def reference_factories() -> dict[str, Callable[[], Any]]:
    from compaction_kit.cli import COMPACTORS

    return dict(COMPACTORS)


class _Unclosed(logging.Filter):
    """Counts (and keeps off stderr) asyncio's "Unclosed client session/connector" lines: the aiohttp sessions
    LiteLLM caches per event loop, left behind by the hundreds of proxy apps this run starts and stops in one
    process (garbage-collected late, each one is said on stderr)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(("Unclosed client session", "Unclosed connector")):
            self.count += 1
            return False
        return True


@contextlib.contextmanager
def unclosed_sessions() -> Iterator[_Unclosed]:
    logger = logging.getLogger("asyncio")
    counter = _Unclosed()
    logger.addFilter(counter)
    try:
        yield counter
    finally:
        logger.removeFilter(counter)


def run(
    budgets: tuple[float, ...], seeds: tuple[int, ...], rounds: int, tolerance: float, reference: bool, verbose: bool
) -> tuple[dict[str, Any], Contest, Counter[str]]:
    """The kit's leaderboard at each budget (one budget at a time, so that the contest knows which it is in),
    its entries merged into one payload as ``run_budget_benchmark`` would have made them."""
    from compaction_kit import run_budget_benchmark

    upstream = KitUpstream()
    entries: list[dict[str, Any]] = []
    payload: dict[str, Any] = {}
    with (
        serve_in_thread(upstream.app) as url,
        proxy_warnings(verbose) as warnings,
        unclosed_sessions() as unclosed,
    ):
        contest = Contest(upstream, url, tolerance)
        contest.sessions = [(c, s) for c in ("randomized", "semantic", "semantic-heldout") for s in seeds]
        for fraction in budgets:
            contest.fraction = fraction
            contest.session = -1
            factories = {**(reference_factories() if reference else {}), NAME: contest.factory}
            start = time.perf_counter()
            payload = run_budget_benchmark(factories, budgets=(fraction,), seeds=seeds, rounds=rounds)
            entries += payload["entries"]
            print(f"  kit at {fraction:.0%}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    payload["budgets"] = list(budgets)
    payload["entries"] = entries
    if unclosed.count:
        warnings["aiohttp sessions of stopped proxy apps garbage-collected unclosed (asyncio's log lines)"] = (
            unclosed.count
        )
    return payload, contest, warnings


# --- why lcm-proxy lost what it lost ---------------------------------------------------------------------------

_BLOCKS = {
    "ledger": re.compile(r"<standing_instructions\b.*?</standing_instructions>", re.S),
    "summary": re.compile(r"<summary\b.*?</summary>", re.S),
    "recall": re.compile(r"<recalled_history\b.*?</recalled_history>", re.S),
}
CAUSES = {
    "not extracted": "its statement set no ledger item (proxy/engine/slots.py classify found nothing in it)",
    "stubbed as a paste": (
        "a later round: the previous output's first message (ledger block and summaries) was stored as a pasted"
        " file and forwarded as its stub (intercept.Interceptor._text), which ledger.extract skips"
    ),
    "partial item": "its item keeps one sentence of its statement, without the other's tokens (ledger.extract)",
    "falsely superseded": "its item was superseded by a statement about something else (ledger.supersedes)",
    "no ledger block": "no block at all: a message limit under 400 tokens has no ledger share (budget.ledger_share)",
    "block capped": "its item is current but did not fit the block's share (ledger.select, budget.ledger_share)",
    "lost later": "held in this round's input, not in what the proxy forwarded for it",
}


def sections(text: str) -> dict[str, str]:
    """The forwarded text by part: the ledger block, summaries, recall block, and the raw rest."""
    out = {name: "\n".join(m.group(0) for m in pattern.finditer(text)) for name, pattern in _BLOCKS.items()}
    raw = text
    for pattern in _BLOCKS.values():
        raw = pattern.sub("", raw)
    out["raw"] = raw
    return out


def session_of(corpus: str, seed: int) -> tuple[Any, list[Any], dict[str, Any]]:
    from compaction_kit import build_random_session, build_semantic_heldout_session, build_semantic_session

    if corpus == "randomized":
        session, canaries = build_random_session(seed)
        return session, canaries, {"conflicts": [c.id for c in canaries if c.superseded_tokens]}
    builder = build_semantic_session if corpus == "semantic" else build_semantic_heldout_session
    built: tuple[Any, list[Any], dict[str, Any]] = builder(seed)
    return built


def _holds(text: str, tokens: tuple[str, ...]) -> bool:
    low = text.lower()
    return all(t.lower() in low for t in tokens)


@dataclass(frozen=True)
class Loss:
    """One canary lcm-proxy did not hold in the last round."""

    budget_fraction: float
    corpus: str
    seed: int
    canary: str
    kind: str
    round: int  # the first round that lost it
    cause: str
    detail: str


@dataclass(frozen=True)
class Stale:
    """A superseded value still in lcm-proxy's last-round output."""

    budget_fraction: float
    corpus: str
    seed: int
    canary: str
    tokens: tuple[str, ...]
    where: tuple[str, ...]  # the parts of the forwarded text it is in
    current_item: bool  # the old statement's item is still current (the update was not recognised)


def cause_of(canary: Any, call: Call) -> tuple[str, str]:
    """Why ``call``'s output lost ``canary`` (held in its input): from that replay's ledger and output."""
    if call.search.chosen is None:
        return "lost later", "no window fits the budget"
    ledger = call.search.chosen.ledger
    tokens = [t.lower() for t in canary.required_tokens]
    content = " ".join(canary.content.lower().split())
    own = [i for i in ledger if " ".join(i["text"].lower().split()) in content]  # items from its own statement
    full = [i for i in own if all(t in i["text"].lower() for t in tokens)]
    if not own:
        if call.round > 1 and "[LCM File: " in call.output:
            return "stubbed as a paste", ""
        return "not extracted", ""
    if not full:
        best = max(own, key=lambda i: sum(t in i["text"].lower() for t in tokens))
        missing = [t for t in tokens if t not in best["text"].lower()]
        return "partial item", f"{best['text']!r} lacks {', '.join(missing)}"
    current = [i for i in full if i["superseded_seq"] is None and i["state"] != "dropped"]
    if not current:
        by_id = {i["id"]: i for i in ledger}
        item = full[-1]
        newer = by_id.get(item["superseded_by"] or "", {})
        return "falsely superseded", f"{item['text']!r} by {newer.get('text', '?')!r}"
    block = sections(call.output)["ledger"]
    if not block:
        return "no ledger block", f"{len(ledger)} items, none forwarded"
    shown = block.count("\n- ")  # compact lines have no "[kind]"
    return "block capped", f"{shown} of {sum(i['superseded_seq'] is None for i in ledger)} current items shown"


def by_round(contest: Contest) -> dict[tuple[float, int], tuple[int, int, int, int, int]]:
    """Per (budget, round), scored as the kit scores the last round: randomized canaries held (of all), and
    semantic conflicts resolved (latest held, no stale value) and with a stale value present (of all)."""
    from compaction_kit import BehaviorProbe

    probe = BehaviorProbe()
    out: dict[tuple[float, int], list[int]] = {}
    for call in contest.calls:
        _, canaries, meta = session_of(call.corpus, call.seed)
        cell = out.setdefault((call.budget_fraction, call.round), [0, 0, 0, 0, 0])
        if call.corpus == "randomized":
            cell[0] += sum(probe.probe(c, call.output).survived for c in canaries)
            cell[1] += len(canaries)
            continue
        low = call.output.lower()
        for canary in (c for c in canaries if c.id in meta["conflicts"]):
            latest = _holds(low, canary.required_tokens)
            old = any(t.lower() in low for t in canary.superseded_tokens)
            cell[2] += latest and not old
            cell[3] += 1
            cell[4] += old
    return {key: (a, b, c, d, e) for key, (a, b, c, d, e) in out.items()}


def diagnose(contest: Contest) -> tuple[list[Loss], list[Stale]]:
    """Every canary lcm-proxy's last round did not hold, with the round it was lost in and why; every stale
    value its last round still carried, with where."""
    losses: list[Loss] = []
    stale: list[Stale] = []
    runs: dict[tuple[float, str, int], list[Call]] = {}
    for call in contest.calls:
        runs.setdefault((call.budget_fraction, call.corpus, call.seed), []).append(call)
    for (fraction, corpus, seed), calls in runs.items():
        calls.sort(key=lambda c: c.round)
        _, canaries, meta = session_of(corpus, seed)
        final = calls[-1].output
        for canary in canaries:
            if not _holds(final, canary.required_tokens):
                call = next(c for c in calls if not _holds(c.output, canary.required_tokens))
                if _holds(call.input_text, canary.required_tokens) or call.round == 1:
                    cause, detail = cause_of(canary, call)
                else:
                    cause, detail = "lost later", ""
                losses.append(Loss(fraction, corpus, seed, canary.id, canary.type.value, call.round, cause, detail))
            if canary.id in meta["conflicts"]:
                found = tuple(t for t in canary.superseded_tokens if t.lower() in final.lower())
                if found:
                    parts = sections(final)
                    where = tuple(k for k, v in parts.items() if any(t.lower() in v.lower() for t in found))
                    ledger = calls[-1].search.chosen.ledger if calls[-1].search.chosen else []
                    live = any(
                        i["superseded_seq"] is None and any(t.lower() in i["text"].lower() for t in found)
                        for i in ledger
                    )
                    stale.append(Stale(fraction, corpus, seed, canary.id, found, where, live))
    return losses, stale


# --- tables ---------------------------------------------------------------------------------------------------


def print_tables(
    payload: dict[str, Any], contest: Contest, warnings: Counter[str], seconds: float, every: bool = False
) -> None:
    from compaction_kit import budget_benchmark_to_markdown

    print(
        f"\n## compaction-conformance-kit {KIT_VERSION}: fixed-budget leaderboard, {len(payload['seeds'])} seeds,"
        f" {payload['rounds']} rounds (lcm-proxy through a live proxy, fake summariser)\n"
    )
    print(budget_benchmark_to_markdown(payload).split("\n", 1)[1].strip())
    print("\n### lcm-proxy by canary type (last round, median over the randomized sessions)\n")
    types = ("safety_rule", "hard_constraint", "fact", "goal_state", "user_preference")
    print("| budget | " + " | ".join(types) + " | supersession: latest held / stale present (randomized) |")
    print("|---:|" + "---:|" * len(types) + "---|")
    for entry in payload["entries"]:
        if entry["compactor"] != NAME:
            continue
        by_type = entry["randomized"]["final_median_by_type"]
        sup = entry["randomized"]["supersession"]
        cells = " | ".join(f"{by_type.get(t, 0):.0%}" for t in types)
        print(f"| {entry['budget_fraction']:.0%} | {cells} | {sup['latest']}/{sup['n']} / {sup['stale']}/{sup['n']} |")
    print("\n### lcm-proxy round by round (the kit scores the last round only)\n")
    print("| budget | round | survival (randomized) | semantic resolved | stale present (semantic) |")
    print("|---:|---:|---:|---:|---:|")
    for (fraction, round_), (held, total, resolved, conflicts, stale) in sorted(by_round(contest).items()):
        print(
            f"| {fraction:.0%} | {round_} | {held}/{total} ({held / max(1, total):.1%}) |"
            f" {resolved}/{conflicts} ({resolved / max(1, conflicts):.1%}) | {stale}/{conflicts} |"
        )
    print("\n### Where lcm-proxy's characters go (mean per session; rounds 1 and last)\n")
    print(
        "| budget | round | output chars | ledger block | summaries | recall block | raw messages¹ |"
        " ledger items shown / current | [superseded] markers |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fraction in payload["budgets"]:
        mine = [c for c in contest.calls if c.budget_fraction == fraction]
        last = max((c.round for c in mine), default=1)
        for round_ in sorted({1, last}):
            calls = [c for c in mine if c.round == round_]
            if not calls:
                continue
            parts = [sections(c.output) for c in calls]
            cells = " | ".join(
                f"{statistics.mean(len(p[k]) for p in parts):.0f}" for k in ("ledger", "summary", "recall", "raw")
            )
            shown = statistics.mean(p["ledger"].count("\n- ") for p in parts)
            current = statistics.mean(
                sum(i["superseded_seq"] is None for i in (c.search.chosen.ledger if c.search.chosen else []))
                for c in calls
            )
            markers = statistics.mean(c.output.count("[superseded]") for c in calls)
            print(
                f"| {fraction:.0%} | {round_} | {statistics.mean(len(c.output) for c in calls):.0f} | {cells} |"
                f" {shown:.1f} / {current:.1f} | {markers:.1f} |"
            )
    print("\n¹ the instructions and the messages forwarded as sent, with their `[role] ` prefixes.")
    print("\n### lcm-proxy's windows (the largest whose forwarded text fits the budget)\n")
    print(
        "| budget | round | budget chars (median) | window tokens min / median / max | output chars / budget (max) |"
        " windows tried | over budget, shrunk | refusals | summarizer calls | x-lcm-compaction | s |"
    )
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|")
    for fraction in payload["budgets"]:
        mine = [c for c in contest.calls if c.budget_fraction == fraction]
        for round_ in sorted({c.round for c in mine}):
            calls = [c for c in mine if c.round == round_]
            windows = [c.search.chosen.window for c in calls if c.search.chosen is not None]
            attempts = [a for c in calls for a in c.search.attempts]
            heads: Counter[str] = Counter()
            for c in calls:
                if c.search.chosen is not None:
                    heads.update(c.search.chosen.compaction)
            worst = max(len(c.output) / c.search.budget for c in calls)
            missing = len(calls) - len(windows)
            span = (
                f"{min(windows)} / {statistics.median(windows):.0f} / {max(windows)}" if windows else "none fits"
            ) + (f" ({missing} without)" if missing and windows else "")
            print(
                f"| {fraction:.0%} | {round_} | {statistics.median(c.search.budget for c in calls):.0f} | {span} |"
                f" {worst:.3f} | {len(attempts)} | {sum(c.search.over for c in calls)} |"
                f" {sum(a.refused for a in attempts)} | {sum(a.summaries for a in attempts)} |"
                f" {', '.join(f'{k} {v}' for k, v in sorted(heads.items()))} |"
                f" {sum(a.seconds for a in attempts):.0f} |"
            )
    print(
        "\nx-lcm-compaction counts the chosen window's replays only; windows tried, refusals, summarizer calls and"
        " seconds count every replay of the search."
    )
    for message, count in warnings.most_common(4):
        print(f"  proxy warning x{count}: {message}")
    print_diagnosis(contest, every)
    print(f"\nwall time of the whole run: {seconds:.0f} s")


def print_diagnosis(contest: Contest, every: bool) -> None:
    """Why lcm-proxy lost the canaries it lost (and which stale values it kept), counted by cause; ``every``:
    one line per canary as well."""
    losses, stale = diagnose(contest)
    types = ("safety_rule", "hard_constraint", "fact", "goal_state", "user_preference")
    print("\n### Why lcm-proxy lost canaries (every corpus, last round; the cause is read in the round that lost it)\n")
    print("| budget | cause | lost | " + " | ".join(types) + " | lost in round 1 / later | example |")
    print("|---:|---|---:|" + "---:|" * len(types) + "---|---|")
    for fraction in sorted({c.budget_fraction for c in contest.calls}):
        mine = [loss for loss in losses if loss.budget_fraction == fraction]
        for cause in CAUSES:
            of = [loss for loss in mine if loss.cause == cause]
            if not of:
                continue
            kinds = " | ".join(str(sum(loss.kind == t for loss in of)) for t in types)
            first = sum(loss.round == 1 for loss in of)
            example = next((loss for loss in of if loss.detail), of[0])
            text = f"{example.canary}: {example.detail}" if example.detail else example.canary
            print(
                f"| {fraction:.0%} | {cause} | {len(of)} | {kinds} | {first} / {len(of) - first} |"
                f" {text[:150].replace('|', '/')} |"
            )
    print()
    for cause, meaning in CAUSES.items():
        print(f"- {cause}: {meaning}")
    print("\n### Stale values lcm-proxy still forwarded in the last round\n")
    print(
        "| budget | stale present | in the ledger block | in summaries | in raw messages | in recall | old item still current |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for fraction in sorted({c.budget_fraction for c in contest.calls}):
        kept = [st for st in stale if st.budget_fraction == fraction]
        counts = [sum(part in st.where for st in kept) for part in ("ledger", "summary", "raw", "recall")]
        print(
            f"| {fraction:.0%} | {len(kept)} | {' | '.join(map(str, counts))} | {sum(st.current_item for st in kept)} |"
        )
    if every:
        print("\n### Every canary lcm-proxy lost\n")
        for loss in losses:
            print(
                f"- {loss.budget_fraction:.0%} {loss.corpus} seed {loss.seed} {loss.canary} ({loss.kind}), round"
                f" {loss.round}: {loss.cause}{': ' + loss.detail if loss.detail else ''}"
            )
        for st in stale:
            print(
                f"- stale {st.budget_fraction:.0%} {st.corpus} seed {st.seed} {st.canary}: {', '.join(st.tokens)} in"
                f" {', '.join(st.where)}{' (old item still current)' if st.current_item else ''}"
            )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench kit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", help="budgets in percent of each session, comma-separated (default 10,20,30)")
    parser.add_argument("--seeds", help="kit seeds, comma-separated (default 1,2,3,4; --quick: 1)")
    parser.add_argument("--rounds", type=int, help="compaction rounds (default 5; --quick: 2)")
    parser.add_argument(
        "--tolerance", type=float, help="the window search stops within this fraction (default 0.01; --quick: 0.05)"
    )
    parser.add_argument("--only-proxy", action="store_true", help="leave the kit's reference compactors out")
    parser.add_argument("--json", metavar="PATH", help="also write the kit's payload and lcm-proxy's calls here")
    parser.add_argument("--from-json", metavar="PATH", help="print the tables of a run saved with --json, run nothing")
    parser.add_argument("--diagnose", action="store_true", help="list every canary lcm-proxy lost, and why")
    parser.add_argument("--verbose", action="store_true", help="echo the proxy's warnings")
    return parser.parse_args(argv)


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    args = parse_args(argv or [])
    if not kit_installed():
        return
    budgets = tuple(int(b) / 100 for b in args.budgets.split(",")) if args.budgets else BUDGETS
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else (QUICK_SEEDS if quick else SEEDS)
    rounds = args.rounds or (QUICK_ROUNDS if quick else ROUNDS)
    if args.from_json:
        payload, contest, warnings, seconds = load(args.from_json)
        print_tables(payload, contest, warnings, seconds, args.diagnose)
        return
    start = time.perf_counter()
    tolerance = args.tolerance or (QUICK_TOLERANCE if quick else TOLERANCE)
    payload, contest, warnings = run(budgets, seeds, rounds, tolerance, not args.only_proxy, args.verbose)
    seconds = time.perf_counter() - start
    print_tables(payload, contest, warnings, seconds, args.diagnose)
    if args.json:
        save(args.json, payload, contest, warnings, seconds)


# --- a run saved, and read back ----------------------------------------------------------------------------


def _attempt_json(attempt: Attempt, chosen: bool) -> dict[str, Any]:
    data = {f.name: getattr(attempt, f.name) for f in fields(attempt)}  # asdict would mangle the Counter
    data["compaction"] = dict(attempt.compaction)
    if not chosen:  # the texts and ledgers of the windows not chosen would only make the file large
        data["text"] = ""
        data["ledger"] = []
    return data


def save(path: str, payload: dict[str, Any], contest: Contest, warnings: Counter[str], seconds: float) -> None:
    """The kit's payload and every lcm-proxy call (its input, the windows tried, what was chosen)."""
    calls = [
        {
            "corpus": c.corpus,
            "seed": c.seed,
            "round": c.round,
            "budget_fraction": c.budget_fraction,
            "budget_chars": c.search.budget,
            "input_text": c.input_text,
            "output": c.output,
            "chosen": next((i for i, a in enumerate(c.search.attempts) if a is c.search.chosen), None),
            "attempts": [_attempt_json(a, a is c.search.chosen) for a in c.search.attempts],
        }
        for c in contest.calls
    ]
    data = {"kit": payload, "lcm_proxy_calls": calls, "warnings": dict(warnings), "seconds": seconds}
    with open(path, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def load(path: str) -> tuple[dict[str, Any], Contest, Counter[str], float]:
    """A run ``save`` wrote, to print its tables again (``--from-json``)."""
    with open(path, "rb") as f:
        data = orjson.loads(f.read())
    contest = Contest(None, "", 0.0)
    for c in data["lcm_proxy_calls"]:
        attempts = []
        for a in c["attempts"]:
            a["compaction"] = Counter(a["compaction"])
            attempts.append(Attempt(**a))
        search = Search(c["budget_chars"], attempts, attempts[c["chosen"]] if c["chosen"] is not None else None)
        call = Call(c["corpus"], c["seed"], c["round"], c["budget_fraction"], search, c["input_text"], c["output"])
        contest.calls.append(call)
    return data["kit"], contest, Counter(data["warnings"]), float(data["seconds"])
