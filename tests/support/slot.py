"""A fake llama.cpp server with one slot: what it re-reads is what the measurements are about.

Like llama.cpp's ``llama-server``, it keeps the token sequence of its last prompt and evaluates only the tokens
after the first one that differs (its answer's ``timings.prompt_n``); a prompt over its context size is refused
with llama.cpp's 400 ``exceed_context_size_error``; ``GET /props`` states the context size. A prompt is its
messages in a fixed chat template, tokenised with the proxy's o200k. Summariser requests (recognised by the
proxy's prompts) get a short summary of their source; chat requests a short answer. Every request is recorded
with what it cost (``calls``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy import tokens
from tests.support.sim import is_summary_request


def template(messages: list[dict[str, Any]]) -> str:
    """A ChatML-like rendering, as llama.cpp's template would lay the messages out."""
    out = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode() if content else ""
        if message.get("tool_calls"):
            text += orjson.dumps(message["tool_calls"]).decode()
        out.append(f"<|im_start|>{message.get('role')}\n{text}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def encode(text: str) -> list[int]:
    encoding = tokens._encoding()
    assert encoding is not None, "tiktoken's o200k encoding is needed"
    return list(encoding.encode(text, disallowed_special=()))


@dataclass
class SlotCall:
    summary: bool
    prompt_tokens: int
    prompt_n: int  # tokens evaluated: those after the first one that differs from the slot's last prompt
    status: int
    body: dict[str, Any]
    started: float


@dataclass
class SlotServer:
    n_ctx: int = 2048
    answer: str = "Noted. Start small and keep a notebook."
    # Like a small real model: every answer and summary runs to the request's max_tokens.
    verbose: bool = False
    calls: list[SlotCall] = field(default_factory=list)
    _slot: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        routes = [Route("/v1/chat/completions", self.chat, methods=["POST"]), Route("/props", self.props)]
        self.app = Starlette(routes=routes)

    def chat_calls(self) -> list[SlotCall]:
        return [c for c in self.calls if not c.summary]

    def summary_calls(self) -> list[SlotCall]:
        return [c for c in self.calls if c.summary]

    async def props(self, request: Request) -> Response:
        return JSONResponse({"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": 1})

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        started = time.perf_counter()
        prompt = encode(template(body["messages"]))
        summary = is_summary_request(body)
        limit = len(prompt) + int(body.get("max_tokens") or 0)
        if limit > self.n_ctx:
            self.calls.append(SlotCall(summary, len(prompt), 0, 400, body, started))
            message = (
                f"request ({len(prompt)} tokens) exceeds the available context size ({self.n_ctx} tokens), try"
                " increasing it"
            )
            error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
            return JSONResponse({"error": error}, status_code=400)
        same = 0
        for a, b in zip(self._slot, prompt, strict=False):
            if a != b:
                break
            same += 1
        self._slot = prompt
        prompt_n = max(1, len(prompt) - same)
        self.calls.append(SlotCall(summary, len(prompt), prompt_n, 200, body, started))
        if summary:
            source = str(body["messages"][-1].get("content"))
            content = "Summary: " + " ".join(re.findall(r"[A-Za-z0-9_]+", source)[:40])
        else:
            content = self.answer
        if self.verbose and body.get("max_tokens"):
            words = re.findall(r"[A-Za-z0-9_]+", str(body["messages"][-1].get("content"))) or ["noted"]
            content = " ".join(words[i % len(words)] for i in range(int(body["max_tokens"]) * 3 // 4))
        timings = {"prompt_n": prompt_n, "predicted_n": 8}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": 8, "total_tokens": len(prompt) + 8}
        reply = {
            "id": "chatcmpl-slot",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "local-model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": usage,
            "timings": timings,
        }
        if not body.get("stream"):
            return JSONResponse(reply)

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            data = {"id": "chatcmpl-slot", "object": "chat.completion.chunk", "model": reply["model"]}
            return b"data: " + orjson.dumps({**data, "choices": [choice], **extra}) + b"\n\n"

        async def events() -> Any:
            yield chunk({"role": "assistant", "content": content}, None)
            yield chunk({}, "stop", usage=usage, timings=timings)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
