"""The Messages door's fixtures: a fake Anthropic API served on loopback for the session (reset for each test),
and proxies whose models are served by it (``claude-sonnet-4-5``, native Messages) or by the session's fake
OpenAI-compatible upstream (``local-claude``, translated)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropic, claude_models
from tests.support.servers import serve_in_thread


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


@pytest.fixture
def claude_proxy(proxy_factory: Any, fake_anthropic_server: tuple[FakeAnthropic, str], upstream_url: str) -> Any:
    return proxy_factory(models=claude_models(fake_anthropic_server[1], upstream_url))
