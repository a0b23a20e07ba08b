"""The proxy under test, two ways: served by a real uvicorn on 127.0.0.1 (``RunningProxy``, for what needs a
socket: streaming relays, disconnects, kills, /healthz while busy, real clients), or in this process
(``AppProxy``: the app behind a Starlette ``TestClient``, its lifespan run), for what a socket proves nothing
more about (validation, the admin API, config-driven answers). Both are built from ``make_config``'s config,
whose first model is the session's fake upstream."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.config.loading import parse_config
from proxy.config.settings import ProxyConfig
from proxy.store.location import Location
from tests.support.servers import serve_in_thread

with warnings.catch_warnings():  # its note that it prefers httpx2: httpx is the client the proxy and the SDK use
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
# The in-process proxy's address: a loopback Host, which ``proxy.wire.guard`` serves as it does a real one's.
IN_PROCESS_URL = "http://127.0.0.1:4000"


def make_config(
    upstream_url: str,
    data_dir: Path,
    lcm: dict[str, Any] | None = None,
    models: list[Any] | None = None,
    **general: Any,
) -> ProxyConfig:
    raw: dict[str, Any] = {
        "model_list": [
            {
                "model_name": "test-model",
                "litellm_params": {
                    "model": "openai/fake-model",
                    "api_base": f"{upstream_url}/v1",
                    "api_key": UPSTREAM_KEY,
                },
                "model_info": {"max_input_tokens": 100000, "supports_function_calling": True},
            },
            {
                "model_name": "unreachable",
                "litellm_params": {
                    "model": "openai/x",
                    "api_base": "http://127.0.0.1:9/v1",
                    "api_key": UPSTREAM_KEY,
                },
            },
        ],
        "general_settings": {"data_dir": str(data_dir), "request_timeout": 5, **general},
        "lcm_settings": lcm or {},
    }
    raw["model_list"] += models or []
    return parse_config(raw)


@dataclass
class RunningProxy:
    url: str
    config: ProxyConfig
    app: Any

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@dataclass
class AppProxy:
    """The app in this process. ``client`` is an ``httpx.Client`` (the openai SDK takes it as ``http_client``);
    it answers absolute URLs under ``url`` as a served proxy would."""

    client: TestClient
    config: ProxyConfig
    app: Any
    url: str = IN_PROCESS_URL

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def wait_idle(self) -> None:
        """Wait for the engine's background work: the reads of standing instructions after each response
        (``proxy.engine.standing.reader``) and the compactions."""
        self.client.portal.call(self.app.state.lcm.engine.wait_idle)


@contextlib.contextmanager
def in_process(config: ProxyConfig) -> Iterator[AppProxy]:
    """``create_app(config)`` with its lifespan run for the block. A handler's exception becomes the 500 a
    served proxy would answer, not an exception in the test."""
    app = create_app(config)
    with TestClient(app, base_url=IN_PROCESS_URL, raise_server_exceptions=False) as client:
        yield AppProxy(client=client, config=config, app=app)


def with_database(general: dict[str, Any], where: Location | None) -> dict[str, Any]:
    """``general`` with ``where``'s PostgreSQL database, when it names one (proxies given the same one share
    it, as replicas do)."""
    if where is not None and where.database_url is not None:
        return {"database_url": where.database_url, **general}
    return general


def assert_doctor_passes(locations: list[Location]) -> None:
    """Every database a test creates must pass doctor."""
    for location in dict.fromkeys(locations):
        if location.exists():
            problems = asyncio.run(run_doctor(location))
            assert problems == [], f"doctor found problems in {location.describe()}: {problems}"


@contextlib.contextmanager
def served(config: ProxyConfig) -> Iterator[RunningProxy]:
    app = create_app(config)
    with serve_in_thread(app) as url:
        yield RunningProxy(url=url, config=config, app=app)
