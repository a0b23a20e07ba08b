"""A learned context size does not last for ever (``proxy.upstream.windows``, ``context_window_recheck_seconds``):
once due, the next request asks the server again and its answer replaces the old size, so one refusal quoting
a tiny window, or a server since restarted with a larger context, no longer shrinks the model until restart.

The server is a real one on 127.0.0.1 whose ``GET /props`` states what the test sets; time is a clock the test
moves (``ServerWindows.clock``): nothing waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.app import create_app
from proxy.config.loading import parse_config
from proxy.upstream.routing import ModelRouter, ResolvedModel
from proxy.upstream.windows import ServerWindows
from tests.support.fakes import FakeUpstream, Reply
from tests.support.servers import serve_in_thread

RECHECK = 600.0
TINY = "request (300 tokens) exceeds the available context size (256 tokens), try increasing it"


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    """A llama.cpp-like server: ``GET /props`` states ``n_ctx`` (None: answers 404), and counts the asks."""

    url: str = ""
    n_ctx: int | None = 2048
    asked: int = 0
    fake: FakeUpstream = field(default_factory=FakeUpstream)


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()

    async def props(request: Request) -> Response:
        state.asked += 1
        if state.n_ctx is None:
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        return JSONResponse({"default_generation_settings": {"n_ctx": state.n_ctx}, "total_slots": 1})

    app = Starlette(routes=[*state.fake.app.routes, Route("/props", props)])
    with serve_in_thread(app) as url:
        state.url = url
        yield state


def _entry(api_base: str) -> dict[str, Any]:
    return {
        "model_name": "local",
        "litellm_params": {"model": "openai/local", "api_base": api_base, "api_key": "sk-local"},
        "model_info": {"max_input_tokens": 8192},
    }


def _target(api_base: str) -> ResolvedModel:
    return ModelRouter(parse_config({"model_list": [_entry(api_base)]}).model_list).resolve("local")


def test_a_due_window_is_asked_again_and_grows_back(server: Server) -> None:
    async def run() -> None:
        clock = Clock()
        windows = ServerWindows(RECHECK, clock)
        target = _target(f"{server.url}/v1")
        windows.start([target])
        await windows.ready(target)
        assert (windows.get(target).window, server.asked) == (2048, 1)  # type: ignore[union-attr]
        windows.learn_from_refusal(target, TINY)  # one refusal quoting a tiny window
        assert windows.get(target).window == 256  # type: ignore[union-attr]
        server.n_ctx = 4096  # the server, restarted with a larger context
        clock.now = RECHECK - 1
        await windows.ready(target)
        assert (windows.get(target).window, server.asked) == (256, 1)  # type: ignore[union-attr]  # not due yet
        clock.now = RECHECK
        await windows.ready(target)  # due: asked again, and the request waits for the answer
        learned = windows.get(target)
        assert learned is not None and (learned.window, learned.how, server.asked) == (4096, "GET /props", 2)
        await windows.ready(target)
        assert server.asked == 2  # once per interval, not per request
        await windows.close()

    asyncio.run(run())


def test_a_server_that_no_longer_states_its_window_leaves_the_configured_one(server: Server) -> None:
    async def run() -> None:
        clock = Clock()
        windows = ServerWindows(RECHECK, clock)
        target = _target(f"{server.url}/v1")
        windows.start([target])
        await windows.ready(target)
        assert windows.get(target) is not None
        server.n_ctx = None
        clock.now = RECHECK
        await windows.ready(target)
        assert windows.get(target) is None and server.asked == 2
        await windows.close()

    asyncio.run(run())


def test_an_unreachable_server_keeps_what_was_learned_for_another_interval() -> None:
    async def run() -> None:
        clock = Clock()
        windows = ServerWindows(RECHECK, clock)
        target = _target("http://127.0.0.1:9/v1")  # nothing listens: the startup probe learns nothing
        windows.start([target])
        await windows.ready(target)
        windows.learn_from_refusal(target, TINY)
        clock.now = RECHECK
        await windows.ready(target)  # asked again, unreachable: the refusal's size holds
        learned = windows.get(target)
        assert learned is not None and learned.window == 256 and learned.checked == RECHECK
        await windows.close()

    asyncio.run(run())


def test_a_refusals_window_lapses_where_no_server_is_asked() -> None:
    clock = Clock()
    windows = ServerWindows(RECHECK, clock)
    target = _target("http://127.0.0.1:9/v1")  # never started: probe_context_window off, or not OpenAI's protocol
    windows.learn_from_refusal(target, TINY)
    clock.now = RECHECK - 1
    assert windows.get(target).window == 256  # type: ignore[union-attr]
    clock.now = RECHECK
    assert windows.get(target) is None  # the configured window again, until another refusal
    windows.learn_from_refusal(target, TINY)
    assert windows.get(target).window == 256  # type: ignore[union-attr]
    assert ServerWindows(None, clock).recheck_after is None  # null in the config: held until the process ends


def test_one_refusal_quoting_a_tiny_window_does_not_shrink_the_model_until_restart(
    server: Server, tmp_path: Path
) -> None:
    """Served: a refusal quoting 256 tokens makes every tenant's budget 256; once the interval has passed the next
    request asks the server again, and the model's window is the server's own again."""
    refused = Reply(status=400, error_message=TINY, error_type="exceed_context_size_error")
    server.fake.enqueue(refused, Reply(content="ok"))
    config = parse_config(
        {
            "model_list": [_entry(f"{server.url}/v1")],
            "general_settings": {"data_dir": str(tmp_path)},
            "lcm_settings": {"context_window_recheck_seconds": RECHECK},
        }
    )
    app = create_app(config)
    body = {"model": "local", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
    with serve_in_thread(app) as proxy, httpx.Client(base_url=proxy, timeout=60) as client:
        windows: ServerWindows = app.state.lcm.upstream.windows
        assert windows.recheck_after == RECHECK
        # The test's clock, from here: ahead of the monotonic clock the startup probe may have used.
        clock = Clock(time.monotonic())
        windows.clock = clock
        assert client.post("/v1/chat/completions", json=body).status_code == 200  # retried within 256
        assert _window(client) == (256, "a refusal")
        server.n_ctx = 4096
        clock.now += RECHECK
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert _window(client) == (4096, "GET /props")
    assert [r.body["messages"][-1]["content"] for r in server.fake.requests] == ["hello"] * 3


def _window(client: httpx.Client) -> tuple[int, str]:
    (local,) = client.get("/lcm/models").json()["data"]
    (deployment,) = local["deployments"]
    assert local["window"] == deployment["server_window"]
    return local["window"], deployment["learned_from"]
