"""A streamed request that waited on an inline compaction reports the same figures as a non-streamed one.

Headers go out before the body. A stream whose inline compaction finishes within ``STREAM_HEADER_GRACE_SECONDS``
carries every ``X-LCM-*`` header; one whose compaction takes longer gets its headers at once (the conversation,
the tokens sent, ``x-lcm-compaction: inline``) and the final figures in an SSE comment block (``: x-lcm-...:
VALUE`` lines, ignored by SSE clients) before the first data event. Either way they match what the same request
not streamed reports in its headers.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.wire.chat import routes
from tests.support.held_summaries import HeldSummaries, history, start
from tests.support.servers import serve_in_thread

FIGURES = (
    "x-lcm-tokens-sent",
    "x-lcm-tokens-forwarded",
    "x-lcm-compaction",
    "x-lcm-summaries",
    "x-lcm-evicted",
    "x-lcm-recalled",
)
REQUEST = {"model": "local", "messages": history(30), "max_tokens": 64}


def unstreamed_figures(proxy_factory: Any, url: str) -> dict[str, str]:
    """The figures of the same request, not streamed, on a proxy of its own (a fresh store)."""
    proxy = start(proxy_factory, url, deadline=120)
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=REQUEST, timeout=60)
    assert response.status_code == 200, response.text
    figures = {name: response.headers[name] for name in FIGURES}
    assert figures["x-lcm-compaction"] == "inline" and int(figures["x-lcm-summaries"]) > 0  # it did compact inline
    return figures


def same_figures(got: dict[str, str | None], expected: dict[str, str]) -> None:
    """Equal, but for a few tokens forwarded: the summaries and recalled excerpts forwarded carry random ids
    (sum_..., msg_...), which tokenize to a token or two more or less from one store to another."""
    assert {k: v for k, v in got.items() if k != "x-lcm-tokens-forwarded"} == {
        k: v for k, v in expected.items() if k != "x-lcm-tokens-forwarded"
    }
    forwarded, reference = int(got["x-lcm-tokens-forwarded"] or 0), int(expected["x-lcm-tokens-forwarded"])
    assert abs(forwarded - reference) <= 10, (forwarded, reference)
    assert forwarded < int(expected["x-lcm-tokens-sent"]) // 2  # after the compaction, not before it


def comment_figures(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        if line.startswith(": x-lcm-"):
            name, _, value = line[2:].partition(": ")
            found[name] = value
    return found


def test_a_stream_whose_compaction_outlasts_the_grace_gets_the_figures_before_its_first_chunk(
    proxy_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes, "STREAM_HEADER_GRACE_SECONDS", 0.0, raising=False)  # headers at once
    upstream = HeldSummaries()
    with serve_in_thread(upstream.app) as url:
        proxy = start(proxy_factory, url, deadline=120)
        with httpx.stream(
            "POST", f"{proxy.base_url}/chat/completions", json={**REQUEST, "stream": True}, timeout=60
        ) as response:
            assert response.status_code == 200
            # Sent while the summary is held: what is known before the compaction.
            assert not upstream.release.is_set()
            headers = dict(response.headers)
            assert headers["x-lcm-compaction"] == "inline"
            assert "x-lcm-summaries" not in headers
            assert upstream.summary_requested.wait(10)
            upstream.let_go()
            lines = [line for line in response.iter_lines() if line]
        streamed = comment_figures(lines)
        expected = unstreamed_figures(proxy_factory, url)
    same_figures({name: streamed.get(name) for name in FIGURES}, expected)
    assert streamed["x-lcm-conversation-id"] == headers["x-lcm-conversation-id"]
    assert headers["x-lcm-tokens-sent"] == expected["x-lcm-tokens-sent"]  # known before the compaction
    # The figures come before the first data event, and the stream is otherwise the upstream's.
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert max(i for i, line in enumerate(lines) if line.startswith(": x-lcm-")) < first_data
    assert lines[-1] == "data: [DONE]" and '"Pump 3."' in "\n".join(lines)


def test_a_stream_whose_compaction_finishes_within_the_grace_carries_every_header(
    proxy_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grace far above what this compaction takes (its summaries are answered at once), so that a loaded
    # machine cannot make it the other case.
    monkeypatch.setattr(routes, "STREAM_HEADER_GRACE_SECONDS", 120.0, raising=False)
    upstream = HeldSummaries()
    upstream.release.set()  # summaries answered at once
    with serve_in_thread(upstream.app) as url:
        proxy = start(proxy_factory, url, deadline=120)
        with httpx.stream(
            "POST", f"{proxy.base_url}/chat/completions", json={**REQUEST, "stream": True}, timeout=60
        ) as response:
            assert response.status_code == 200
            headers = dict(response.headers)
            lines = [line for line in response.iter_lines() if line]
        expected = unstreamed_figures(proxy_factory, url)
    same_figures({name: headers.get(name) for name in FIGURES}, expected)
    assert not any(line.startswith(": x-lcm-") for line in lines)  # no second copy in the body
    assert lines[-1] == "data: [DONE]"
