"""The Responses door's fixtures: proxies whose model ``local-gpt`` is served by the session's fake
OpenAI-compatible upstream (translated to Chat Completions) and ``gpt-native`` by the fake Responses API
(``tests.support.fake_responses``, native)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fake_responses import FakeResponses, responses_models
from tests.support.servers import serve_in_thread


@pytest.fixture(scope="session")
def fake_responses_server() -> Iterator[tuple[FakeResponses, str]]:
    fake = FakeResponses()
    with serve_in_thread(fake.app) as url:
        yield fake, url


@pytest.fixture
def fake_responses(fake_responses_server: tuple[FakeResponses, str]) -> FakeResponses:
    fake = fake_responses_server[0]
    fake.reset()
    return fake


@pytest.fixture
def responses_proxy(proxy_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str) -> Any:
    return proxy_factory(models=responses_models(fake_responses_server[1], upstream_url))
