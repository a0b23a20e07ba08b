"""Credentials and secrets: what a client's error, a log line, a summary or a summarizer prompt may show.

1. The upstream error boundary masks every credential the call could carry (its api_key, the deployment's
   other credential values and ``extra_headers``, the keys LiteLLM reads from the environment), partial
   echoes of them, and anything shaped like a key; in the client's error, in mid-stream error events, and in
   the log line.
2. The secret rule set (exploration summaries, summarizer input) covers the common formats, from a
   maintained scanner's patterns plus our own, and stays linear on hostile input.
3. At ``log_level: debug`` a served proxy logs ids and sizes, never conversation content.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.redaction import redact_secrets
from proxy.upstream.client import load_litellm, translate_exception
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, AppProxy

REPO = Path(__file__).resolve().parent.parent

# A credential with no well-known shape: only knowing the deployment's values can mask it.
HEADER_SECRET = "hdr-Zq7Lp2Vx9Kd4Wm8Rt3Yb"
# The same for a key the proxy's environment holds (LiteLLM reads e.g. ANTHROPIC_API_KEY from there).
ENV_NAME = "LCMTEST_PROVIDER_API_KEY"
ENV_KEY = "envkey-Jx82Qa17Lm40Pz"


def _header_model(upstream_url: str) -> dict[str, Any]:
    return {
        "model_name": "header-model",
        "litellm_params": {
            "model": "openai/fake-model",
            "api_base": f"{upstream_url}/v1",
            "api_key": UPSTREAM_KEY,
            "extra_headers": {"X-Upstream-Token": HEADER_SECRET},
        },
    }


def _chat(proxy: AppProxy, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with proxy.client.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        response.read()
        return response


def _sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


# --- 1. the upstream error boundary ------------------------------------------------------------------------


def test_extra_headers_credential_never_reaches_the_client_or_the_log(
    app_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider that echoes a credential sent in ``extra_headers``: in a plain error, a streamed request's
    error, and an error event inside a 200 stream, the client and the INFO log see it masked."""
    caplog.set_level(logging.INFO)
    proxy = app_factory(models=[_header_model(upstream_url)])
    echo = f"Unknown tenant credential {HEADER_SECRET} for this organisation"
    fake_upstream.enqueue(Reply(status=401, error_message=echo))
    plain = _chat(proxy, "header-model")
    assert fake_upstream.last.headers["x-upstream-token"] == HEADER_SECRET  # the credential is in use
    fake_upstream.enqueue(Reply(status=401, error_message=echo))
    streamed = _chat(proxy, "header-model", stream=True)
    first = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}]}  # fmt: skip
    event = {"error": {"message": echo, "type": "invalid_request_error"}}
    fake_upstream.enqueue(Reply(raw_body=_sse(first, event)))
    mid_stream = _chat(proxy, "header-model", stream=True)

    assert plain.status_code == 401 and streamed.status_code == 401 and mid_stream.status_code == 200
    for response in (plain, streamed, mid_stream):
        assert HEADER_SECRET not in response.text
        assert "Unknown tenant credential [redacted] for this organisation" in response.text, response.text
    assert "upstream error 401" in caplog.text
    assert HEADER_SECRET not in caplog.text


