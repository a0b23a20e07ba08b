from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.config.loading import parse_config
from proxy.config.settings import ProxyConfig
from tests.support.fakes import FakeUpstream
from tests.support.servers import serve_in_thread

# Tests never reach the internet: LiteLLM must not fetch its price list or tokenizers.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.pop("OPENAI_API_KEY", None)

UPSTREAM_KEY = "sk-upstream-secret-0123456789"


# Tests marked ``slow`` (``pytest -m "not slow"`` is the quick loop; the README's command and CI run them all):
# server processes SIGKILLed or run with several workers, the load run, benchmark smoke runs, fuzzing, and
# tests that wait out real timeouts. A file name marks every test in it; ``file::test`` (a prefix of the test's
# name, parameters included) marks those tests only.
SLOW = (
    "test_crash.py",
    "test_load.py::test_load_run_loses_nothing_and_duplicates_nothing",
    "test_multiprocess.py",
    "test_bench_smoke.py",
    "test_fidelity.py::test_the_command_prints_its_table",
    "test_fidelity.py::test_a_real_model_answers_through_lcm_proxy",
    "test_fuzz.py",
    "test_faults.py",
    "test_bounded_work.py::test_healthz_answers_within_100ms_while_a_20000_part_request_is_handled",
    "test_upstream_bounds.py::test_a_6_million_input_embeddings_request_is_refused",
    "test_upstream_bounds.py::test_healthz_answers_within_100ms_while_a_2048_input_embeddings_answer_is_relayed[3072",
    "test_upstream_errors.py::test_upstream_error_table[read_timeout",
    "test_replicas.py::test_identical_first_requests_on_three_replicas_create_one_conversation",
    "test_replicas.py::test_replicas_load_run_with_one_killed_loses_nothing",
    "test_deployments.py::test_litellms_documented_config_",
    "test_deletion.py::test_delete_and_purge_on_the_command_line",
    "test_end_users.py::test_the_cli_names_an_end_user_and_deletes_everything_of_theirs",
    "test_serving.py::test_a_dead_worker_is_replaced_and_said_at_warning",
    "test_long_history.py",
    "test_server_window.py::test_a_real_llama_cpp_",
)
TESTS = Path(__file__).parent


def _check_slow_entries() -> None:
    """A renamed file or test must not drop out of the list silently (and into the quick loop)."""
    for entry in SLOW:
        file, _, test = entry.partition("::")
        found = list(TESTS.rglob(file))
        path = found[0] if len(found) == 1 else TESTS / file
        if not path.is_file():
            raise pytest.UsageError(f"tests/conftest.py SLOW names {file}, which does not exist")
        name = test.split("[")[0]
        if name and f"def {name}" not in path.read_text(encoding="utf-8"):
            raise pytest.UsageError(f"tests/conftest.py SLOW names {entry}, which {file} does not define")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_slow_entries()
    for item in items:
        if f"{item.path.name}::{item.name}".startswith(SLOW):
            item.add_marker(pytest.mark.slow)


# The fake upstream is one server for the whole session (starting one per test would cost more than most
# tests). Every test starts with it as new, however the test reaches it (``fake_upstream``, ``upstream_url``
# or a module fixture): nothing a test scripted or recorded is seen by the next.
_SESSION_FAKES: list[FakeUpstream] = []


def reset_fake(fake: FakeUpstream) -> FakeUpstream:
    fake.requests.clear()
    fake.script.clear()
    fake.stream_finished.clear()
    fake.stream_cancelled.clear()
    fake.chunks_sent = 0
    fake.responder = None
    return fake


@pytest.fixture(autouse=True)
def _fresh_fake_upstream() -> None:
    """Autouse fixtures run before the others of their scope, so a function fixture that sets the fake up
    (a responder, a script) still sees its own set-up."""
    for fake in _SESSION_FAKES:
        reset_fake(fake)


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serve_in_thread(fake.app) as url:
        _SESSION_FAKES.append(fake)
        try:
            yield fake, url
        finally:
            _SESSION_FAKES.remove(fake)


@pytest.fixture
def fake_upstream(fake_upstream_server: tuple[FakeUpstream, str]) -> FakeUpstream:
    fake, _ = fake_upstream_server
    return fake


@pytest.fixture
def upstream_url(fake_upstream_server: tuple[FakeUpstream, str]) -> str:
    return fake_upstream_server[1]


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


@pytest.fixture
def proxy_factory(upstream_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start real proxies (uvicorn on 127.0.0.1) with a fresh data dir each; stopped after the test.
    ``where=`` (the ``where`` fixture's Location) puts the conversations in its PostgreSQL database when it
    names one: proxies started with the same one share it, as replicas do."""
    from proxy.store.location import Location

    if "where" in request.fixturenames:
        # Set up first, so torn down last: the database outlives the servers and the doctor check below.
        request.getfixturevalue("where")
    stack: list[Any] = []
    locations: list[Location] = []

    def start(
        lcm: dict[str, Any] | None = None,
        models: list[Any] | None = None,
        *,
        where: Location | None = None,
        **general: Any,
    ) -> RunningProxy:
        if where is not None and where.database_url is not None:
            general = {"database_url": where.database_url, **general}
        config = make_config(upstream_url, tmp_path / f"data{len(stack)}", lcm, models, **general)
        locations.append(config.general_settings.location())
        app = create_app(config)
        ctx = serve_in_thread(app)
        url = ctx.__enter__()
        stack.append(ctx)
        return RunningProxy(url=url, config=config, app=app)

    yield start
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)
    # Every database a test creates must pass doctor.
    for location in dict.fromkeys(locations):
        if location.exists():
            problems = asyncio.run(run_doctor(location))
            assert problems == [], f"doctor found problems in {location.describe()}: {problems}"


@pytest.fixture
def proxy(proxy_factory: Any) -> RunningProxy:
    return proxy_factory()  # type: ignore[no-any-return]


# PostgreSQL (issue 15): one throwaway cluster per pytest session (so per xdist worker), a fresh database per
# test. Missing server binaries fail the tests that ask for it, never skip them: CI must provide PostgreSQL
# (.ci/run installs it), and a skipped backend would pass silently.
@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    from tests.support.pg_cluster import Cluster, ClusterError

    cluster = Cluster()
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(f"cannot start the test PostgreSQL cluster:\n{exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_database_factory(pg_cluster: Any) -> Iterator[Any]:
    """``make() -> dsn``: a new database (pg_trgm included) each call; all are dropped after the test, open
    connections or not (DROP DATABASE ... WITH (FORCE))."""
    import uuid

    names: list[str] = []

    def make() -> str:
        names.append(f"t_{uuid.uuid4().hex}")
        return pg_cluster.create_database(names[-1])  # type: ignore[no-any-return]

    yield make
    for name in names:
        pg_cluster.drop_database(name)


@pytest.fixture
def pg_dsn(pg_database_factory: Any) -> str:
    """A DSN (``postgresql://postgres@127.0.0.1:PORT/t_...``) of a database of this test's own."""
    return pg_database_factory()  # type: ignore[no-any-return]


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Where a test's store lives: SQLite in its data directory, or PostgreSQL in a database of its own (the
    payload store follows: files on disk, or rows in the database). Tests taking it run on both backends."""
    from proxy.store.location import Location

    if request.param == "sqlite":
        return Location(tmp_path)
    return Location(tmp_path, request.getfixturevalue("pg_dsn"))
