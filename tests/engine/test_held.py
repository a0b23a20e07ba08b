"""Recall blocks held in their messages (``proxy/engine/held.py``): a block goes back only into the very message
it went into, at its place; the memory forgets a block past the request's end."""

from __future__ import annotations

from proxy.dialects import CHAT
from proxy.engine import held
from tests.support.engine import assistant, user

BLOCK_TEXT = (
    '<recalled_history source="lcm-proxy" trust="untrusted">\n[msg_1 | user] the pump reads 42 psi\n</recalled_history>'
)


def block(seq: int, message: dict[str, str], after: bool = False) -> held.Block:
    return held.Block(seq, BLOCK_TEXT, 30, (1,), held.digest(message), after)


def test_a_block_goes_back_into_its_own_message_only() -> None:
    question, result = user("What does the pump read?"), {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    raw = [assistant("Noted."), question, assistant("It reads 42."), result]
    out, placed = held.apply(CHAT, raw, 10, [block(11, question), block(13, result, after=True)])
    assert out[1]["content"] == f"{BLOCK_TEXT}\n\nWhat does the pump read?"  # before the question's words
    assert out[3]["content"] == f"ok\n\n{BLOCK_TEXT}"  # after the tool result
    assert out[0] == raw[0] and out[2] == raw[2] and len(placed) == 2
    # Another message at the block's place (a deletion kept a prefix, new messages came): it does not go back.
    other = [assistant("Noted."), user("Something else entirely?")]
    out, placed = held.apply(CHAT, other, 10, [block(11, question)])
    assert out == other and placed == ()
    # Outside the raw messages forwarded (the cut moved past it): not placed either.
    out, placed = held.apply(CHAT, raw, 12, [block(11, question)])
    assert out == raw and placed == ()


def test_the_memory_holds_blocks_for_the_messages_a_request_still_carries() -> None:
    memory, question = held.HeldRecall(), user("What does the pump read?")
    kept = held.Held(10, ("sum_a",), held.prefix_key("summary", 10), (block(11, question),))
    memory.keep("c", kept)
    assert memory.get("c", 12) == kept
    assert memory.get("c", 11) is None  # a shorter request (the client dropped messages): let go
    memory.keep("c", held.Held(10, ("sum_a",), kept.key, ()))
    assert memory.get("c", 12) is None  # nothing held: nothing kept
    assert held.prefix_key("summary", 10) != held.prefix_key("summary", 11) != held.prefix_key("other", 11)


def test_the_memory_is_bounded() -> None:
    memory, question = held.HeldRecall(), user("What does the pump read?")
    for i in range(held.MAX_CONVERSATIONS + 5):
        memory.keep(f"c{i}", held.Held(0, (), "k", (block(0, question),)))
    assert memory.get("c0", 1) is None and memory.get(f"c{held.MAX_CONVERSATIONS + 4}", 1) is not None
    assert len(memory._held) == held.MAX_CONVERSATIONS
