"""Regular expressions from a prompt-injected model or an admin API caller: bounded before they compile, and
run off the event loop with a deadline, so one hostile pattern can neither eat the memory nor freeze the
other requests."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from proxy.engine.patterns import MAX_PATTERN_CHARS, UnsafePattern, check_pattern, compile_pattern
from tests.fakes import FakeUpstream
from tests.test_security import ToolModel

BOMBS = [
    "a{1000000000}",  # unrolled at compile time: ~256 bytes per copy, 15 GB seen
    "(a{1000}){1000}",  # nested: a million copies
    "(?:(?:a{30}){30}){30}",
    "x{1001}",
    "(" * 25 + "a" + ")" * 25,
    "(?:foo){e<=3}",  # fuzzy matching
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
    "a{,5}b{2,}",
]


@pytest.mark.parametrize("pattern", BOMBS)
def test_oversized_patterns_are_refused_before_compiling(pattern: str) -> None:
    with pytest.raises(UnsafePattern):
        check_pattern(pattern)


@pytest.mark.parametrize("pattern", FINE)
def test_ordinary_patterns_compile(pattern: str) -> None:
    assert compile_pattern(pattern).pattern == pattern


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


@pytest.mark.parametrize("pattern", ["a{1000000000}", "(a{1000}){1000}"])
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
    model = ToolModel(plan=[("lcm_grep", {"pattern": "a{1000000000}"}), ("lcm_grep", {"pattern": "reply 1"})])
    fake_upstream.responder = model
    messages = [*transcript(2), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "search"}]
    response = httpx.post(
        f"{proxy.base_url}/chat/completions", json={"model": "test-model", "messages": messages}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert model.result(0).startswith("Error: repeat counts above 1000")
    assert "reply 1" in model.result(1)  # the next call of the same round still runs


def poll_health(url: str, busy: threading.Thread) -> list[float]:
    """Latency of /healthz, polled for as long as ``busy`` runs."""
    latencies: list[float] = []
    with httpx.Client(timeout=10) as client:
        while busy.is_alive():
            started = time.perf_counter()
            assert client.get(f"{url}/healthz").status_code == 200
            latencies.append(time.perf_counter() - started)
    return latencies


def test_healthz_stays_fast_while_a_catastrophic_admin_grep_runs(proxy: Any, fake_upstream: FakeUpstream) -> None:
    conversation = seeded(proxy)
    answers: list[httpx.Response] = []
    grep = threading.Thread(
        target=lambda: answers.append(
            httpx.get(f"{proxy.url}/lcm/conversations/{conversation}/grep", params={"pattern": "(a|aa)+$"}, timeout=60)
        )
    )
    grep.start()
    latencies = poll_health(proxy.url, grep)
    grep.join()
    # The pattern ran into its deadline (so it really was being searched while /healthz was polled) ...
    assert answers[0].status_code == 400 and "too expensive" in answers[0].json()["error"]["message"]
    assert len(latencies) >= 3
    # ... and the event loop kept answering: the issue asks for every answer within 100 ms.
    assert max(latencies) < 0.1, latencies


def test_healthz_stays_fast_while_a_model_greps_catastrophically(
    proxy_factory: Any, fake_upstream: FakeUpstream
) -> None:
    proxy = proxy_factory({"retrieval_tools": "always"})
    seeded(proxy)
    model = ToolModel(plan=[("lcm_grep", {"pattern": "(a|aa)+$"})])
    fake_upstream.responder = model
    messages = [*transcript(30), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "search"}]
    body = {"model": "test-model", "messages": messages}
    chat = threading.Thread(target=lambda: httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60))
    chat.start()
    latencies = poll_health(proxy.url, chat)
    chat.join()
    assert "too expensive" in json.dumps(model.results)
    assert len(latencies) >= 3 and max(latencies) < 0.1, latencies