def test_partial_echo_of_the_key_is_masked(
    app_proxy: AppProxy, fake_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenAI shows a rejected key as its first and last characters; others cut it short. Neither part
    reaches the client or the log."""
    caplog.set_level(logging.INFO)
    masked = f"{UPSTREAM_KEY[:8]}**********{UPSTREAM_KEY[-4:]}"
    fake_upstream.enqueue(Reply(status=401, error_message=f"Incorrect API key provided: {masked}."))
    first = _chat(app_proxy, "test-model")
    fake_upstream.enqueue(Reply(status=401, error_message=f"bad key {UPSTREAM_KEY[:-5]}, try again"))
    second = _chat(app_proxy, "test-model")
    assert first.status_code == second.status_code == 401
    assert UPSTREAM_KEY[:8] not in first.text and "Incorrect API key provided:" in first.text
    assert UPSTREAM_KEY[:-5] not in second.text and "try again" in second.text
    for fragment in (UPSTREAM_KEY[:8], UPSTREAM_KEY[:-5]):
        assert fragment not in caplog.text


def test_partial_echo_of_an_unshaped_credential_is_masked() -> None:
    """Partial echoes are found by the known values, not by a key's shape; words are left alone."""
    from proxy.upstream.client import redact_upstream_message

    secret = "Zq7Lp2Vx9Kd4Wm8Rt3Yb"
    shown = redact_upstream_message(f"credential {secret[:8]}******{secret[-3:]} rejected", [secret])
    assert secret[:8] not in shown and shown.startswith("credential [redacted]") and shown.endswith(" rejected")
    # Lowercase words that happen to be inside a credential are ordinary text, not an echo.
    readable = "stream-upstream-secret-991"
    assert redact_upstream_message("stream_options: not supported upstream", [readable]) == (
        "stream_options: not supported upstream"
    )


@pytest.fixture
def environment_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from proxy.redaction import environment_credentials

    monkeypatch.setenv(ENV_NAME, ENV_KEY)
    environment_credentials.cache_clear()  # read once per process; this test changes the environment
    yield ENV_KEY
    monkeypatch.undo()
    environment_credentials.cache_clear()


def test_environment_keys_are_masked(environment_key: str) -> None:
    """A deployment without api_key uses a key LiteLLM reads from the environment: echoed whole or in part,
    it is masked though the call never named it."""
    from proxy.redaction import environment_credentials
    from proxy.upstream.client import redact_upstream_message

    assert environment_key in environment_credentials()
    assert redact_upstream_message(f"invalid x-api-key: {environment_key}") == "invalid x-api-key: [redacted]"
    partial = redact_upstream_message(f"key {environment_key[:12]}... is not valid")
    assert environment_key[:12] not in partial and partial.endswith("... is not valid")


def test_translate_exception_masks_environment_keys(environment_key: str) -> None:
    """Through the boundary's own entry point, with LiteLLM's real exception class."""
    litellm = load_litellm()
    exc = litellm.AuthenticationError(
        message=f"AnthropicException - invalid x-api-key {environment_key}", llm_provider="anthropic", model="m"
    )
    error = translate_exception(exc)
    assert error.status == 401
    assert environment_key not in error.message and "invalid x-api-key [redacted]" in error.message


def test_key_shapes_are_masked_in_upstream_errors(app_proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    """A key the proxy never knew (another tenant's, a provider's example) is masked by its shape."""
    foreign = "sk-proj-" + "Ab3" * 16
    fake_upstream.enqueue(Reply(status=400, error_message=f"Organization key {foreign} is not allowed here"))
    response = _chat(app_proxy, "test-model")
    assert response.status_code == 400 and foreign not in response.text
    assert "is not allowed here" in response.text


def test_every_field_of_an_upstream_error_is_redacted() -> None:
    """A provider may echo a credential in ``code`` or ``param`` as well as in the message."""

    class ProviderError(Exception):
        status_code = 400

    exc = ProviderError("rejected")
    exc.body = {  # type: ignore[attr-defined]
        "error": {
            "message": "rejected",
            "type": f"bad {UPSTREAM_KEY}",
            "code": UPSTREAM_KEY,
            "param": f"key={UPSTREAM_KEY}",
        }
    }
    error = translate_exception(exc, credentials=[UPSTREAM_KEY])
    assert UPSTREAM_KEY not in json.dumps(error.to_json())
    assert (error.status, error.message) == (400, "rejected")


# --- 2. the secret rule set --------------------------------------------------------------------------------

STRIPE_LONG = "sk_live_" + "51H8abcDEFghiJKLmnoPQRstu" * 4  # current keys are far longer than 24 characters
FORMATS = {
    "google api key": ("AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "AIzaSy"),
    "stripe secret key": (STRIPE_LONG, "H8abc"),
    "stripe restricted key": ("rk_live_" + "4eC39HqLyjWDarjtT1zdp7dc" * 2, "rk_live_4eC"),
    "npm token": ("npm_" + "a1B2c3D4e5F6g7H8i9J0" * 2 + "kLmN", "npm_a1B2"),
    "gitlab personal access token": ("glpat-" + "xY7_zA9-bC3dE5fG1hJ2", "glpat-xY7"),
    "hugging face token": ("hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh", "hf_AbCd"),
    "sendgrid key": ("SG." + "a" * 5 + "B" * 17 + "." + "c1D2e3" * 7 + "f", "SG.aaaaa"),
    # Formats the old hand list lacked either, from detect-secrets' plugins.
    "twilio key": ("SK" + "0123456789abcdef" * 2, "SK0123"),
    "slack webhook": ("https://hooks.slack.com/services/T0123ABCD/B0123ABCD/XyZ0123456789abcdefABCD", "XyZ0123"),
    "telegram bot token": ("123456789:AAH" + "x" * 32, "AAHxxx"),
    # Formats issue 22 found passing through (neither detect-secrets nor the old list had them).
    "digitalocean token": ("dop_v1_" + "3f9a0c7e1b2d4f6a" * 4, "3f9a0c7e"),
    "digitalocean oauth token": ("doo_v1_" + "b2d4f6a83f9a0c7e" * 4, "b2d4f6a8"),
    "databricks token": ("dapi" + "0a1b2c3d4e5f6a7b" * 2, "0a1b2c3d"),
    "databricks token with suffix": ("dapi" + "0a1b2c3d4e5f6a7b" * 2 + "-2", "0a1b2c3d"),
    "mailgun key": ("key-" + "5e6f7a8b9c0d1e2f" * 2, "5e6f7a8b"),
    "square access token": ("sq0atp-" + "Xk3_9Lm-2Qw8Zr7Tp4Vb1N", "Xk3_9Lm"),
    "square oauth secret": ("sq0csp-" + "Hq2-Wm8_Zr7Tp4Vb1NXk3L9dF0gJ6sA5cE2yU8iO1pK", "Hq2-Wm8"),
    "shopify access token": ("shpat_" + "a1b2c3d4e5f60718" * 2, "a1b2c3d4"),
    "shopify shared secret": ("shpss_" + "0718a1b2c3d4e5f6" * 2, "0718a1b2"),
    "shopify custom app token": ("shpca_" + "c3d4e5f60718a1b2" * 2, "c3d4e5f6"),
    "shopify private app token": ("shppa_" + "e5f60718a1b2c3d4" * 2, "e5f60718"),
}


@pytest.mark.parametrize("name", FORMATS)
def test_common_secret_formats_are_redacted(name: str) -> None:
    secret, fragment = FORMATS[name]
    shown = redact_secrets(f"config: use {secret} here\n")
    assert fragment not in shown and secret not in shown, shown
    assert shown == "config: use [REDACTED] here\n"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("the password is hunter2", "the password is [REDACTED]"),
        ("My password is hunter2.", "My password is [REDACTED]."),
        ("my password: Tr0ub4dor&3", "my password: [REDACTED]"),
        ("the API key was abc123xyz, keep it safe", "the API key was [REDACTED], keep it safe"),
        ("our access token is now 'tok 77 secret'", "our access token is now '[REDACTED]'"),
        # Ordinary sentences about secrets keep their words.
        ("the token is invalid", "the token is invalid"),
        ("your password is too short", "your password is too short"),
        ("Incorrect API key provided", "Incorrect API key provided"),
        ("max_tokens is 4096", "max_tokens is 4096"),
    ],
)
def test_secrets_in_prose_are_redacted(raw: str, expected: str) -> None:
    assert redact_secrets(raw) == expected


def test_redaction_keeps_key_names_hosts_and_schemes() -> None:
    text = f"STRIPE_KEY={STRIPE_LONG} db=postgres://app:pw123@db.internal:5432/x"
    assert redact_secrets(text) == "STRIPE_KEY=[REDACTED] db=postgres://[REDACTED]@db.internal:5432/x"


def test_rule_set_is_loaded_on_first_use_only() -> None:
    """detect-secrets (~0.1 s to import) loads when a text is first redacted, not when the proxy starts."""
    code = (
        "import sys, proxy.app, proxy.cli.main, proxy.engine.explore, proxy.engine.render, proxy.upstream.client\n"
        "assert 'detect_secrets' not in sys.modules\n"
        "from proxy.engine.explore import redact_secrets\n"
        "assert redact_secrets('npm_' + 'a' * 36) == '[REDACTED]'\n"
        "assert 'detect_secrets' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


MB = 1 << 20
# Inputs that make a backtracking pattern scan to the end of the text from each of many starting points: a
# quadratic rule needs minutes on each of these (the old JWT rule: ~200 s on "eyJ-" repeated), a linear one
# well under a second. No clock is read: a regression shows as a test suite that does not finish.
HOSTILE = {
    "base64": lambda: __import__("base64").b64encode(os.urandom(3 * MB // 4)).decode(),
    "jwt prefix with dashes": lambda: "eyJ-" * (MB // 4),
    "jwt segments": lambda: "eyJaaaaaaaa." * (MB // 12),
    "openai prefix": lambda: "sk-" * (MB // 3),
    "stripe prefix": lambda: "sk_live_" * (MB // 8),
    "google prefix": lambda: "AIza-" * (MB // 5),
    "npm prefix": lambda: "npm_" * (MB // 4),
    "hugging face prefix": lambda: "hf_" * (MB // 3),
    "gitlab prefix": lambda: "glpat-" * (MB // 6),
    "sendgrid prefix": lambda: "SG." * (MB // 3),
    "slack digits": lambda: "xoxb-1-" * (MB // 7),
    "artifactory run": lambda: " AKC" + "a" * MB,
    "lowercase hex": lambda: "0123456789abcdef" * (MB // 16),
    "digits and colons": lambda: "1234567890:" * (MB // 11),
    "npmrc slashes": lambda: "//" * (MB // 2),
    "url credentials": lambda: "a://b:" * (MB // 6),
    "bearer": lambda: "Bearer " * (MB // 7),
    "key block openings": lambda: "-----BEGIN PRIVATE KEY-----" * (MB // 27),
    "key block tail": lambda: "A " * (MB // 2),
    "prose": lambda: "the password is " * (MB // 16),
    "assignment spaces": lambda: "password" + " " * MB + "x",
    "assignment names": lambda: "api_key-" * (MB // 8),
    "digitalocean prefix": lambda: "dop_v1_" * (MB // 7),
    "databricks prefix": lambda: "dapi" * (MB // 4),
    "databricks hex": lambda: "dapi" + "0a1b2c3d" * (MB // 8),
    "mailgun prefix": lambda: "key-" * (MB // 4),
    "square prefix": lambda: "sq0atp-" * (MB // 7),
    "square secret prefix": lambda: "sq0csp-" * (MB // 7),
    "shopify prefix": lambda: "shpat_" * (MB // 6),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_redaction_is_linear_on_hostile_input(name: str) -> None:
    text = HOSTILE[name]()
    assert isinstance(redact_secrets(text), str)


# --- 2b. nothing the proxy sends to its summary model carries a secret -----------------------------------

LEAKED = {
    name: FORMATS[name][0] for name in ("digitalocean token", "databricks token", "mailgun key", "stripe secret key")
}


def _memo_with_secrets() -> str:
    """Free text (so it goes to the summary model, not a deterministic explorer) with secrets spread over it:
    one in the head, one in the middle that clipping drops, one in the tail, one in prose."""
    lines = [
        f"Meeting note {i}: the pumps of hall {i % 7} were serviced and logged by the night shift." for i in range(4000)
    ]
    secrets = list(LEAKED.values())
    lines[3] = f"Deploy with {secrets[0]} on the droplet."
    lines[2000] = f"Databricks: {secrets[1]} (rotate monthly)."
    lines[3990] = f"Mail relay key {secrets[2]} lives in vault."
    lines[3995] = f"The stripe key is {secrets[3]}."
    return "\n".join(lines)


def test_the_exploration_summary_model_never_receives_a_files_secrets(
    app_proxy: AppProxy, fake_upstream: FakeUpstream
) -> None:
    """Compaction's input was redacted, the exploration summariser's was not: it received the raw file. Every
    call the proxy makes to its summary model now goes through one redaction (``UpstreamSummarizer``)."""
    document = _memo_with_secrets()
    message = {"role": "user", "content": f'Read <file name="memo.txt" mime="text/plain">{document}</file> please'}
    body = {"model": "test-model", "messages": [message]}
    response = app_proxy.client.post(f"{app_proxy.base_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    explorations = [
        r.body
        for r in fake_upstream.requests
        if str(r.body["messages"][0]["content"]).startswith("You describe documents")
    ]
    assert len(explorations) == 1  # the file went to the summary model
    sent = json.dumps(explorations[0])
    assert "Meeting note 3999" in sent  # its text did, head and tail
    for name, secret in LEAKED.items():
        assert secret not in sent, name
        assert secret[-12:] not in sent, name  # nor a tail a clip left behind
    assert "[REDACTED]" in sent


class _Capture:
    """An upstream that records the bodies the summarizer sends."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def complete(self, target: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return {"choices": [{"message": {"content": "noted"}}]}


def test_every_summarizer_call_is_redacted_at_one_place() -> None:
    """``complete`` (leaf and condensed summaries, lcm_expand_query answers) and ``summarize_text``
    (exploration) both redact what they send, whatever their caller did."""
    import asyncio

    from proxy.relay.summarizer import UpstreamSummarizer
    from proxy.upstream.routing import ResolvedModel

    upstream = _Capture()
    target = ResolvedModel("summary-model", {"model": "openai/summary-model"}, None, None)
    summarizer = UpstreamSummarizer(upstream, target, timeout=5)  # type: ignore[arg-type]
    secret = LEAKED["mailgun key"]

    async def calls() -> None:
        await summarizer.complete(
            system="Answer.", user=f"<material>use {secret}</material>", max_tokens=9, temperature=0
        )
        await summarizer.summarize_text(f"a memo with {secret} inside", name="memo.txt", max_tokens=9)
        await summarizer.summarize_text(("word " * 40_000) + secret, name="big.txt", max_tokens=9)

    asyncio.run(calls())
    assert len(upstream.bodies) == 3
    for body in upstream.bodies:
        assert secret not in json.dumps(body) and secret[-10:] not in json.dumps(body)
        assert "[REDACTED]" in json.dumps(body)
    assert upstream.bodies[0]["messages"][0]["content"] == "Answer."  # the proxy's own prompt is unchanged


# --- 3. logging ----------------------------------------------------------------------------------------------


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Undo ``configure_logging``: pytest's own handlers and levels are restored after the test."""
    from proxy.logs import CONTENT_FREE_LEVELS

    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in CONTENT_FREE_LEVELS})
    try:
        yield
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


def test_library_loggers_never_log_content_at_debug(root_logging: None) -> None:
    """At ``debug`` the proxy's own loggers are verbose; aiosqlite (SQL parameters), the OpenAI SDK (request
    bodies) and httpx (URLs) are not, even when something re-levels them afterwards (``OPENAI_LOG=debug``)."""
    from proxy.logs import configure_logging

    configure_logging("debug")
    assert logging.getLogger("lcm_proxy.engine").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("aiosqlite").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("openai._base_client").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "lcm_proxy", False)]
    assert len(ours) == 1
    logging.getLogger("openai").setLevel(logging.DEBUG)  # what the SDK does at import with OPENAI_LOG=debug
    record = logging.LogRecord("openai._base_client", logging.DEBUG, __file__, 1, "Request options: %s", (), None)
    assert not ours[0].filter(record)
    record = logging.LogRecord("lcm_proxy.engine", logging.DEBUG, __file__, 1, "compaction of %s", ("c1",), None)
    assert ours[0].filter(record)


def test_log_lines_mask_configured_credentials_even_in_tracebacks(root_logging: None) -> None:
    """A traceback of an upstream failure carries the provider's raw text in its exception chain."""
    from proxy.logs import RedactingFormatter

    formatter = RedactingFormatter(credentials=[HEADER_SECRET])
    try:
        try:
            raise RuntimeError(f"litellm.AuthenticationError: rejected {HEADER_SECRET[:12]}*** and {HEADER_SECRET}")
        except RuntimeError as inner:
            raise ValueError("summarizer failed") from inner
    except ValueError:
        record = logging.LogRecord("lcm_proxy", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = formatter.format(record)
    assert "summarizer failed" in line and "rejected [redacted]***" in line
    assert HEADER_SECRET[:12] not in line


CONTENT = "content-marker-7Qf2 the vault combination is 31-41-59"
PASTED = "pasted-secret-P9x4Lm2Kq8"


def test_served_proxy_at_debug_logs_no_content(fake_upstream: FakeUpstream, upstream_url: str, tmp_path: Path) -> None:
    """``lcm-proxy serve`` at ``log_level: debug``: requests are logged, their content is not, nor the
    upstream key (sent in a header the SDK would log)."""
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: test-model\n"
        f"    litellm_params: {{model: openai/fake-model, api_base: '{upstream_url}/v1', api_key: os.environ/UP_KEY,"
        f" extra_headers: {{X-Upstream-Token: {HEADER_SECRET}}}}}\n"
        "general_settings:\n"
        f"  host: 127.0.0.1\n  port: 0\n  data_dir: '{tmp_path / 'data'}'\n"
        "  log_level: debug\n  access_log: true\n  request_timeout: 10\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "LCM_"))}
    env.update(UP_KEY=UPSTREAM_KEY, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    started = threading.Event()
    port: list[int] = []

    def drain() -> None:  # read everything the server prints; note when it listens, and on which port
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port.append(int(found.group(1)))
                started.set()
        started.set()  # the process ended (or failed to start)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert started.wait(120) and port, "".join(lines)
        url = f"http://127.0.0.1:{port[0]}/v1/chat/completions"
        messages = [{"role": "user", "content": f"{CONTENT}; my token: {PASTED}"}]
        for stream in (False, True):
            body = {"model": "test-model", "messages": messages, "stream": stream}
            response = httpx.post(url, json=body, timeout=30)
            assert response.status_code == 200, response.text
            assert "content-marker-7Qf2" in response.text  # the fake upstream echoes it: the content went through
        conversation = response.headers["x-lcm-conversation-id"]
        grep = f"http://127.0.0.1:{port[0]}/lcm/conversations/{conversation}/grep"
        assert httpx.get(grep, params={"pattern": "vault combination"}, timeout=30).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
        reader.join(timeout=30)
    printed = "".join(lines)
    for content in ("content-marker-7Qf2", "vault combination", PASTED, UPSTREAM_KEY, HEADER_SECRET):
        assert content not in printed, (content, printed[-3000:])
    assert "POST /v1/chat/completions" in printed, printed  # the requests were logged,
    assert f"GET /lcm/conversations/{conversation}/grep?…" in printed  # the grep too, without its pattern
    assert "DEBUG lcm_proxy.upstream: upstream call: model openai/fake-model, 1 messages" in printed  # at debug


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBFzq8Ab3xQ7vPGPSECRET\n-----END PGP PRIVATE KEY BLOCK-----",
            "PGPSECRET",
        ),
        ("PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nPrivate-Lines: 1\nAAAAPUTTYSECRET", "PUTTYSECRET"),
        ("cache at redis://:hunter2pw@cache.local:6379/0", "hunter2pw"),
        ("The password for the prod database is Tr0ub4dor&3.", "Tr0ub4dor&3"),
        ("the password's Tr0ub4dor3", "Tr0ub4dor3"),
    ],
    ids=["pgp-block", "putty", "url-empty-user", "prose-for", "prose-apostrophe"],
)
def test_formats_a_review_found_are_redacted(text: str, secret: str) -> None:
    assert secret not in redact_secrets(text)


def test_a_hash_after_a_key_prefix_is_kept() -> None:
    """Mailgun's "key-" and 32 hex is a key; a SHA-256 named "cache-key-…" is an id summaries need."""
    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    assert redact_secrets(f"cache-key-{digest}") == f"cache-key-{digest}"


def test_prose_about_passwords_without_a_value_is_kept() -> None:
    for text in ("the password for it is invalid", "Our password policy for users is strict."):
        assert redact_secrets(text) == text
