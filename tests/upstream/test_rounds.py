"""One round of an answer, read from streamed chunks or a JSON result: the shapes providers really send, and
the malformed ones that must be the upstream's 502, never the proxy's 500."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import UpstreamError
from proxy.upstream.rounds import Round, check_chunk

SOURCE = "the upstream provider for model 'local' at http://127.0.0.1:9/v1"
BASE = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chunk(delta: Any = None, finish: str | None = None, index: Any = 0, **extra: Any) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}], **extra}


def call_delta(index: Any = None, call_id: str | None = None, name: str | None = None, args: str = "") -> Any:
    out: dict[str, Any] = {"function": {"arguments": args}}
    if index is not None:
        out["index"] = index
    if call_id is not None:
        out |= {"id": call_id, "type": "function"}
    if name is not None:
        out["function"]["name"] = name
    return out


def streamed(*chunks: dict[str, Any]) -> Round:
    answer = Round(SOURCE)
    for c in chunks:
        answer.add(c)
    return answer


def names(answer: Round) -> list[tuple[str | None, str, str]]:
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in answer.calls]


# --- streamed ----------------------------------------------------------------------------------------------


def test_text_role_finish_and_usage() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    answer = streamed(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, finish="stop"),
        {**BASE, "choices": [], "usage": usage},
    )
    assert (answer.role, answer.text, answer.finish_reason, answer.usage) == ("assistant", "Hello", "stop", usage)
    assert answer.calls == []
    assert answer.message() == {"role": "assistant", "content": "Hello"}


def test_text_in_the_finish_chunk_is_kept() -> None:
    answer = streamed(chunk({"role": "assistant", "content": "Let me "}), chunk({"content": "look."}, finish="stop"))
    assert answer.text == "Let me look." and answer.finish_reason == "stop"


def test_openai_parallel_calls_with_interleaved_arguments() -> None:
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, "a", "lcm_grep")]}),
        chunk({"tool_calls": [call_delta(1, "b", "lcm_describe")]}),
        chunk({"tool_calls": [call_delta(0, args='{"pattern":'), call_delta(1, args='{"id":')]}),
        chunk({"tool_calls": [call_delta(1, args=' "s_1"}'), call_delta(0, args=' "x"}')]}),
        chunk({}, finish="tool_calls"),
    )
    assert names(answer) == [("a", "lcm_grep", '{"pattern": "x"}'), ("b", "lcm_describe", '{"id": "s_1"}')]
    assert all(c["type"] == "function" for c in answer.calls)


@pytest.mark.parametrize("index", [0, None], ids=["all_index_0", "no_index"])
def test_a_new_id_starts_a_new_call_whatever_the_index(index: Any) -> None:
    """Servers that number every parallel call 0, or send no index: merged by index they made one call named
    'lcm_greplcm_describe'."""
    answer = streamed(
        chunk({"tool_calls": [call_delta(index, "a", "lcm_grep")]}),
        chunk({"tool_calls": [call_delta(index, args='{"pattern": "x"}')]}),
        chunk({"tool_calls": [call_delta(index, "b", "lcm_describe")]}),
        chunk({"tool_calls": [call_delta(index, args='{"id": "s_1"}')]}, finish="tool_calls"),
    )
    assert names(answer) == [("a", "lcm_grep", '{"pattern": "x"}'), ("b", "lcm_describe", '{"id": "s_1"}')]


def test_an_id_repeated_on_every_delta_continues_its_call() -> None:
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, "a", "get_weather", '{"city"')]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"arguments": ': "Oslo"}'}}]}),
    )
    assert names(answer) == [("a", "get_weather", '{"city": "Oslo"}')]


def test_calls_without_ids_are_told_apart_by_their_index() -> None:
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, name="f", args="{}")]}),
        chunk({"tool_calls": [call_delta(1, name="g", args="{")]}),
        chunk({"tool_calls": [call_delta(1, args="}")]}),
    )
    assert names(answer) == [(None, "f", "{}"), (None, "g", "{}")]


def test_null_index_and_null_function_continue_the_latest_call() -> None:
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, "a", "f", "{")]}),
        chunk({"tool_calls": [{"index": None, "function": {"arguments": "}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": None}]}),
    )
    assert names(answer) == [("a", "f", "{}")]


def test_tool_call_and_finish_in_one_chunk_and_raw_deltas_kept() -> None:
    first = call_delta(0, "a", "f", "{}")
    answer = streamed(chunk({"role": "assistant", "content": "Checking.", "tool_calls": [first]}, finish="tool_calls"))
    assert (answer.text, answer.finish_reason, names(answer)) == ("Checking.", "tool_calls", [("a", "f", "{}")])
    assert answer.call_deltas(0) == [first]
    assert answer.message() == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }


def test_other_choices_are_checked_but_not_accumulated() -> None:
    answer = streamed(chunk({"content": "zero"}), chunk({"content": "one"}, index=1), chunk({}, finish="stop"))
    assert answer.text == "zero"
    with pytest.raises(UpstreamError):
        streamed(chunk({"tool_calls": [call_delta("x", "a", "f")]}, index=1))


def test_content_as_a_list_of_parts_gives_its_text() -> None:
    answer = streamed(chunk({"content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "hi"}]}))
    assert answer.text == "hi"


MALFORMED_CHUNKS: list[tuple[str, Any]] = [
    ("not_an_object", ["x"]),
    ("choices_a_string", {**BASE, "choices": "abc"}),
    ("choices_a_number", {**BASE, "choices": 5}),
    ("choice_not_an_object", {**BASE, "choices": [1]}),
    ("choice_index_x", chunk({"content": "a"}, index="x")),
    ("delta_a_list", {**BASE, "choices": [{"index": 0, "delta": ["a"]}]}),
    ("content_a_number", chunk({"content": 5})),
    ("role_a_number", chunk({"role": 1})),
    ("finish_a_number", chunk({}, finish=3)),  # type: ignore[arg-type]
    ("usage_a_string", {**BASE, "choices": [], "usage": "lots"}),
    ("tool_calls_an_object", chunk({"tool_calls": {"index": 0}})),
    ("tool_call_a_string", chunk({"tool_calls": ["lcm_grep"]})),
    ("tool_index_x", chunk({"tool_calls": [call_delta("x", "a", "f")]})),
    ("tool_index_bool", chunk({"tool_calls": [call_delta(True, "a", "f")]})),
    ("tool_id_a_number", chunk({"tool_calls": [{"index": 0, "id": 7, "function": {"name": "f"}}]})),
    ("function_a_string", chunk({"tool_calls": [{"index": 0, "id": "a", "function": "f"}]})),
    ("name_a_number", chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": 5}}]})),
    (
        "arguments_an_object",
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": {}}}]}),
    ),
]


@pytest.mark.parametrize(("name", "bad"), MALFORMED_CHUNKS, ids=[n for n, _ in MALFORMED_CHUNKS])
def test_malformed_stream_data_is_a_bad_stream_naming_the_upstream(name: str, bad: Any) -> None:
    for check in (lambda: streamed(chunk({"content": "fine"}), bad), lambda: check_chunk(bad, SOURCE)):
        with pytest.raises(UpstreamError) as info:
            check()
        error = info.value
        assert (error.status, error.type, error.code) == (502, "upstream_error", "upstream_bad_stream")
        assert error.message.startswith("The upstream provider for model 'local' at http://127.0.0.1:9/v1 sent")


def test_malformed_errors_name_the_field_never_its_value() -> None:
    with pytest.raises(UpstreamError) as info:
        streamed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": {"secret": "s3cr3t"}}}]}))
    assert "function name" in info.value.message and "s3cr3t" not in info.value.message


# --- not streamed ------------------------------------------------------------------------------------------


def result(message: Any, finish: Any = "stop", **extra: Any) -> dict[str, Any]:
    body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m"}
    return {**body, "choices": [{"index": 0, "message": message, "finish_reason": finish}], **extra}


def test_from_response_reads_text_calls_finish_and_usage() -> None:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "lcm_grep", "arguments": '{"pattern": "x"}'}},
        {"id": "b", "type": "function", "function": {"name": "lcm_describe", "arguments": ""}},
    ]
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    answer = Round.from_response(
        result({"role": "assistant", "content": "Looking.", "tool_calls": calls}, "tool_calls", usage=usage), SOURCE
    )
    assert (answer.text, answer.finish_reason, answer.usage, answer.role) == (
        "Looking.",
        "tool_calls",
        usage,
        "assistant",
    )
    assert names(answer) == [("a", "lcm_grep", '{"pattern": "x"}'), ("b", "lcm_describe", "")]
    assert answer.message() == {"role": "assistant", "content": "Looking.", "tool_calls": answer.calls}
    empty = Round.from_response({"choices": []}, SOURCE)
    assert empty.message() == {"role": "assistant", "content": None} and empty.finish_reason is None


MALFORMED_RESULTS: list[tuple[str, Any]] = [
    ("not_an_object", "<html>oops</html>"),
    ("no_choices", {"id": "x"}),
    ("choices_a_string", {"choices": "abc"}),
    ("choice_a_string", {"choices": ["abc"]}),
    ("message_null", result(None)),
    ("content_a_number", result({"role": "assistant", "content": 5})),
    ("tool_calls_a_string", result({"role": "assistant", "content": None, "tool_calls": "x"})),
    ("function_null", result({"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": None}]})),
    ("call_null", result({"role": "assistant", "tool_calls": [None]})),
    ("name_null", result({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": None}}]})),
    ("name_a_number", result({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": 5}}]})),
    (
        "arguments_an_object",
        result({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}),
    ),
    ("finish_a_number", result({"role": "assistant", "content": "hi"}, finish=3)),
    ("usage_a_string", result({"role": "assistant", "content": "hi"}, usage="lots")),
]


@pytest.mark.parametrize(("name", "bad"), MALFORMED_RESULTS, ids=[n for n, _ in MALFORMED_RESULTS])
def test_malformed_result_is_a_bad_gateway_naming_the_upstream(name: str, bad: Any) -> None:
    with pytest.raises(UpstreamError) as info:
        Round.from_response(bad, SOURCE)
    error = info.value
    assert (error.status, error.type, error.code) == (502, "upstream_error", "upstream_bad_response")
    assert error.message.startswith("The upstream provider for model 'local' at http://127.0.0.1:9/v1 sent")


# --- issue 22: calls that cannot be told apart or run are malformed; one call in pieces stays one call --------


def test_the_whole_name_again_on_every_delta_is_one_call() -> None:
    """MiniMax through NVIDIA NIM repeats the id and the name on every delta: it became "lcm_greplcm_grep"."""
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, "a", "lcm_grep", '{"pattern":')]}),
        chunk({"tool_calls": [call_delta(0, "a", "lcm_grep", ' "x"}')]}, finish="tool_calls"),
    )
    assert names(answer) == [("a", "lcm_grep", '{"pattern": "x"}')]


def test_a_fresh_id_on_every_nameless_fragment_continues_the_call() -> None:
    """LM Studio sends every fragment of one call's arguments under a new id, with no name: one call each."""
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, "a", "lcm_grep", "")]}),
        chunk({"tool_calls": [call_delta(0, "f1", args='{"pattern":')]}),
        chunk({"tool_calls": [call_delta(0, "f2", args=' "x"}')]}, finish="tool_calls"),
    )
    assert names(answer) == [("a", "lcm_grep", '{"pattern": "x"}')]


