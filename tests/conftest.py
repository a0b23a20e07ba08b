from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config.settings import ProxyConfig
from proxy.store.location import Location
from tests.support.fakes import SESSION_FAKES, FakeUpstream, reset_fake, session_fake
from tests.support.proxies import (
    AppProxy,
    RunningProxy,
    assert_doctor_passes,
    in_process,
    make_config,
    served,
    with_database,
)
from tests.support.servers import serve_in_thread

# Tests never reach the internet: LiteLLM must not fetch its price list or tokenizers.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.pop("OPENAI_API_KEY", None)

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
    "test_bounded_ledger.py",
    "test_upstream_bounds.py::test_a_6_million_input_embeddings_request_is_refused",
    "test_upstream_bounds.py::test_healthz_answers_within_100ms_while_a_2048_input_embeddings_answer_is_relayed[3072",
    "test_upstream_errors.py::test_upstream_error_table[read_timeout",
    "test_replicas.py::test_identical_first_requests_on_three_replicas_create_one_conversation",
    "test_replicas.py::test_replicas_load_run_with_one_killed_loses_nothing",
    "test_deployments.py::test_litellms_documented_config_",
    "test_serving.py::test_a_dead_worker_is_replaced_and_said_at_warning",
    "test_long_history.py",
    "test_server_window.py::test_a_real_llama_cpp_",
    "test_codex_harness.py",
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


def pytest_configure(config: pytest.Config) -> None:
    # The in-process proxy (tests.support.proxies) is Starlette's TestClient over httpx, the client the proxy and
    # the openai SDK use; its notes on httpx2 and on per-request timeouts are about the tests, not the proxy.
    config.addinivalue_line("filterwarnings", "ignore:Using `httpx` with `starlette.testclient`")
    config.addinivalue_line("filterwarnings", "ignore:You should not use the 'timeout' argument with the TestClient")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_slow_entries()
    for item in items:
        if f"{item.path.name}::{item.name}".startswith(SLOW):
            item.add_marker(pytest.mark.slow)


# The fake upstream is one server for the whole session (starting one per test would cost more than most
# tests). Every test starts with it as new, however the test reaches it (``fake_upstream``, ``upstream_url``
# or a module fixture): nothing a test scripted or recorded is seen by the next.
@pytest.fixture(autouse=True)
def _fresh_fake_upstream() -> None:
    """Autouse fixtures run before the others of their scope, so a function fixture that sets the fake up
    (a responder, a script) still sees its own set-up."""
    for fake in SESSION_FAKES:
        reset_fake(fake)


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serve_in_thread(fake.app) as url, session_fake(fake):
        yield fake, url


@pytest.fixture
def fake_upstream(fake_upstream_server: tuple[FakeUpstream, str]) -> FakeUpstream:
    fake, _ = fake_upstream_server
    return fake


@pytest.fixture
def upstream_url(fake_upstream_server: tuple[FakeUpstream, str]) -> str:
    return fake_upstream_server[1]


def _proxies(
    open_proxy: Callable[[ProxyConfig], contextlib.AbstractContextManager[Any]], upstream_url: str, data_root: Path
) -> Iterator[Callable[..., Any]]:
    """``start(lcm, models, *, where=None, **general)``: a proxy with a fresh data dir each, closed after the
    test (or module), whose databases must then pass doctor. ``where=`` (the ``where`` fixture's Location)
    puts the conversations in its PostgreSQL database when it names one."""
    locations: list[Location] = []
    with contextlib.ExitStack() as stack:

        def start(
            lcm: dict[str, Any] | None = None,
            models: list[Any] | None = None,
            *,
            where: Location | None = None,
            **general: Any,
        ) -> Any:
            data_dir = data_root / f"data{len(locations)}"
            config = make_config(upstream_url, data_dir, lcm, models, **with_database(general, where))
            locations.append(config.general_settings.location())
            return stack.enter_context(open_proxy(config))

        yield start
    assert_doctor_passes(locations)


def _database_first(request: pytest.FixtureRequest) -> None:
    if "where" in request.fixturenames:
        # Set up first, so torn down last: the database outlives the proxies and the doctor check.
        request.getfixturevalue("where")


@pytest.fixture
def proxy_factory(upstream_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Real proxies (uvicorn on 127.0.0.1): for what needs the socket (``tests.support.proxies``)."""
    _database_first(request)
    yield from _proxies(served, upstream_url, tmp_path)


@pytest.fixture
def proxy(proxy_factory: Any) -> RunningProxy:
    return proxy_factory()  # type: ignore[no-any-return]


@pytest.fixture
def app_factory(upstream_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Proxies in this process (``AppProxy``: a ``TestClient`` over the app): for what a socket proves nothing
    more about."""
    _database_first(request)
    yield from _proxies(in_process, upstream_url, tmp_path)


@pytest.fixture
def app_proxy(app_factory: Any) -> AppProxy:
    return app_factory()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def module_app_factory(
    fake_upstream_server: tuple[FakeUpstream, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """In-process proxies shared by all of a module's tests, for tests whose requests store nothing (refused
    ones): the app's start-up, not the request, is most of such a test's time. Not for calls LiteLLM makes
    with a client it keeps per process (moderations, audio): with this module-long event loop running beside a
    test's own, such a call failed to connect."""
    yield from _proxies(in_process, fake_upstream_server[1], tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="module")
def module_app_proxy(module_app_factory: Any) -> AppProxy:
    return module_app_factory()  # type: ignore[no-any-return]


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    """An environment for ``lcm-proxy`` commands with no OpenAI or LCM_ variables, and a data home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "LCM_"))}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    return env


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
    if request.param == "sqlite":
        return Location(tmp_path)
    return Location(tmp_path, request.getfixturevalue("pg_dsn"))
