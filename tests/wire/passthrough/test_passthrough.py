"""The rest of OpenAI's API through a real proxy to the fake upstream, with the official openai SDK as the
client: embeddings, legacy completions, moderations, audio, images, one model's object; and what the proxy
refuses itself (bad bodies, missing keys, unknown paths)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, AppProxy, RunningProxy

PROXY_KEY = "sk-proxy-client-key-0001"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 24


@pytest.fixture
def keyed(proxy_factory: Any) -> RunningProxy:
    return proxy_factory(api_keys=[{"key": PROXY_KEY, "tenant": "alice"}])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def module_keyed(module_app_factory: Any) -> AppProxy:
    """``keyed`` in process, shared by the module's tests of refused requests."""
    return module_app_factory(api_keys=[{"key": PROXY_KEY, "tenant": "alice"}])  # type: ignore[no-any-return]


def sdk(proxy: RunningProxy, key: str = PROXY_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, timeout=20)


def assert_forwarded_with_upstream_key(fake: FakeUpstream, path: str) -> dict[str, Any]:
    """The last upstream request went to ``path``, for the deployment's model, with its own key only."""
    last = fake.last
    assert last.path == path
    assert last.body["model"] == "fake-model"
    assert last.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert PROXY_KEY not in json.dumps(last.headers)
    return last.body


# --- the SDK through the proxy -----------------------------------------------------------------------------


