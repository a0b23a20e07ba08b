"""What the Responses door stores: one conversation per Codex session, a sub-agent's linked to it, and an export
that gives back every item as it was sent (reasoning with its encrypted content, a large tool output stored out
of line, and the AGENTS.md message among the instructions)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from proxy.engine.export import export_conversation
from proxy.store.location import Location
from tests.support.fakes import FakeUpstream, Reply


def msg(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def post(proxy: Any, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    answer = httpx.post(f"{proxy.url}/v1/responses", json=body, headers={"authorization": "Bearer k", **headers})
    assert answer.status_code == 200, answer.text
    return answer


async def _export(data_dir: Path, conversation: str) -> list[dict[str, Any]]:
    store, files = Location(data_dir).stores()
    await store.open()
    try:
        return await export_conversation(store, files, None, conversation)
    finally:
        await store.close()


def test_a_codex_sub_agent_is_a_conversation_of_its_own_linked_to_its_session(
    responses_proxy: Any, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = lambda body: Reply(content="ok")

    def ask(agent: str, text: str) -> str:
        metadata = json.dumps({"session_id": "019a-s", "agent_name": agent, "request_kind": "turn"})
        headers = {"session-id": "019a-s", "x-codex-turn-metadata": metadata}
        return post(responses_proxy, {"model": "local-codex", "input": text}, headers).headers["x-lcm-conversation-id"]

    main = ask("/root", "plan the refactor")
    worker = ask("/root/worker-1", "search the code base for callers")
    assert main != worker
    assert ask("/root", "plan the refactor") == main  # the same session, the same conversation
    assert httpx.get(f"{responses_proxy.url}/lcm/conversations/{worker}").json()["linked_to"] == main
    assert httpx.get(f"{responses_proxy.url}/lcm/conversations/{main}").json()["linked_to"] is None


def test_the_export_gives_back_every_item_as_it_was_sent(responses_proxy: Any, fake_upstream: FakeUpstream) -> None:
    fake_upstream.responder = lambda body: Reply(content="done")
    big_output = "\n".join(f"line {i}: a long tool output that is stored out of line" for i in range(3000))
    items = [
        msg("developer", "You are Codex."),
        msg("user", "# AGENTS.md instructions for /work\n\n<INSTRUCTIONS>\nRULE-7731\n</INSTRUCTIONS>"),
        msg("user", "list the files"),
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-opaque-blob=="},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command", "arguments": "{}",
         "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": big_output},
        msg("user", "thanks, and now?"),
    ]  # fmt: skip
    answer = post(responses_proxy, {"model": "local-codex", "input": items}, {"session-id": "019a-export"})
    conversation = answer.headers["x-lcm-conversation-id"]
    sent = fake_upstream.last.body["messages"]
    assert "RULE-7731" in json.dumps(sent[:2])  # the instructions lead what was forwarded
    exported = asyncio.run(_export(Path(str(responses_proxy.config.general_settings.data_dir)), conversation))
    assert exported[: len(items)] == items
    assert exported[len(items)]["content"][0]["text"] == "done"  # the relayed answer, stored after them
