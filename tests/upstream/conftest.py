"""Fixtures of the upstream tests: both chat paths (direct and LiteLLM), deployment B's fake upstream (A is the
session's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.upstream import direct
from tests.support.fakes import FakeUpstream, session_fake
from tests.support.servers import serve_in_thread


@pytest.fixture(scope="module")
def second_server() -> Iterator[tuple[FakeUpstream, str]]:
    """Deployment B's server (A is the session's fake upstream); reset before every test like that one."""
    fake = FakeUpstream()
    with serve_in_thread(fake.app) as url, session_fake(fake):
        yield fake, url


@pytest.fixture
def second(second_server: tuple[FakeUpstream, str]) -> FakeUpstream:
    return second_server[0]


@pytest.fixture
def second_url(second_server: tuple[FakeUpstream, str]) -> str:
    return second_server[1]


@pytest.fixture(autouse=True, params=["direct", "litellm"])
def chat_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every upstream test runs twice: chat calls to OpenAI-compatible deployments sent directly
    (``proxy.upstream.direct``), then through ``litellm.acompletion``."""
    monkeypatch.setattr(direct, "ENABLED", request.param == "direct")
    return str(request.param)