def test_embeddings(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    result = sdk(keyed).embeddings.create(
        model="test-model", input=["alpha", "beta"], dimensions=3, user="u-1", extra_body={"vendor_flag": True}
    )
    # The SDK asks for base64 and decodes it: the upstream's string reached it unchanged.
    assert [d.embedding for d in result.data] == [[0.25, -0.5, 1.0]] * 2
    assert result.usage.prompt_tokens == 6
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/embeddings")
    assert body["input"] == ["alpha", "beta"]
    assert body["encoding_format"] == "base64"
    assert (body["dimensions"], body["user"], body["vendor_flag"]) == (3, "u-1", True)


def test_embeddings_plain_floats_without_the_v1_prefix(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    response = httpx.post(f"{proxy.url}/embeddings", json={"model": "test-model", "input": [[1, 2], [3]]}, timeout=20)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "list"
    assert response.json()["data"][1] == {"object": "embedding", "index": 1, "embedding": [0.25, -0.5, 1.0]}
    assert fake_upstream.last.body == {"model": "fake-model", "input": [[1, 2], [3]]}


def test_completions(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="Hello there"))
    result = sdk(keyed).completions.create(
        model="test-model", prompt="Say hello", max_tokens=5, echo=False, extra_body={"top_k": 3}
    )
    assert result.object == "text_completion"
    assert result.choices[0].text == "Hello there" and result.choices[0].finish_reason == "stop"
    assert result.usage is not None and result.usage.total_tokens == 18
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/completions")
    assert (body["prompt"], body["max_tokens"], body["echo"], body["top_k"]) == ("Say hello", 5, False, 3)


def test_completions_stream(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="one two three"))
    chunks = list(sdk(keyed).completions.create(model="test-model", prompt="count", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "one two three"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert all(c.usage is None for c in chunks)  # not asked for
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/completions")
    assert body["stream"] is True


def test_completions_stream_is_sse_ending_in_done(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="a b"))
    body = {"model": "test-model", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{proxy.base_url}/completions", json=body, timeout=20) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0].get("text", "") for c in chunks if c["choices"]) == "a b"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 18  # usage on its own chunk
    assert fake_upstream.last.body["stream_options"] == {"include_usage": True}


def test_moderations(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    result = sdk(keyed).moderations.create(model="test-model", input=["first text", "second text"])
    assert [r.flagged for r in result.results] == [True, True]
    assert result.results[0].categories.violence is True and result.results[0].category_scores.violence == 0.93
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/moderations")
    assert body["input"] == ["first text", "second text"]


def test_audio_transcription(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="the spoken words"))
    result = sdk(keyed).audio.transcriptions.create(
        model="test-model",
        file=("clip.wav", WAV, "audio/wav"),
        language="en",
        timestamp_granularities=["word", "segment"],
        extra_body={"vendor_option": "7"},
    )
    assert result.text == "the spoken words"
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/audio/transcriptions")
    assert body["file"] == {"filename": "clip.wav", "content_type": "audio/wav", "content": WAV}
    assert body["language"] == "en" and body["vendor_option"] == "7"
    assert body["timestamp_granularities[]"] == ["word", "segment"]
    assert body["response_format"] == "json"  # OpenAI's default, not LiteLLM's verbose_json
    assert fake_upstream.last.headers["content-type"].startswith("multipart/form-data")


def test_audio_transcription_as_text(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="plain words"))
    text = sdk(proxy).audio.transcriptions.create(
        model="test-model", file=("clip.wav", WAV, "audio/wav"), response_format="text"
    )
    assert text.strip() == "plain words"
    assert fake_upstream.last.body["response_format"] == "text"


def test_audio_speech(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    response = sdk(keyed).audio.speech.create(
        model="test-model", input="Hello", voice="alloy", response_format="wav", speed=1.25
    )
    assert response.content == b"ID3fake-audio:Hello"
    assert response.response.headers["content-type"] == "audio/wav"
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/audio/speech")
    assert (body["input"], body["voice"], body["response_format"], body["speed"]) == ("Hello", "alloy", "wav", 1.25)


def test_images_generate(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    result = sdk(keyed).images.generate(
        model="test-model", prompt="a red cube", n=2, size="256x256", extra_body={"vendor_seed": 9}
    )
    assert result.data is not None and [d.b64_json for d in result.data] == ["iVBORw0KGgo="] * 2
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/images/generations")
    assert (body["prompt"], body["n"], body["size"], body["vendor_seed"]) == ("a red cube", 2, "256x256", 9)


def test_images_edit(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    second = PNG + b"second"
    result = sdk(keyed).images.edit(
        model="test-model",
        image=[("a.png", PNG, "image/png"), ("b.png", second, "image/png")],
        mask=("m.png", PNG + b"mask", "image/png"),
        prompt="make it blue",
        n=2,
    )
    assert result.data is not None and len(result.data) == 2
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/images/edits")
    assert [image["content"] for image in body["image[]"]] == [PNG, second]
    assert body["mask"]["content"] == PNG + b"mask"
    assert (body["prompt"], body["n"]) == ("make it blue", "2")


def test_models_retrieve(keyed: RunningProxy, fake_upstream: FakeUpstream) -> None:
    model = sdk(keyed).models.retrieve("test-model")
    assert (model.id, model.object, model.owned_by) == ("test-model", "model", "lcm-proxy")
    with pytest.raises(openai.NotFoundError) as info:
        sdk(keyed).models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"
    assert info.value.body == {  # type: ignore[comparison-overlap]
        "message": "The model `no-such-model` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert fake_upstream.requests == []


def test_models_retrieve_a_name_served_by_a_wildcard(proxy_factory: Any, upstream_url: str) -> None:
    wildcard = {"model_name": "vendor/*", "litellm_params": {"model": "openai/*", "api_base": f"{upstream_url}/v1"}}
    proxy = proxy_factory(models=[wildcard])
    assert sdk(proxy).models.retrieve("vendor/some-model").id == "vendor/some-model"
    assert httpx.get(f"{proxy.url}/models/vendor/other", timeout=20).json()["id"] == "vendor/other"


# --- errors ------------------------------------------------------------------------------------------------

ROUTES = [
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/moderations"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/audio/translations"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/images/generations"),
    ("POST", "/v1/images/edits"),
    ("GET", "/v1/models/test-model"),
    ("POST", "/embeddings"),
]


@pytest.mark.parametrize("key", [None, "sk-wrong-key-9999"], ids=["missing", "wrong"])
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_key_is_required(
    module_keyed: AppProxy, fake_upstream: FakeUpstream, method: str, path: str, key: str | None
) -> None:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": "test-model", "input": "x", "prompt": "x", "voice": "alloy"}
    keyed = module_keyed  # refused: nothing is stored
    response = keyed.client.request(method, f"{keyed.url}{path}", json=body, headers=headers, timeout=20)
    assert response.status_code == 401, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["type"] == "authentication_error"
    assert fake_upstream.requests == []


@pytest.mark.parametrize(
    ("status", "message"), [(429, "Rate limit reached for requests"), (500, "The server had an error")]
)
def test_upstream_errors_on_embeddings_map_as_chat_does(
    proxy: RunningProxy, fake_upstream: FakeUpstream, status: int, message: str
) -> None:
    fake_upstream.enqueue(Reply(status=status, error_message=message, error_type="requests"))
    response = httpx.post(f"{proxy.base_url}/embeddings", json={"model": "test-model", "input": "x"}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"] and error["type"] == "requests"
    assert "x-should-retry" not in response.headers  # a 429 or a 500 may succeed when retried
    assert UPSTREAM_KEY not in response.text


NO_RETRY_CALLS = [
    ("/embeddings", {"model": "test-model", "input": "x"}),
    ("/moderations", {"model": "test-model", "input": "x"}),
    ("/images/generations", {"model": "test-model", "prompt": "a cat"}),
    ("/completions", {"model": "test-model", "prompt": "x"}),
]


@pytest.mark.parametrize(("path", "body"), NO_RETRY_CALLS, ids=[p for p, _ in NO_RETRY_CALLS])
def test_no_hidden_retries(proxy: RunningProxy, fake_upstream: FakeUpstream, path: str, body: dict[str, Any]) -> None:
    """LiteLLM's embedding call reads max_retries=0 as its default (2), and its moderation and image calls
    build OpenAI clients that retry twice whatever they are told: the proxy's own retry policy is the only
    one (``upstream_retries``, 0 here), so the upstream sees one attempt."""
    fake_upstream.enqueue(*[Reply(status=500, error_message="boom")] * 3)
    response = httpx.post(f"{proxy.base_url}{path}", json=body, timeout=30)
    assert response.status_code == 500, response.text
    assert len(fake_upstream.requests) == 1


def test_unreachable_upstream_is_a_502_naming_it(proxy: RunningProxy) -> None:
    response = httpx.post(f"{proxy.base_url}/completions", json={"model": "unreachable", "prompt": "x"}, timeout=30)
    assert response.status_code == 502
    assert response.json()["error"]["message"] == (
        "Could not connect to the upstream provider for model 'unreachable'."
    )


BAD_BODIES = [
    ("/embeddings", {"model": "test-model"}, "input", "Missing required parameter: 'input'."),
    ("/embeddings", {"model": "test-model", "input": 5}, "input", "got a number"),
    ("/embeddings", {"model": "test-model", "input": []}, "input", "got an empty array"),
    ("/embeddings", {"model": "test-model", "input": ["a", 1]}, "input", "got a mixed array"),
    ("/embeddings", {"input": "x"}, "model", "Missing required parameter: 'model'."),
    ("/embeddings", {"model": 7, "input": "x"}, "model", "expected a string, got a number"),
    ("/embeddings", {"model": "test-model", "input": "x", "stream": True}, "stream", "not supported"),
    ("/completions", {"model": "test-model", "prompt": {"text": "x"}}, "prompt", "got an object"),
    ("/completions", {"model": "test-model"}, "prompt", "Missing required parameter: 'prompt'."),
    ("/completions", {"model": "test-model", "prompt": "x", "stream": "yes"}, "stream", "expected a boolean"),
    (
        "/completions",
        {"model": "test-model", "prompt": "x", "stream": True, "stream_options": "usage"},
        "stream_options",
        "expected an object",
    ),
    ("/moderations", {"model": "test-model", "input": None}, "input", "Missing required parameter: 'input'."),
    ("/moderations", {"model": "test-model", "input": ["a", {"type": "text"}]}, "input", "mixed array"),
    ("/audio/speech", {"model": "test-model", "input": "hi"}, "voice", "Missing required parameter: 'voice'."),
    ("/audio/speech", {"model": "test-model", "input": 3, "voice": "alloy"}, "input", "expected a string"),
    ("/images/generations", {"model": "test-model", "prompt": ["a cat"]}, "prompt", "expected a string"),
    ("/embeddings", {"model": "test-model", "input": "x", "deep": [[[[[]]]]] * 1}, None, None),  # fine: shallow
]


@pytest.mark.parametrize(("path", "body", "param", "message"), BAD_BODIES)
def test_bad_bodies_are_400s_naming_the_param(
    module_app_proxy: AppProxy, fake_upstream: FakeUpstream, path: str, body: dict[str, Any], param: str, message: str
) -> None:
    proxy = module_app_proxy  # refused or relayed: nothing is stored
    response = proxy.client.post(f"{proxy.base_url}{path}", json=body, timeout=20)
    if param is None:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]
    assert error["type"] == "invalid_request_error"
    assert response.headers["x-should-retry"] == "false"
    assert fake_upstream.requests == []


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("content", "param", "message"),
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b"[1, 2]", None, "must be a JSON object, got an array"),
        (b"", None, "body is empty"),
        (json.dumps({"model": "test-model", "input": "x", "extra": nested(100)}).encode(), "extra", "levels deep"),
    ],
)
def test_unreadable_json_is_a_400(
    module_app_proxy: AppProxy, fake_upstream: FakeUpstream, content: bytes, param: str | None, message: str
) -> None:
    proxy = module_app_proxy  # refused or relayed: nothing is stored
    response = proxy.client.post(
        f"{proxy.base_url}/embeddings", content=content, headers={"content-type": "application/json"}, timeout=20
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and message in response.json()["error"]["message"]
    assert fake_upstream.requests == []


@pytest.mark.parametrize(
    ("path", "files", "data", "param", "message"),
    [
        ("/audio/transcriptions", None, {"model": "test-model"}, "file", "Missing required parameter: 'file'."),
        ("/audio/transcriptions", None, {"model": "test-model", "file": "clip.wav"}, "file", "got a text field"),
        ("/audio/transcriptions", {"file": ("a.wav", WAV)}, {}, "model", "Missing required parameter: 'model'."),
        (
            "/audio/transcriptions",
            {"file": ("a.wav", WAV), "other": ("b.wav", WAV)},
            {"model": "test-model"},
            None,
            "Too many files",
        ),
        ("/images/edits", None, {"model": "test-model", "prompt": "x"}, "image", "Missing required parameter"),
        ("/images/edits", {"image": ("a.png", PNG)}, {"model": "test-model"}, "prompt", "Missing required parameter"),
        (
            "/images/edits",
            {"image": ("a.png", PNG), "extra": ("b.png", PNG)},
            {"model": "test-model", "prompt": "x"},
            "extra",
            "takes no file",
        ),
        (
            "/images/edits",
            {"image": ("a.png", PNG), "n": ("b.png", PNG)},
            {"model": "test-model", "prompt": "x"},
            "n",
            "takes no file",
        ),
    ],
)
def test_bad_uploads_are_400s(
    module_app_proxy: AppProxy,
    fake_upstream: FakeUpstream,
    path: str,
    files: dict[str, Any] | None,
    data: dict[str, str],
    param: str | None,
    message: str,
) -> None:
    proxy = module_app_proxy  # refused or relayed: nothing is stored
    # httpx sends a form without files urlencoded: an unrelated empty file keeps it multipart.
    files = files or {"unused": ("unused.bin", b"")}
    response = proxy.client.post(f"{proxy.base_url}{path}", data=data, files=files, timeout=20)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error
    assert fake_upstream.requests == []


def test_an_upload_must_be_multipart(module_app_proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    proxy = module_app_proxy  # refused or relayed: nothing is stored
    body = {"model": "test-model", "file": "clip.wav"}
    response = proxy.client.post(f"{proxy.base_url}/audio/transcriptions", json=body, timeout=20)
    assert response.status_code == 400
    assert "multipart/form-data" in response.json()["error"]["message"]
    assert fake_upstream.requests == []


def _chunks(total: int) -> Iterator[bytes]:
    boundary = b"--edge\r\n"
    yield boundary + b'Content-Disposition: form-data; name="model"\r\n\r\ntest-model\r\n'
    yield boundary + b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    for _ in range(total // 1024):
        yield b"\x00" * 1024
    yield b"\r\n--edge--\r\n"


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_uploads_over_the_size_cap_are_413(app_factory: Any, fake_upstream: FakeUpstream, declared: bool) -> None:
    proxy = app_factory(max_body_bytes=4096)
    content = b"".join(_chunks(64 * 1024)) if declared else _chunks(64 * 1024)
    headers = {"content-type": "multipart/form-data; boundary=edge"}
    response = proxy.client.post(f"{proxy.base_url}/audio/transcriptions", content=content, headers=headers, timeout=20)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"
    assert fake_upstream.requests == []


@pytest.mark.parametrize("response_format", ["json", "text"])
def test_audio_translation(keyed: RunningProxy, fake_upstream: FakeUpstream, response_format: str) -> None:
    """LiteLLM has no translation call; the upstream makes it with the OpenAI SDK (same key, no retries)."""
    fake_upstream.enqueue(Reply(content="words in English"))
    result = sdk(keyed).audio.translations.create(
        model="test-model", file=("clip.wav", WAV, "audio/wav"), prompt="a talk", response_format=response_format,
        extra_body={"vendor_option": "7"},
    )  # fmt: skip
    assert (result if isinstance(result, str) else result.text).strip() == "words in English"
    body = assert_forwarded_with_upstream_key(fake_upstream, "/v1/audio/translations")
    assert body["file"] == {"filename": "clip.wav", "content_type": "audio/wav", "content": WAV}
    assert body["model"] == "fake-model" and body["prompt"] == "a talk" and body["vendor_option"] == "7"
    assert body["response_format"] == response_format


def test_audio_translation_makes_no_hidden_retries(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(*[Reply(status=500, error_message="boom")] * 3)
    with pytest.raises(openai.InternalServerError):
        sdk(proxy).audio.translations.create(model="test-model", file=("clip.wav", WAV, "audio/wav"))
    assert len(fake_upstream.requests) == 1


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/assistants"), ("GET", "/v1/files"), ("GET", "/nothing")])
def test_unknown_paths_are_openai_404s(module_app_proxy: AppProxy, method: str, path: str) -> None:
    proxy = module_app_proxy  # refused or relayed: nothing is stored
    response = proxy.client.request(method, f"{proxy.url}{path}", timeout=20)
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": f"Unknown path: {path}",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_url",
        }
    }


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/embeddings"), ("POST", "/v1/models/test-model")])
def test_wrong_method_is_an_openai_405(module_app_proxy: AppProxy, method: str, path: str) -> None:
    proxy = module_app_proxy  # refused or relayed: nothing is stored
    response = proxy.client.request(method, f"{proxy.url}{path}", timeout=20)
    assert response.status_code == 405
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"


def test_translation_to_a_provider_that_is_not_openai_compatible_is_a_501(
    proxy_factory: Any, fake_upstream: FakeUpstream
) -> None:
    """Only the OpenAI SDK makes this call, so a provider LiteLLM translates for cannot get it: a 501 that SDKs
    do not retry, before anything is sent."""
    claude = {"model_name": "claude", "litellm_params": {"model": "anthropic/claude-3-5-haiku", "api_key": "sk-ant-x"}}
    proxy = proxy_factory(models=[claude])
    with pytest.raises(openai.APIStatusError) as info:
        sdk(proxy).audio.translations.create(model="claude", file=("clip.wav", WAV, "audio/wav"))
    assert info.value.status_code == 501 and info.value.code == "unsupported_endpoint"
    assert info.value.response.headers["x-should-retry"] == "false"
    assert fake_upstream.requests == []
