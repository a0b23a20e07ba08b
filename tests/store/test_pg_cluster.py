"""The PostgreSQL test infrastructure itself (tests/support/pg_cluster.py and the ``pg_*`` fixtures in conftest.py).

The store tests trust these fixtures for isolation and for the locking primitive the store's correctness
across replicas rests on (``pg_advisory_xact_lock``), so both are checked here against the real server.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import errors

from tests.support import pg_cluster as pg_cluster_module
from tests.support.pg_cluster import Cluster, ClusterError

LOCK_KEY = 0x6C636D  # any bigint; the store namespaces its own keys


def test_server_is_recent_enough_and_tuned_for_tests(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        assert version is not None and int(version[0]) >= 130000
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'full_page_writes', 'synchronous_commit', 'max_connections', 'listen_addresses')"
            ).fetchall()
        )
    assert settings["fsync"] == "off"
    assert settings["full_page_writes"] == "off"
    assert settings["synchronous_commit"] == "off"
    assert int(settings["max_connections"]) >= 200
    assert settings["listen_addresses"] == "127.0.0.1"


def test_pg_trgm_is_installed_in_every_new_database(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        installed = conn.execute("SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'").fetchone()
        assert installed == ("pg_trgm",)
        row = conn.execute("SELECT similarity('abc', 'abd')").fetchone()
        # Trigrams {"  a", " ab", "abc", "bc "} and {"  a", " ab", "abd", "bd "}: 2 shared of 6.
        assert row is not None and row[0] == pytest.approx(1 / 3, abs=1e-6)
        # A trigram index answers a regex condition (what lcm_grep will rely on).
        conn.execute("CREATE TABLE t (body text)")
        conn.execute("CREATE INDEX t_trgm ON t USING gin (body gin_trgm_ops)")
        conn.execute("INSERT INTO t VALUES ('the quick brown fox'), ('lazy dog')")
        found = conn.execute("SELECT body FROM t WHERE body ~ 'qu[a-z]ck'").fetchall()
        assert found == [("the quick brown fox",)]


def test_each_database_is_its_own(pg_dsn: str, pg_database_factory: Callable[[], str]) -> None:
    other = pg_database_factory()
    assert other != pg_dsn
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE only_here (id int)")
        conn.execute("INSERT INTO only_here VALUES (1)")
    with psycopg.connect(other) as conn:
        assert conn.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM only_here").fetchone() == (1,)


def test_drop_database_terminates_open_connections(pg_cluster: Cluster) -> None:
    dsn = pg_cluster.create_database("t_drop_while_connected")
    left_open = psycopg.connect(dsn)  # what a test that forgets to close its pool leaves behind
    try:
        pg_cluster.drop_database("t_drop_while_connected")
        with psycopg.connect(pg_cluster.dsn("postgres")) as conn:
            row = conn.execute("SELECT count(*) FROM pg_database WHERE datname = 't_drop_while_connected'")
            assert row.fetchone() == (0,)
        with pytest.raises(psycopg.OperationalError):
            left_open.execute("SELECT 1")
    finally:
        left_open.close()


def test_advisory_xact_lock_serialises_and_ends_with_the_transaction(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as first, psycopg.connect(pg_dsn) as second:
        # Non-autocommit connections: each execute runs inside the connection's open transaction.
        first.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        assert second.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)).fetchone() == (False,)
        second.rollback()
        # The blocking form waits while the lock is held: lock_timeout turns that wait into an error.
        second.execute("SET lock_timeout = '50ms'")
        second.commit()
        with pytest.raises(errors.LockNotAvailable):
            second.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        second.rollback()

        first.commit()  # releases it: transaction-level locks do not outlive the transaction
        assert second.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)).fetchone() == (True,)
        assert first.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)).fetchone() == (False,)
        first.rollback()
        second.commit()
        assert first.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)).fetchone() == (True,)
        first.commit()
        # Nothing is left at session level (what would leak under PgBouncer's transaction pooling).
        held = second.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        assert held == (0,)


def test_a_failed_start_says_why_and_cleans_up() -> None:
    cluster = Cluster(settings={"no_such_setting": "1"})
    with pytest.raises(ClusterError) as caught:
        cluster.start()
    message = str(caught.value)
    assert "pg_ctl start failed" in message
    assert "no_such_setting" in message  # from the server log's tail
    assert cluster.base is None


def test_missing_binaries_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pg_cluster_module, "DEBIAN_GLOB", str(tmp_path / "postgresql" / "*" / "bin"))
    with pytest.raises(ClusterError, match="no PostgreSQL server binaries") as caught:
        Cluster().start()
    assert "postgresql-contrib" in str(caught.value)
