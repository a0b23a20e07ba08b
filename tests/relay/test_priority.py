"""Users first on a single-slot local server: a background summary gives way to the user's next turn.

The fake below behaves like llama.cpp with one slot: one request at a time, and a request whose client hangs
up stops being processed (its slot is freed). The summary it is asked for would take a minute.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.relay.priority import is_local
from tests.support.servers import serve_in_thread
from tests.support.sim import is_summary_request

SUMMARY_SECONDS = 60.0


class SingleSlot:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.summary_started = threading.Event()
        self.slot = asyncio.Lock()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        summary = is_summary_request(body)
        async with self.slot:
            if summary:
                self.events.append("summary started")
                self.summary_started.set()
                try:  # generating; a client that hangs up frees the slot
                    await asyncio.wait_for(hung_up(request), SUMMARY_SECONDS)
                    self.events.append("summary abandoned")
                    return Response(status_code=499)
                except TimeoutError:
                    self.events.append("summary finished")
                text = "Notes: the user discussed the pump."
            else:
                self.events.append("chat answered")
                text = "Answer."
        message = {"role": "assistant", "content": text}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
        )


async def hung_up(request: Request) -> None:
    """Return when the client closes the connection: with the body read, the server's next message is
    ``http.disconnect``, delivered when the connection is lost (no polling)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def turns(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user", "content": f"Point {i}: the pump in room {i} runs at {i + 30} psi. " * 4})
        out.append({"role": "assistant", "content": f"Noted point {i} about the pump and its pressure."})
    return out


def test_a_background_summary_gives_way_to_the_next_turn(proxy_factory: Any) -> None:
    events = turn_after_background_summary(proxy_factory, {})
    # The user's turn did not queue behind the summary: the summary was abandoned, then the turn answered.
    assert events == ["chat answered", "summary started", "summary abandoned", "chat answered"]


def turn_after_background_summary(proxy_factory: Any, lcm: dict[str, Any]) -> list[str]:
    server = SingleSlot()
    with serve_in_thread(server.app) as url:
        model = {
            "model_name": "local",
            "litellm_params": {"model": "openai/local", "api_base": f"{url}/v1", "api_key": "k-12345678"},
            "model_info": {"max_input_tokens": 3000},
        }
        proxy = proxy_factory(models=[model], lcm={"summary_timeout": 120, **lcm}, request_timeout=120)
        history = turns(18)
        with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
            first = client.post("/chat/completions", json={"model": "local", "messages": [*history[:-1]]})
            assert first.status_code == 200 and first.headers["x-lcm-compaction"] == "scheduled"
            assert server.summary_started.wait(10)  # the background compaction holds the only slot
            second = client.post(
                "/chat/completions",
                json={"model": "local", "messages": [*history, {"role": "user", "content": "And room 3?"}]},
            )
        assert second.status_code == 200
    return server.events[:4]


def test_only_servers_on_this_machine_yield_by_default() -> None:
    assert is_local("http://127.0.0.1:8080/v1") and is_local("http://localhost:11434") and is_local("http://[::1]:1")
    assert not is_local("https://api.openai.com/v1") and not is_local(None) and not is_local("http://10.0.0.5:8000")


def test_a_summary_cancelled_twice_in_a_row_runs_to_its_end_the_third_time() -> None:
    """On a machine too slow to write a summary between two turns, yielding every time would mean no summary is
    ever written: the third call in a row is held (the chat request that arrives waits for it), and once one
    has finished, the next yields again."""
    from proxy.engine.summarize import SummaryPreempted, Yielding
    from proxy.relay.priority import PREEMPTIONS_BEFORE_HOLDING, Priority

    async def scenario() -> list[str]:
        priority = Priority("always")
        outcomes: list[str] = []
        for _ in range(PREEMPTIONS_BEFORE_HOLDING + 2):
            started = asyncio.Event()
            release = asyncio.Event()

            async def call(started: asyncio.Event = started, release: asyncio.Event = release) -> str:
                started.set()
                await release.wait()
                return "summary"

            background = asyncio.create_task(priority.background("llama", call, Yielding(background=True)))
            await started.wait()
            leave = priority.enter("llama")  # the user's next turn arrives while the summary runs
            release.set()
            try:
                outcomes.append(await background)
            except SummaryPreempted:
                outcomes.append("preempted")
            leave()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes == ["preempted"] * PREEMPTIONS_BEFORE_HOLDING + ["summary", "preempted"]


def test_a_summary_refused_twice_because_the_server_is_busy_starts_the_third_time() -> None:
    """A server never idle (parallel conversations) would refuse every background call; the third in a row
    starts behind the chat request in flight."""
    from proxy.engine.summarize import SummaryPreempted, Yielding
    from proxy.relay.priority import PREEMPTIONS_BEFORE_HOLDING, Priority

    async def call() -> str:
        return "summary"

    async def scenario() -> list[str]:
        priority = Priority("always")
        leave = priority.enter("llama")  # a chat request stays in flight throughout
        outcomes: list[str] = []
        for _ in range(PREEMPTIONS_BEFORE_HOLDING + 1):
            try:
                outcomes.append(await priority.background("llama", call, Yielding(background=True)))
            except SummaryPreempted:
                outcomes.append("refused")
        leave()
        return outcomes

    assert asyncio.run(scenario()) == ["refused"] * PREEMPTIONS_BEFORE_HOLDING + ["summary"]
