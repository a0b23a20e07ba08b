"""A local one-slot server (llama.cpp) summarises between turns, never inside one (issue 32).

Each summary request on the slot replaces what llama.cpp holds, and an inline compaction under a deadline was
cancelled by the next turn and thrown away. For a server on this machine the proxy answers an over-full request
from what fits and summarises after the response, while the server is idle; between two compactions the
forwarded requests only grow, so llama.cpp re-reads only the new turn. The server is ``tests/support/slot.py``:
a fake llama.cpp that counts the prompt tokens it would evaluate again.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx

from proxy.app import create_app
from proxy.config.loading import parse_config
from tests.support.fakes import wait_for
from tests.support.servers import serve_in_thread
from tests.support.sim import extends
from tests.support.slot import SlotServer


def turn_text(turn: int) -> str:
    text = (
        f"Turn {turn}. A note for project {turn % 5}: its budget is now {1000 + turn * 37} euros. I am planning "
        f"the next steps this week and want to avoid last year's mistakes. What should I check first?"
    )
    if turn % 9 == 8:  # a long message: the request arrives over its share (where compaction used to run inline)
        text += "".join(
            f" Line {i} of the meeting minutes: item {turn}-{i} was reviewed and agreed." for i in range(40)
        )
    return text


def config(url: str, data_dir: Path, **lcm: Any) -> Any:
    model = {
        "model_name": "local",
        "litellm_params": {"model": "openai/local-model", "api_base": f"{url}/v1"},
        "model_info": {"max_input_tokens": 8192},  # the example config's: the server's 2,048 comes from /props
    }
    return parse_config({"model_list": [model], "general_settings": {"data_dir": str(data_dir)}, "lcm_settings": lcm})


def chat(proxy: Any, url: str, slot: SlotServer, turns: int) -> list[tuple[int, int, str]]:
    """A user who reads each answer before typing the next question (the proxy idle in between); returns, per
    turn, where the slot's calls stood before the request and after the answer, and its ``x-lcm-compaction``."""
    engine = proxy.state.lcm.engine
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are concise."}]
    spans = []
    with httpx.Client(timeout=60) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": turn_text(turn)})
            before = len(slot.calls)
            body = {"model": "local", "messages": messages, "max_tokens": 64}
            response = client.post(f"{url}/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            spans.append((before, len(slot.calls), response.headers["x-lcm-compaction"]))
            messages.append(response.json()["choices"][0]["message"])
            conversation = response.headers["x-lcm-conversation-id"]
            assert wait_for(lambda c=conversation: engine.sweeps.current(c) is None, 30)
    return spans


def test_a_local_server_summarises_between_turns_and_the_prefix_holds_in_between(tmp_path: Path) -> None:
    slot = SlotServer(n_ctx=2048)
    with serve_in_thread(slot.app) as url:
        app = create_app(config(url, tmp_path, fresh_tail_count=8))
        with serve_in_thread(app) as proxy_url:
            spans = chat(app, proxy_url, slot, 36)
    # No summary request while a client waited: every turn made exactly its own chat call.
    for before, after, _ in spans:
        assert [c.summary for c in slot.calls[before:after]] == [False], slot.calls[before:after]
    # The long turns arrived over their share: answered from what fits, compacted after the answer.
    assert "evicted" in {spans[turn][2] for turn in range(8, 36, 9)}
    # An evicted turn is compacted after its answer too: before, it scheduled nothing, and once every turn
    # needed eviction no summary was written again. The next turn that is not evicted follows a summary.
    evicted = [turn for turn, span in enumerate(spans) if span[2] == "evicted"]
    assert all(spans[turn + 1][2] != "evicted" for turn in evicted if turn + 1 < len(spans)), spans
    assert slot.summary_calls(), "the chat outgrew the window: compaction must have run"
    assert all(c.status == 200 for c in slot.calls)  # every request fit the server's window
    # Between two compactions the forwarded requests only grow: each repeats the one before it, the recall
    # blocks it placed included (or up to the newest of those, should it give way), so the slot re-reads only
    # the new turn.
    chats = slot.chat_calls()
    first_summary = slot.calls.index(slot.summary_calls()[0])
    kept = 0
    for (a, b), (_, _, compaction) in zip(itertools.pairwise(chats), spans[1:], strict=True):
        summarised_between = any(c.summary for c in slot.calls[slot.calls.index(a) : slot.calls.index(b)])
        if slot.calls.index(a) < first_summary or summarised_between or compaction == "evicted":
            continue
        before, after = a.body["messages"], b.body["messages"]
        extends(before, after)  # byte for byte, or up to a recall block held that gave way to a new one
        kept += 1
    assert kept >= 10  # compactions are rare: most turns after the first one extend the request before
    compactions = len({slot.calls.index(c) for c in slot.summary_calls()})
    assert compactions < len(chats) // 2
