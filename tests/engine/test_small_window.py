"""A 200-turn conversation through a 2,048-token model with default settings (issue: context fidelity).

Every forwarded chat request is checked: no 400, within the budget, tool pairing valid, and never much less
than naive truncation would have sent: at least what truncation sends minus the share of the budget the
proxy keeps for summaries and recalled history (``limit - target``, see ``proxy.engine.budget``).
"""

from __future__ import annotations

from typing import Any

import httpx

from proxy import tokens
from proxy.config.lcm import LcmSettings
from proxy.engine import budget
from tests.support.fakes import FakeUpstream
from tests.support.sim import (
    TOOLS,
    ScriptedModel,
    check_tool_pairing,
    forwarded_tokens,
    is_summary_request,
    tool_result,
    without_recall,
)

WINDOW = 2048
RESERVE = WINDOW // 4  # the default output reserve on a small window (no max_tokens in the requests)
TINY = {"model_name": "tiny", "litellm_params": {"model": "openai/tiny"}, "model_info": {"max_input_tokens": WINDOW}}


def user_turn(turn: int) -> dict[str, Any]:
    if turn == 40:  # a 5,800-token paste: a 2k model must get a stub, not a refusal
        body = "".join(f"row {i}: sensor {i % 7} read {i * 37 % 1000} units at step {i}\n" for i in range(420))
        return {"role": "user", "content": f"Here is the log:\n{body}What stands out?"}
    if turn % 7 == 3:
        return {"role": "user", "content": f"Turn {turn}: use tools to look up topic {turn}."}
    detail = f"Turn {turn}: the pump in room {turn % 13} runs at {turn * 7 % 90} psi; I prefer checks on Mondays. "
    return {"role": "user", "content": detail * (1 + turn % 3)}


def truncation_tokens(messages: list[dict[str, Any]], limit: int) -> int:
    """What naive client-side truncation forwards: the newest whole messages that fit ``limit``."""
    total = 0
    for message in reversed(messages):
        cost = tokens.count_message(message)
        if total + cost > limit:
            break
        total += cost
    return total


def test_two_hundred_turns_through_a_2k_window_with_default_settings(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    model = ScriptedModel()
    fake_upstream.responder = model
    tiny = {**TINY, "litellm_params": {**TINY["litellm_params"], "api_base": f"{upstream_url}/v1", "api_key": "k-1"}}
    proxy = proxy_factory(models=[tiny])
    instructions = {"role": "system", "content": "You are a maintenance assistant."}
    transcript: list[dict[str, Any]] = [instructions]
    tool_tokens = tokens.count_text(__import__("orjson").dumps(TOOLS).decode())
    limit = WINDOW - RESERVE - tokens.count_messages([instructions]) - tool_tokens
    sizes = budget.sizes(LcmSettings(), limit)
    shortfalls = []
    checked = summarised = recalled = 0
    with httpx.Client(base_url=proxy.base_url, timeout=60) as client:
        for turn in range(200):
            transcript.append(user_turn(turn))
            for _round in range(3):
                before = len(fake_upstream.requests)
                response = client.post(
                    "/chat/completions", json={"model": "tiny", "messages": transcript, "tools": TOOLS}
                )
                assert response.status_code == 200, (turn, response.text)
                (sent,) = [r.body for r in fake_upstream.requests[before:] if not is_summary_request(r.body)]
                checked += 1
                sent_tokens = forwarded_tokens(sent)
                assert sent_tokens <= WINDOW - RESERVE, (turn, sent_tokens)  # Bounded
                check_tool_pairing(sent["messages"])
                assert sent["messages"][0] == instructions
                assert "lcm_grep" not in str(sent.get("tools"))  # the schemas would take a third of this window
                newest = without_recall(sent["messages"][-1])
                if transcript[-1]["role"] == "user" and "Here is the log" not in str(transcript[-1]["content"]):
                    assert newest == transcript[-1]  # verbatim (a paste this size is stubbed, see below)
                if turn == 40 and _round == 0:
                    assert "[LCM File: file_" in str(newest["content"]) and "row 419" not in str(newest["content"])
                messages_sent = tokens.count_messages(sent["messages"][1:])
                truncated = truncation_tokens(transcript[1:], limit)
                if messages_sent < truncated - (limit - sizes.target):
                    shortfalls.append((turn, messages_sent, truncated))
                summarised += int(response.headers["x-lcm-summaries"]) > 0
                recalled += int(response.headers["x-lcm-recalled"]) > 0
                message = response.json()["choices"][0]["message"]
                transcript.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    break
                transcript += [tool_result(call, turn) for call in message["tool_calls"]]
    assert shortfalls == []
    assert model.summary_calls > 0 and summarised > checked // 2 and recalled > 0
