"""Compaction: per-request overhead as conversations grow, and what a long simulated session forwards.

1. Overhead: the context engine's ``prepare`` (ingest + budget + assembly; the summarizer is an instant
   stub, so summarizer time is excluded) on a continuation of an already-compacted conversation of 10,
   100, 1,000 and 5,000 messages, with the peak of Python memory allocated during one such request
   (tracemalloc, measured on a separate repeat since tracing slows everything); and a real request through
   the proxy compared with the same request sent straight to the fake upstream (the baseline), on loopback.
   The process's peak RSS closes the table.
2. Simulation: the 300-turn session of ``tests/engine/test_compaction_sim.py`` (8k window, tool calls with
   parallel results, large tool outputs, pasted files) through the real proxy: tokens the client sent vs
   tokens forwarded, summarizer calls per 100 turns, and the share of consecutive requests whose forwarded
   messages extend the previous ones (prefix stability, target >= 90%).
3. Prompt cache (``bench/prompt_cache.py``): the 150-turn session and an agent session with large tool outputs,
   the share of forwarded tokens repeating the previous request's prefix and the input billed under Anthropic's
   and OpenAI's cache pricing, beside the client sending everything and compacting the way Claude Code does.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

from bench import prompt_cache
from bench.ingest import transcript as conversation
from proxy.app import create_app
from proxy.config.lcm import LcmSettings
from proxy.config.loading import parse_config
from proxy.engine.engine import Budget, ContextEngine
from proxy.store.files import FileStore
from proxy.store.sqlite.store import SQLiteStore
from proxy.tokens import count_messages
from tests.support import fact_session
from tests.support.fakes import FakeUpstream
from tests.support.servers import serve_in_thread
from tests.support.sim import (
    MAX_TOKENS,
    SIM_LCM,
    TOOLS,
    WINDOW,
    ScriptedModel,
    Stats,
    forwarded_tokens,
    is_summary_request,
    tool_result,
    user_turn,
)

SIZES = (10, 100, 1000, 5000)


class InstantSummarizer:
    model = "instant"

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        return "Summary: decisions and facts of this part of the conversation."

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        return "A document."


def continued(messages: list[dict[str, Any]], r: int) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": f"reply {r}"}, {"role": "user", "content": f"next {r}"}]


async def engine_overhead(n: int, repeats: int) -> tuple[float, int, int, int]:
    """Median prepare time, tokens sent and forwarded, and the peak bytes one request allocates."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp))
        await store.open()
        engine = ContextEngine(store, FileStore(Path(tmp)), LcmSettings())
        budget = Budget(window=128_000, output_reserve=4096, tools=0)
        messages = conversation(n)
        first = await engine.prepare("bench", messages, budget, InstantSummarizer())
        times = []
        for r in range(repeats):
            messages = continued(messages, r)
            start = time.perf_counter()
            prepared = await engine.prepare("bench", messages, budget, InstantSummarizer())
            times.append(time.perf_counter() - start)
        messages = continued(messages, repeats)
        tracemalloc.start()
        await engine.prepare("bench", messages, budget, InstantSummarizer())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        await store.close()
        assert first.conversation_id == prepared.conversation_id
        return statistics.median(times), prepared.tokens_sent, prepared.tokens_forwarded, peak


def proxy_config(upstream: str, data_dir: str, lcm: dict[str, Any]) -> Any:
    return parse_config(
        {
            "model_list": [
                {
                    "model_name": "m",
                    "litellm_params": {"model": "openai/m", "api_base": f"{upstream}/v1", "api_key": "k-12345678"},
                    "model_info": {"max_input_tokens": 128_000},
                },
                {
                    "model_name": "small",
                    "litellm_params": {"model": "openai/small", "api_base": f"{upstream}/v1", "api_key": "k-12345678"},
                    "model_info": {"max_input_tokens": WINDOW},
                },
            ],
            "general_settings": {"data_dir": data_dir, "request_timeout": 60},
            "lcm_settings": lcm,
        }
    )


