"""The Messages door's fixtures: a fake Anthropic API served on loopback for the session (reset for each test),
and proxies whose models are served by it (``claude-sonnet-4-5``, native Messages) or by the session's fake
OpenAI-compatible upstream (``local-claude``, translated)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.servers import serve_in_thread

ANTHROPIC_KEY = "sk-ant-upstream-secret-42"


@pytest.fixture(scope="session")
def fake_anthropic_server() -> Iterator[tuple[FakeAnthropic, str]]:
    fake = FakeAnthropic()
    with serve_in_thread(fake.app) as url:
        yield fake, url


@pytest.fixture
def fake_anthropic(fake_anthropic_server: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    fake = fake_anthropic_server[0]
    fake.reset()
    fake.window = None
    return fake


def claude_models(anthropic_url: str, upstream_url: str, window: int = 200_000) -> list[dict[str, Any]]:
    return [
        {
            "model_name": "claude-sonnet-4-5",
            "litellm_params": {
                "model": "anthropic/claude-sonnet-4-5",
                "api_base": anthropic_url,
                "api_key": ANTHROPIC_KEY,
            },
            "model_info": {"max_input_tokens": window, "supports_function_calling": True},
        },
        {
            "model_name": "local-claude",
            "litellm_params": {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": "sk-local"},
            "model_info": {"max_input_tokens": window, "supports_function_calling": True},
        },
    ]


@pytest.fixture
def claude_proxy(proxy_factory: Any, fake_anthropic_server: tuple[FakeAnthropic, str], upstream_url: str) -> Any:
    return proxy_factory(models=claude_models(fake_anthropic_server[1], upstream_url))
