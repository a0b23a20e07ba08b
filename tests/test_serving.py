"""What only a serving process does at startup: warm LiteLLM up without reaching anything, then freeze the
startup heap so full garbage collections stop walking LiteLLM's ~370,000 long-lived objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from proxy.app import create_app
from tests.conftest import make_config
from tests.fakes import FakeUpstream


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield None
    gc.unfreeze()  # the rest of the suite keeps collecting normally


def test_serving_app_freezes_its_startup_heap_after_a_silent_warm_up(
    fake_upstream: FakeUpstream, upstream_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], unfrozen: None
) -> None:
    gc.unfreeze()
    config = make_config(upstream_url, tmp_path / "data", None, None)
    with TestClient(create_app(config, serving=True)) as client:
        frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())
        assert frozen > 0 and frozen > tracked  # the startup heap is out of the collector's sight
        assert fake_upstream.requests == []  # the warm-up reached no upstream
        response = client.post(
            "/v1/chat/completions", json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 200, response.text
    assert len(fake_upstream.requests) == 1
    printed = capfd.readouterr()
    assert "warm-up" not in printed.out + printed.err and "Traceback" not in printed.out + printed.err


def test_apps_built_for_tests_do_not_freeze(upstream_url: str, tmp_path: Path) -> None:
    gc.unfreeze()
    with TestClient(create_app(make_config(upstream_url, tmp_path / "data", None, None))) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() == 0