def test_a_name_sent_after_an_empty_opening_delta_is_kept() -> None:
    answer = streamed(
        chunk({"tool_calls": [call_delta(0, "a", "", "")]}),
        chunk({"tool_calls": [call_delta(0, "a", "lcm_grep", "{}")]}, finish="tool_calls"),
    )
    assert names(answer) == [("a", "lcm_grep", "{}")]


SAME_ID_STREAMS = {
    "other_index": [call_delta(0, "a", "lcm_grep", "{}"), call_delta(1, "a", "lcm_grep", "{}")],
    "other_name": [call_delta(0, "a", "lcm_grep", "{}"), call_delta(0, "a", "lcm_describe", "{}")],
}


@pytest.mark.parametrize("shape", list(SAME_ID_STREAMS))
def test_two_streamed_calls_with_one_id_are_a_bad_stream(shape: str) -> None:
    first, second = SAME_ID_STREAMS[shape]
    answer = streamed(chunk({"tool_calls": [first]}))
    with pytest.raises(UpstreamError) as info:
        answer.add(chunk({"tool_calls": [second]}))
    assert (info.value.status, info.value.code) == (502, "upstream_bad_stream")
    assert info.value.message == f"T{SOURCE[1:]} sent a malformed stream event: two tool calls with the same id."


@pytest.mark.parametrize(
    "delta", [{"index": 0, "id": "a", "function": None}, call_delta(0, "a", "", "{}")], ids=["null", "empty"]
)
def test_a_call_without_a_name_at_the_finish_is_a_bad_stream(delta: Any) -> None:
    answer = streamed(chunk({"tool_calls": [delta]}))
    with pytest.raises(UpstreamError) as info:
        answer.add(chunk({}, finish="tool_calls"))
    assert "a tool call without a function name" in info.value.message
    with pytest.raises(UpstreamError):
        answer.end()


def test_two_calls_with_one_id_in_a_result_are_a_bad_response() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "lcm_grep", "arguments": "{}"}}
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": [call, call]}}]}
    with pytest.raises(UpstreamError) as info:
        Round.from_response(body, SOURCE)
    assert (info.value.code, info.value.message) == (
        "upstream_bad_response",
        f"T{SOURCE[1:]} sent a malformed response: two tool calls with the same id.",
    )
    unnamed = {"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": [{"id": "a", "function": {}}]}}]}
    with pytest.raises(UpstreamError, match="a tool call without a function name"):
        Round.from_response(unnamed, SOURCE)
