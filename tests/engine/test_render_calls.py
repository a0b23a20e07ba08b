"""How a tool call reads in the summariser's transcript: its name as sent (an empty one stays empty), ``?`` only
for a call that has no name at all."""

from __future__ import annotations

from proxy.dialects import CHAT
from proxy.engine.render import render_message


def _calls(*calls: dict[str, object]) -> list[str]:
    message = {"role": "assistant", "content": None, "tool_calls": list(calls)}
    return [line for line in render_message(message, 0.0, CHAT).splitlines() if line.startswith("-> calls")]


def test_a_named_call_reads_with_its_name_and_arguments() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    assert _calls(call) == ['-> calls read_file({"path": "a.py"})']


def test_an_empty_name_stays_empty_and_a_missing_one_is_a_question_mark() -> None:
    empty = {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{}"}}
    custom = {"id": "c2", "type": "custom", "custom": {"name": "x", "input": "y"}}
    assert _calls(empty, custom) == ["-> calls ({})", "-> calls ?()"]
