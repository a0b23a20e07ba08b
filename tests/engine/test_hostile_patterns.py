"""Regular expressions from a prompt-injected model or an admin API caller run on RE2: nothing they write can
compile huge or match for ever, and the searches run off the event loop, so one hostile pattern can neither
eat the memory nor freeze the other requests."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import httpx
import pytest

from proxy.engine.patterns import MAX_PATTERN_CHARS, UnsafePattern, compile_pattern
from tests.support.fakes import FakeUpstream
from tests.support.tool_model import ToolModel

# Each compiled to gigabytes, or for ever, on the backtracking engine used before (or got past the checker
# written for it: a nested set, a comment, verbose mode).
REFUSED = [
    "(a{1000}){1000}",
    "(?:(?:a{30}){30}){30}",
    "[[](?:(?:a{1000}){1000}){1000}]",
    "(?#[)(?:a{1000}){1000}]",
    "(?x)(?:a {1000}) {1000}",
    "x{1001}",
    "(?<=a)b",  # look-around needs backtracking
    r"(\w)\1",  # so do back-references
    "a" * (MAX_PATTERN_CHARS + 1),
]
FINE = [
    "password",
    r"\d{3}-\d{4}",
    "a{1000}",
    "(a|aa)+$",
    r"foo\(\) \{",
    "[{}]{2,5}",
    r"(?i)api[_-]?key\s*=",
    "lantern|kestrel",
]


@pytest.mark.parametrize("pattern", REFUSED)
def test_patterns_that_expand_or_need_backtracking_are_refused(pattern: str) -> None:
    with pytest.raises(UnsafePattern):
        compile_pattern(pattern)


@pytest.mark.parametrize("pattern", FINE)
def test_ordinary_patterns_compile(pattern: str) -> None:
    assert compile_pattern(pattern).pattern == pattern


def test_a_huge_count_is_literal_text_not_a_repetition() -> None:
    compiled = compile_pattern("a{1000000000}")  # unrolled to 15 GB before; RE2 reads it as Perl does
    assert compiled.search("see a{1000000000} here") and not compiled.search("a" * 5000)


def test_catastrophic_alternation_matches_in_linear_time() -> None:
    assert compile_pattern("(a|aa)+$").search("a" * 200_000 + "b") is None


def transcript(count: int) -> list[dict[str, Any]]:
    """Messages that make ``(a|aa)+$`` backtrack for ever."""
    messages: list[dict[str, Any]] = []
    for i in range(count):
        messages += [{"role": "user", "content": "a" * 40 + "b"}, {"role": "assistant", "content": f"reply {i}"}]
    return [*messages, {"role": "user", "content": "done"}]


def seeded(proxy: Any, count: int = 30) -> str:
    messages = transcript(count)
    response = httpx.post(
        f"{proxy.base_url}/chat/completions", json={"model": "test-model", "messages": messages}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.headers["x-lcm-conversation-id"]


@pytest.mark.parametrize("pattern", ["(a{1000}){1000}", "[[](?:(?:a{1000}){1000}){6}]"])
def test_admin_grep_refuses_a_compile_bomb_with_a_400(proxy: Any, fake_upstream: FakeUpstream, pattern: str) -> None:
    conversation = seeded(proxy, 2)
    response = httpx.get(f"{proxy.url}/lcm/conversations/{conversation}/grep", params={"pattern": pattern}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "pattern"


def test_lcm_grep_answers_a_compile_bomb_with_an_error_the_model_can_read(
    proxy_factory: Any, fake_upstream: FakeUpstream
) -> None:
    proxy = proxy_factory({"retrieval_tools": "always"})
    seeded(proxy, 2)
    model = ToolModel(plan=[("lcm_grep", {"pattern": "(a{1000}){1000}"}), ("lcm_grep", {"pattern": "reply 1"})])
    fake_upstream.responder = model
    messages = [*transcript(2), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "search"}]
    response = httpx.post(
        f"{proxy.base_url}/chat/completions", json={"model": "test-model", "messages": messages}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert model.result(0).startswith("Error: invalid regular expression")
    assert "reply 1" in model.result(1)  # the next call of the same round still runs


def poll_health(url: str, busy: threading.Thread) -> list[float]:
    """Latency of /healthz, polled for as long as ``busy`` runs. The server shares this test process, whose
    heap (LiteLLM's and the whole suite's) makes a full garbage collection a pause of its own; a served
    proxy freezes its startup heap for that reason (``proxy.app``), so the collector is held off here."""
    latencies: list[float] = []
    gc.disable()
    try:
        with httpx.Client(timeout=10) as client:
            while busy.is_alive():
                started = time.perf_counter()
                assert client.get(f"{url}/healthz").status_code == 200
                latencies.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return latencies


HOSTILE = ["(a|aa)+$", "(a|a?)+b", "(.*a){20}", "(?:a+)+$", "(a{1000}){1000}", "[[](?:(?:a{1000}){1000}){6}]"]


def test_healthz_stays_fast_while_hostile_admin_greps_run(proxy: Any, fake_upstream: FakeUpstream) -> None:
    conversation = seeded(proxy)
    statuses: list[int] = []

    def grep_all() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(10):
                for pattern in HOSTILE:
                    url = f"{proxy.url}/lcm/conversations/{conversation}/grep"
                    statuses.append(client.get(url, params={"pattern": pattern}).status_code)

    greps = threading.Thread(target=grep_all)
    greps.start()
    latencies = poll_health(proxy.url, greps)
    greps.join()
    # Every hostile pattern was answered (searched, or refused as unsupported) ...
    assert len(statuses) == 10 * len(HOSTILE) and set(statuses) == {200, 400}
    assert len(latencies) >= 3
    # ... and the event loop kept answering: the issue asks for every answer within 100 ms.
    assert max(latencies) < 0.1, latencies


def test_healthz_stays_fast_while_a_model_greps_with_hostile_patterns(
    proxy_factory: Any, fake_upstream: FakeUpstream
) -> None:
    proxy = proxy_factory({"retrieval_tools": "always"})
    seeded(proxy)
    model = ToolModel(plan=[("lcm_grep", {"pattern": pattern}) for pattern in HOSTILE])
    fake_upstream.responder = model
    messages = [*transcript(30), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "search"}]
    body = {"model": "test-model", "messages": messages}

    def chat() -> None:
        for _ in range(5):
            assert httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60).status_code == 200

    sender = threading.Thread(target=chat)
    sender.start()
    latencies = poll_health(proxy.url, sender)
    sender.join()
    results = [model.result(i) for i in range(len(HOSTILE))]
    assert results[0] == "No matches for '(a|aa)+$' (regex)."  # searched to the end, not cut off by a deadline
    assert results[-1].startswith("Error: invalid regular expression")
    assert len(latencies) >= 3 and max(latencies) < 0.1, latencies
