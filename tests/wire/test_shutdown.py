"""A request still waiting when the server stops gets OpenAI's error JSON, marked retryable, not uvicorn's
text/plain 500."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from proxy.app import create_app
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import make_config
from tests.support.servers import serve_in_thread


def test_a_request_cut_by_shutdown_gets_a_retryable_openai_error(
    fake_upstream: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    fake_upstream.enqueue(Reply(content="too late", delay=8))
    app = create_app(make_config(upstream_url, tmp_path / "data"))
    outcome: dict[str, Any] = {}
    with serve_in_thread(app) as url:

        def ask() -> None:
            body = {"model": "test-model", "messages": [{"role": "user", "content": "slow one"}]}
            outcome["response"] = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)

        client = threading.Thread(target=ask)
        client.start()
        deadline = time.monotonic() + 20
        while not fake_upstream.requests:  # the request is in flight, waiting for the upstream
            assert time.monotonic() < deadline, "the request never reached the upstream"
            time.sleep(0.01)
    # Leaving the block stopped the server: after its graceful period it cancelled the waiting request.
    client.join(timeout=30)
    response: httpx.Response = outcome["response"]
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == "shutting_down"
    assert response.headers.get("x-should-retry") != "false"
