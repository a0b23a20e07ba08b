"""The first run of a LiteLLM config pasted as documented (issue 22, "The first run").

LiteLLM's own docs use ``master_key: sk-1234``: accepted, with a warning. A ``database_url`` that is LiteLLM
proxy's own database is said so (its name, and when ``check-config`` can connect, LiteLLM's tables). A
``postgresql://`` store without the driver installed fails ``check-config`` and ``serve`` with the command that
installs it, not a traceback. Everything runs in-process (``proxy.cli.main.main``); the driver's absence is
simulated with ``sys.modules[name] = None``, which makes its import raise ImportError.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import sys
import textwrap
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from starlette.requests import Request

import proxy.cli.serving
from proxy.cli import main as cli
from proxy.config.loading import parse_config
from proxy.errors import AuthenticationError, ConfigError
from proxy.store.location import POSTGRES_INSTALL, Location
from proxy.wire.auth import Authenticator
from tests.support import REPO

# What installs the driver wherever lcm-proxy came from (it is not on PyPI: ``pip install 'lcm-proxy[postgres]'``
# fails), and from a clone.
EXTRA = "pip install 'psycopg[binary,pool]>=3.2,<4' (in a clone of lcm-proxy: pip install '.[postgres]')"
MODEL = {"model_name": "m", "litellm_params": {"model": "openai/m"}, "model_info": {"max_input_tokens": 8192}}


def write_config(tmp_path: Path, general: str) -> Path:
    path = tmp_path / "litellm.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - model_name: m
                litellm_params: {model: openai/m, api_key: sk-upstream-0000}
                model_info: {max_input_tokens: 8192}
            general_settings:
            """
        )
        + textwrap.indent(textwrap.dedent(general), "  ")
    )
    return path


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``serve`` up to the server itself: what it would have started with (no socket, no logging setup)."""
    calls: list[Any] = []
    monkeypatch.setattr(proxy.cli.serving, "serve", lambda *args: calls.append(args) or 0)
    monkeypatch.setattr(cli, "configure_serving_logs", lambda config: None)
    return calls


def test_litellms_documented_master_key_is_accepted_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, served: list[Any]
) -> None:
    path = write_config(tmp_path, f"master_key: sk-1234\ndata_dir: {tmp_path / 'data'}\n")
    assert cli.main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "OK (1 warning(s))" in out and "1 API key(s), 1 admin" in out
    assert "lcm-proxy: warning: general_settings.master_key: 7 characters" in err
    assert "sk-1234" not in out + err  # the warning never shows the key
    with caplog.at_level(logging.WARNING, logger="lcm_proxy"):
        assert cli.main(["serve", "--config", str(path)]) == 0
    assert len(served) == 1  # it starts
    assert any("general_settings.master_key: 7 characters" in r.getMessage() for r in caplog.records)
    assert not any("sk-1234" in r.getMessage() for r in caplog.records)


def test_a_short_api_key_is_accepted_with_a_warning_naming_it_and_an_empty_one_is_not() -> None:
    general = {"api_keys": ["long-enough-key-1", {"key": "abc", "tenant": "a"}]}
    config = parse_config({"model_list": [MODEL], "general_settings": general})
    assert [k.key for k in config.general_settings.api_keys] == ["long-enough-key-1", "abc"]
    assert [w for w in config.warnings if "characters" in w] == [
        "general_settings.api_keys[1].key: 3 characters; a short key is easy to guess: use a long random one"
        " (e.g. openssl rand -hex 24) on a proxy that others can reach"
    ]
    with pytest.raises(ConfigError):
        parse_config({"model_list": [MODEL], "general_settings": {"api_keys": [""]}})


def test_a_short_key_is_still_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config({"model_list": [MODEL], "general_settings": {"master_key": "sk-1234"}})
    auth = Authenticator(config.general_settings.api_keys)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)

    def request(key: str) -> Request:
        return Request({"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]})

    assert auth.tenant_for(request("sk-1234")) == "master"
    with pytest.raises(AuthenticationError):
        auth.tenant_for(request("sk-1235"))
    assert compared == [(b"sk-1234", b"sk-1234"), (b"sk-1234", b"sk-1235")]


# --- a database_url that is LiteLLM proxy's own database ---------------------------------------------------------


def test_a_database_named_litellm_is_said_to_be_litellms_in_check_config_and_at_startup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, served: list[Any]
) -> None:
    # Port 9 on loopback: nothing listens, so check-config cannot look at the tables; the name alone says it.
    path = write_config(
        tmp_path, "master_key: sk-lcm-0123456789\ndatabase_url: postgresql://llmproxy:pw@127.0.0.1:9/litellm\n"
    )
    assert cli.main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "data:    postgresql://llmproxy@127.0.0.1:9/litellm (lcm-proxy's tables in schema lcm)" in out
    warning = next(line for line in err.splitlines() if "database_url" in line)
    assert "LiteLLM proxy's own database" in warning and "schema lcm" in warning
    assert "CREATE DATABASE lcm_proxy" in warning and ":pw@" not in err
    with caplog.at_level(logging.WARNING, logger="lcm_proxy"):
        assert cli.main(["serve", "--config", str(path)]) == 0
    assert any("LiteLLM proxy's own database" in r.getMessage() for r in caplog.records)


def test_a_database_of_another_name_without_litellms_tables_gets_no_such_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_dsn: str
) -> None:
    path = write_config(tmp_path, f"database_url: {pg_dsn}\n")
    assert cli.main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "LiteLLM" not in out + err


def test_litellms_tables_in_the_database_are_named_in_check_config_and_at_startup(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    served: list[Any],
    pg_dsn: str,
) -> None:
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # what LiteLLM proxy's prisma migrations create
        conn.execute('CREATE TABLE "LiteLLM_VerificationToken" (token text PRIMARY KEY)')
        conn.execute('CREATE TABLE "LiteLLM_SpendLogs" (request_id text PRIMARY KEY)')
    path = write_config(tmp_path, f"database_url: {pg_dsn}\n")
    assert cli.main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "OK (1 warning(s))" in out
    warning = next(line for line in err.splitlines() if "LiteLLM" in line)
    assert "holds LiteLLM proxy's tables (2: LiteLLM_SpendLogs, LiteLLM_VerificationToken)" in warning
    assert "schema lcm" in warning and "CREATE DATABASE lcm_proxy" in warning
    with caplog.at_level(logging.WARNING, logger="lcm_proxy"):
        assert cli.main(["serve", "--config", str(path)]) == 0
    assert any("holds LiteLLM proxy's tables" in r.getMessage() for r in caplog.records)


# --- the PostgreSQL driver --------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["psycopg", "psycopg_pool"])
def test_check_config_and_serve_name_the_extra_when_the_driver_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, served: list[Any], module: str
) -> None:
    path = write_config(tmp_path, "database_url: postgresql://lcm:pw@127.0.0.1:9/lcm\n")
    monkeypatch.setitem(sys.modules, module, None)  # ``import module`` raises ImportError now
    assert cli.main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "OK" not in out and "Traceback" not in err
    assert (
        f"general_settings.database_url: the PostgreSQL store needs the psycopg driver, which is not installed: {EXTRA}"
        in err
    )
    assert cli.main(["serve", "--config", str(path)]) == 1
    assert served == []  # refused before anything starts
    assert EXTRA in capsys.readouterr().err
    assert cli.main(["conversations", "--database-url", "postgresql://lcm@127.0.0.1:9/lcm"]) == 1
    assert EXTRA in capsys.readouterr().err


def test_sqlite_needs_no_postgresql_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    path = write_config(tmp_path, f"data_dir: {tmp_path / 'data'}\n")
    assert cli.main(["check-config", str(path)]) == 0
    assert "psycopg" not in capsys.readouterr().err


def test_the_driver_hint_installs_the_postgres_extras_own_requirements() -> None:
    """The hint names no package that is not on PyPI (``lcm-proxy[postgres]`` fails from a clone) but the
    ``postgres`` extra's own requirements, as pyproject.toml states them, which the installed driver satisfies;
    and, for a clone, the extra itself."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    hint = POSTGRES_INSTALL
    assert "lcm-proxy[" not in hint
    named = re.findall(r"pip install '([^']+)'", hint)
    assert named == [*extras["postgres"], ".[postgres]"], hint
    for requirement in map(Requirement, extras["postgres"]):
        assert requirement.specifier.contains(version(requirement.name)), f"{requirement} is not what is installed"


def test_migrate_names_the_driver_install_when_the_driver_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    asyncio.run(_create_store(Location(data)))  # the SQLite store migrate would copy
    path = write_config(tmp_path, f"data_dir: {data}\n")
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "proxy.store.migrate", raising=False)
    assert cli.main(["migrate", "--config", str(path), "--to", "postgresql://lcm@127.0.0.1:9/lcm"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and EXTRA in err, err


async def _create_store(where: Location) -> None:
    store, _ = where.stores()
    await store.open()
    await store.close()
