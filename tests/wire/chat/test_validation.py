"""Malformed requests get a 4xx OpenAI error naming the parameter, never a 5xx, and never reach upstream."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequestError
from proxy.wire.chat.validation import validate_chat_request
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy

USER = {"role": "user", "content": "hi"}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [USER], **fields}


def without(key: str) -> dict[str, Any]:
    b = body()
    del b[key]
    return b


# (id, request body or raw bytes, expected status, expected param)
MALFORMED: list[tuple[str, Any, int, str | None]] = [
    ("invalid_json", b'{"model": "test-model", "messages": [', 400, None),
    ("empty_body", b"", 400, None),
    ("json_array", b"[1, 2]", 400, None),
    ("json_string", b'"hello"', 400, None),
    ("missing_model", without("model"), 400, "model"),
    ("model_not_string", body(model=42), 400, "model"),
    ("model_empty", body(model=""), 400, "model"),
    ("missing_messages", without("messages"), 400, "messages"),
    ("messages_not_list", body(messages="hi"), 400, "messages"),
    ("messages_empty", body(messages=[]), 400, "messages"),
    ("message_not_object", body(messages=["hi"]), 400, "messages[0]"),
    ("missing_role", body(messages=[{"content": "hi"}]), 400, "messages[0].role"),
    ("bad_role", body(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    ("user_content_missing", body(messages=[{"role": "user"}]), 400, "messages[0].content"),
    ("user_content_number", body(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    ("part_bad_type", body(messages=[{"role": "user", "content": [{"type": "video"}]}]), 400, "messages[0].content[0].type"),
    ("text_part_no_text", body(messages=[{"role": "user", "content": [{"type": "text"}]}]), 400, "messages[0].content[0].text"),
    ("image_part_no_url", body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400, "messages[0].content[0].image_url.url"),
    ("assistant_empty", body(messages=[USER, {"role": "assistant"}]), 400, "messages[1].content"),
    ("tool_calls_not_list", body(messages=[USER, {"role": "assistant", "tool_calls": {}}]), 400, "messages[1].tool_calls"),
    ("tool_call_args_object", body(messages=[USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]), 400, "messages[1].tool_calls[0].function.arguments"),
    ("tool_without_call_id", body(messages=[USER, {"role": "tool", "content": "r"}]), 400, "messages[1].tool_call_id"),
    ("second_message_bad", body(messages=[USER, {"role": "user", "content": None}]), 400, "messages[1].content"),
    ("temperature_string", body(temperature="hot"), 400, "temperature"),
    ("temperature_range", body(temperature=3.5), 400, "temperature"),
    ("top_p_range", body(top_p=1.5), 400, "top_p"),
    ("n_zero", body(n=0), 400, "n"),
    ("n_float", body(n=1.5), 400, "n"),
    ("max_tokens_negative", body(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens_bool", body(max_tokens=True), 400, "max_tokens"),
    ("stream_string", body(stream="yes"), 400, "stream"),
    ("stream_options_without_stream", body(stream_options={"include_usage": True}), 400, "stream_options"),
    ("include_usage_string", body(stream=True, stream_options={"include_usage": "yes"}), 400, "stream_options.include_usage"),
    ("stop_too_many", body(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("stop_number", body(stop=[1]), 400, "stop[0]"),
    ("tools_not_list", body(tools={"type": "function"}), 400, "tools"),
    ("tool_bad_name", body(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400, "tools[0].function.name"),
    ("tool_params_not_object", body(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400, "tools[0].function.parameters"),
    ("tool_choice_bad", body(tool_choice="sometimes"), 400, "tool_choice"),
    ("response_format_string", body(response_format="json"), 400, "response_format"),
    ("metadata_list", body(metadata=["a"]), 400, "metadata"),
    ("user_number", body(user=5), 400, "user"),
    ("seed_string", body(seed="7"), 400, "seed"),
    ("file_data_number", body(messages=[{"role": "user", "content": [{"type": "file", "file": {"file_data": 5}}]}]), 400, "messages[0].content[0].file.file_data"),
    ("audio_data_missing", body(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]), 400, "messages[0].content[0].input_audio.data"),
    ("custom_call_function_string", body(messages=[USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "function": "x"}]}]), 400, "messages[1].tool_calls[0].function"),
    ("function_content_object", body(messages=[USER, {"role": "function", "name": "f", "content": {"a": 1}}]), 400, "messages[1].content"),
    ("function_content_parts", body(messages=[USER, {"role": "function", "name": "f", "content": [{"type": "text", "text": "r"}]}]), 400, "messages[1].content"),
    ("user_content_empty_array", body(messages=[{"role": "user", "content": []}]), 400, "messages[0].content"),
    ("system_content_empty_array", body(messages=[{"role": "system", "content": []}, USER]), 400, "messages[0].content"),
    ("tool_content_empty_array", body(messages=[USER, {"role": "tool", "tool_call_id": "c", "content": []}]), 400, "messages[1].content"),
    ("unknown_model", body(model="no-such-model"), 404, "model"),
    # Deeper than orjson serialises (254): raw bytes, written by hand.
    ("deep_message_extra", b'{"model": "test-model", "messages": [{"role": "user", "content": "hi", "metadata": ' + b"[" * 300 + b"]" * 300 + b"}]}", 400, "messages[0].metadata"),
    ("deep_top_level", b'{"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "x": ' + b'{"a": ' * 900 + b"1" + b"}" * 900 + b"}", 400, "x"),
]  # fmt: skip


@pytest.mark.parametrize(("payload", "status", "param"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_request(
    module_app_proxy: AppProxy, fake_upstream: FakeUpstream, payload: Any, status: int, param: str | None
) -> None:
    proxy = module_app_proxy  # the requests are refused: nothing is stored
    url = f"{proxy.base_url}/chat/completions"
    if isinstance(payload, bytes):
        response = proxy.client.post(url, content=payload, headers={"content-type": "application/json"}, timeout=10)
    else:
        response = proxy.client.post(url, json=payload, timeout=10)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert response.headers["x-should-retry"] == "false"
    assert fake_upstream.requests == []  # nothing was forwarded


def test_unknown_model_code(module_app_proxy: AppProxy) -> None:
    proxy = module_app_proxy
    response = proxy.client.post(f"{proxy.base_url}/chat/completions", json=body(model="gpt-nope"), timeout=10)
    assert response.json()["error"]["code"] == "model_not_found"
    assert "gpt-nope" in response.json()["error"]["message"]


def test_body_over_limit_is_413(app_factory: Any, fake_upstream: FakeUpstream) -> None:
    proxy = app_factory(max_body_bytes=4096)
    big = body(messages=[{"role": "user", "content": "x" * 10000}])
    response = proxy.client.post(f"{proxy.base_url}/chat/completions", json=big, timeout=10)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert fake_upstream.requests == []


def test_chunked_body_over_limit_is_413(app_factory: Any) -> None:
    proxy = app_factory(max_body_bytes=4096)

    def chunks():  # no content-length: the limit must hold while streaming the body in
        for _ in range(10):
            yield b"x" * 1000

    response = proxy.client.post(f"{proxy.base_url}/chat/completions", content=chunks(), timeout=10)
    assert response.status_code == 413


def test_unknown_path_and_method_are_json(module_app_proxy: AppProxy) -> None:
    proxy = module_app_proxy
    missing = proxy.client.get(f"{proxy.url}/v1/nothing", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    wrong = proxy.client.get(f"{proxy.base_url}/chat/completions", timeout=10)
    assert wrong.status_code == 405 and wrong.json()["error"]["message"]


def test_valid_edge_cases_pass_validation() -> None:
    # Things real clients send that must not be rejected.
    ok = [
        body(messages=[USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}]}]),
        body(messages=[{"role": "developer", "content": "d"}, USER], stop="END", n=None, temperature=0),
        body(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]),
        body(tool_choice={"type": "function", "function": {"name": "f"}}, some_vendor_field={"x": 1}),
        body(messages=[USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]),
        # The legacy function result: a string, or null; an assistant turn that only calls tools, with [].
        body(messages=[USER, {"role": "function", "name": "f", "content": "42"}, {"role": "function", "name": "f", "content": None}]),
        body(messages=[USER, {"role": "assistant", "content": [], "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
    ]  # fmt: skip
    # A tool whose JSON Schema nests objects 25 deep (its innermost value at level 55 of 64): unusual, not hostile.
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(25):
        schema = {"type": "object", "properties": {"x": schema}}
    ok.append(body(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}]))
    for b in ok:
        assert validate_chat_request(b) is b
    with pytest.raises(InvalidRequestError):
        validate_chat_request(body(temperature=float("nan")))
