"""An upstream whose summary requests wait until the test lets them go, and a proxy on it with an inline
compaction deadline: what a client sees while compaction runs."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.sim import is_summary_request


class HeldSummaries:
    def __init__(self) -> None:
        self.summary_requested = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.release = asyncio.Event()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    def let_go(self) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.release.set)

    async def chat(self, request: Request) -> Response:
        self.loop = asyncio.get_running_loop()
        body = json.loads(await request.body())
        if is_summary_request(body):
            self.summary_requested.set()
            await self.release.wait()
            return self._answer(body, "Notes: the user described the pumps.")
        if body.get("stream"):
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
            events = [
                {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Pump 3."}}]},
                {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return Response(text, media_type="text/event-stream")
        return self._answer(body, "Pump 3.")

    @staticmethod
    def _answer(body: dict[str, Any], text: str) -> Response:
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user", "content": f"Pump {i} in hall {i % 5} reads {i * 3 + 20} psi today. " * 5})
        out.append({"role": "assistant", "content": f"Noted the reading of pump {i}."})
    out.append({"role": "user", "content": "Which pump is worst?"})
    return out


def start(proxy_factory: Any, url: str, deadline: float) -> Any:
    model = {
        "model_name": "local",
        "litellm_params": {"model": "openai/local", "api_base": f"{url}/v1", "api_key": "k-12345678"},
        "model_info": {"max_input_tokens": 2048},
    }
    # The inline path: a summary model whose calls do not give way to chat requests (a hosted one). A server on
    # this machine (loopback, ``background_yields: auto``) summarises between turns instead, never inline.
    lcm = {"inline_compaction_seconds": deadline, "summary_timeout": 120, "background_yields": "never"}
    return proxy_factory(models=[model], lcm=lcm, request_timeout=120)
