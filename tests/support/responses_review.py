"""Shared setup of the Responses door's review tests: a Codex-shaped history and a proxy on the strict fake."""

from __future__ import annotations

from typing import Any

from tests.support.fake_responses import FakeResponses, responses_models

HEADERS = {"authorization": "Bearer sk-x"}
CODEX = {**HEADERS, "session-id": "019a-review-session"}
FACT = "The vault code is ZEBRA-9."


def msg(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


BASE = msg("developer", "You are Codex.")
AGENTS = msg("user", "# AGENTS.md instructions for /work\n\n<INSTRUCTIONS>\nRULE-7731\n</INSTRUCTIONS>")


def history() -> list[dict[str, Any]]:
    return [BASE, AGENTS, msg("user", "USER-1: hello"), msg("assistant", FACT), msg("user", "USER-2: go on"),
            msg("assistant", "done")]  # fmt: skip


def start(app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, **kw: Any) -> Any:
    return app_factory(models=responses_models(fake_responses_server[1], upstream_url), **kw)


def post(proxy: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return proxy.client.post("/v1/responses", json=body, headers=headers or HEADERS)