def http_overhead(proxy: str, upstream: str, n: int, repeats: int) -> tuple[float, float]:
    messages = conversation(n)
    with httpx.Client(timeout=60) as client:
        first = client.post(f"{proxy}/v1/chat/completions", json={"model": "m", "messages": messages})  # ingest
        # Its history is read for standing instructions after the response, once (seconds for thousands of
        # messages, in the background): asking for the ledger waits for that, so the rows are the steady state.
        client.get(f"{proxy}/lcm/conversations/{first.headers['x-lcm-conversation-id']}/ledger")
        # And its first compaction runs in the background: until it is swapped in, continuations wait for an
        # inline one or are evicted. The rows are the steady state after that one-time work.
        for r in range(60):
            messages = continued(messages, -1 - r)
            answer = client.post(f"{proxy}/v1/chat/completions", json={"model": "m", "messages": messages})
            if answer.headers.get("x-lcm-compaction") not in ("evicted", "deferred"):
                break
        via, direct = [], []
        for r in range(repeats):
            messages = continued(messages, r)
            start = time.perf_counter()
            client.post(f"{upstream}/v1/chat/completions", json={"model": "m", "messages": messages})
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            response = client.post(f"{proxy}/v1/chat/completions", json={"model": "m", "messages": messages})
            via.append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
    return statistics.median(via), statistics.median(direct)


def simulation(proxy: str, fake: FakeUpstream, turns: int) -> dict[str, float]:
    model = ScriptedModel()
    fake.responder = model
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a project assistant."}]
    stats = Stats()
    sent_tokens = forwarded = 0
    with httpx.Client(base_url=f"{proxy}/v1", timeout=60) as client:
        for turn in range(turns):
            transcript.append(user_turn(turn))
            for _ in range(3):
                before = len(fake.requests)
                body = {"model": "small", "messages": transcript, "tools": TOOLS, "max_tokens": MAX_TOKENS}
                response = client.post("/chat/completions", json=body)
                assert response.status_code == 200, response.text
                chat = next(r.body for r in fake.requests[before:] if not is_summary_request(r.body))
                stats.forwarded.append(chat["messages"])
                sent_tokens += count_messages(transcript)
                forwarded += forwarded_tokens(chat)
                message = response.json()["choices"][0]["message"]
                transcript.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    break
                transcript += [tool_result(call, turn) for call in message["tool_calls"]]
    return {
        "requests": len(stats.forwarded),
        "sent": sent_tokens,
        "forwarded": forwarded,
        "summary_calls_per_100_turns": model.summary_calls * 100 / turns,
        "stability": stats.prefix_stability(),
        "messages": len(transcript) - 1,
    }


def main(quick: bool = False) -> None:
    repeats = 5 if quick else 15
    print("\n## compaction: per-request overhead (continuation of a compacted conversation, median)\n")
    print(
        "| messages | engine prepare ms | peak memory of one request KiB | tokens sent | tokens forwarded | via proxy ms | direct to upstream ms (baseline) | added ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    fake = FakeUpstream()
    with serve_in_thread(fake.app) as upstream, tempfile.TemporaryDirectory() as tmp:
        with serve_in_thread(create_app(proxy_config(upstream, f"{tmp}/a", {}))) as proxy:
            for n in SIZES:
                prepare, sent, fwd, peak = asyncio.run(engine_overhead(n, repeats))
                via, direct = http_overhead(proxy, upstream, n, repeats)
                print(
                    f"| {n} | {prepare * 1000:.2f} | {peak / 1024:.0f} | {sent} | {fwd} | {via * 1000:.2f} | {direct * 1000:.2f} | {(via - direct) * 1000:.2f} |"
                )
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"\nPeak RSS of the benchmark process (client, proxy and fake upstream together): {rss:.0f} MiB")
        turns = 60 if quick else 300
        with serve_in_thread(create_app(proxy_config(upstream, f"{tmp}/b", SIM_LCM))) as proxy:
            result = simulation(proxy, fake, turns)
        cache_tables = prompt_cache.measure(
            lambda name: serve_in_thread(create_app(proxy_config(upstream, f"{tmp}/{name}", SIM_LCM))),
            fake,
            quick,
            lambda name: serve_in_thread(create_app(proxy_config(upstream, f"{tmp}/{name}", fact_session.LCM))),
        )
    print(
        f"\n## compaction: simulated session ({turns} turns, {WINDOW}-token window, {int(result['requests'])} requests, {int(result['messages'])} messages)\n"
    )
    print(
        "| tokens sent by the client (sum) | tokens forwarded (sum) | reduction | summarizer calls per 100 turns | prefix stability |"
    )
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {int(result['sent'])} | {int(result['forwarded'])} | {result['sent'] / max(1, result['forwarded']):.1f}x |"
        f" {result['summary_calls_per_100_turns']:.0f} | {result['stability'] * 100:.1f}% |"
    )
    prompt_cache.print_tables(cache_tables)
