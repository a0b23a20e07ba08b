"""Processes the overhead benchmark measures, each on its own port: ``python -m bench.servers KIND PORT [UPSTREAM]``.

* ``fake``    — the fake OpenAI-compatible upstream (tests/fakes.py) under uvicorn;
* ``aiohttp`` — a bare pass-through forwarder (Starlette + aiohttp): the floor for a Python proxy;
* ``litellm`` — a bare forwarder that calls ``litellm.acompletion`` and nothing else.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def aiohttp_forwarder(upstream: str) -> Starlette:
    import aiohttp

    session: dict[str, Any] = {}

    async def chat(request: Request) -> Response:
        if "s" not in session:
            session["s"] = aiohttp.ClientSession()
        async with session["s"].post(
            f"{upstream}/v1/chat/completions", data=await request.body(), headers={"content-type": "application/json"}
        ) as upstream_response:
            return Response(
                await upstream_response.read(), status_code=upstream_response.status, media_type="application/json"
            )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def litellm_forwarder(upstream: str) -> Starlette:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        result = await litellm.acompletion(
            model=f"openai/{body['model']}",
            messages=body["messages"],
            api_base=f"{upstream}/v1",
            api_key="k",
            max_retries=0,
            num_retries=0,
        )
        return Response(orjson.dumps(result.model_dump()), media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "fake":
        from tests.fakes import FakeUpstream

        app: Any = FakeUpstream().app
    elif kind == "aiohttp":
        app = aiohttp_forwarder(sys.argv[3])
    elif kind == "litellm":
        app = litellm_forwarder(sys.argv[3])
    else:
        raise SystemExit(f"unknown server kind {kind}")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
