"""Command line: ``lcm-proxy serve | check-config``, and the operator commands over the database.

Nothing here imports LiteLLM at module level: ``--help``, ``--version`` and ``check-config`` must answer
instantly and offline (LiteLLM costs seconds to import and may try the network).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy import __version__
from proxy.cli.common import at_least_one, driver_missing, load_or_say, operator_setup
from proxy.cli.delete import add_deleting_commands
from proxy.cli.ledger import add_ledger_command
from proxy.cli.operator import add_reading_commands, cmd_ledger
from proxy.config.logs import configure_serving_logs
from proxy.scopes import user_scope
from proxy.store.location import Location, is_postgres_url, missing_postgres_driver

DEFAULT_CONFIG = "config/proxy.yaml"
log = logging.getLogger("lcm_proxy")


def _default_config() -> str:
    return os.environ.get("LCM_PROXY_CONFIG", DEFAULT_CONFIG)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _litellm_tables_warning(location: Location) -> str | None:
    """Whether the PostgreSQL store is LiteLLM proxy's own database, by its tables (when it can be reached)."""
    if location.database_url is None:
        return None
    from proxy.config.litellm_compat import litellm_tables_warning
    from proxy.store.postgres.store import litellm_tables

    tables = litellm_tables(location.database_url)
    return litellm_tables_warning(location.describe(), tables) if tables else None


def cmd_check_config(args: argparse.Namespace) -> int:
    config = load_or_say(args.config)
    if config is None or driver_missing(config.general_settings.location()):
        return 1
    from proxy.cli.check_config import model_report

    settings = config.general_settings
    warnings = config.warnings
    found = _litellm_tables_warning(settings.location())
    if found is not None:
        warnings.append(found)
    names = ", ".join(d.model_name for d in config.model_list)
    print(f"{args.config}: OK" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    print(f"  models:  {names}")
    print(f"  listen:  {settings.bind_host()}:{settings.port}")
    admins = sum(k.admin for k in settings.api_keys)
    keys = f"{len(settings.api_keys)} API key(s)" + (
        f", {admins} admin (may name tenants under /lcm/)" if admins else ""
    )
    print(f"  auth:    {keys}" if settings.api_keys else "  auth:    off (single tenant)")
    location = settings.location()
    schema = " (lcm-proxy's tables in schema lcm)" if location.kind == "postgresql" else ""
    print(f"  data:    {location.describe()}{schema}")
    for line in model_report(config):
        print(line)
    for warning in warnings:
        print(f"lcm-proxy: warning: {warning}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    config = load_or_say(args.config)
    if config is None or driver_missing(config.general_settings.location()):
        return 1
    settings = config.general_settings
    # Whatever the level, no library logs content, and no line shows a configured credential.
    configure_serving_logs(config)
    found = _litellm_tables_warning(settings.location())
    for warning in config.warnings + ([found] if found else []):  # here, once: workers do not repeat them
        log.warning("config: %s", warning)
    host = args.host or settings.bind_host()
    port = settings.port if args.port is None else args.port
    if not settings.api_keys and not _is_loopback(host):
        log.warning(
            "serving on %s with NO API keys: anyone who can reach this port can use your upstream keys",
            host,
        )

    from proxy.cli.serving import serve

    return serve(config, str(Path(args.config).resolve()), host, port, args.workers)


def cmd_doctor(args: argparse.Namespace) -> int:
    setup = operator_setup(args)
    if setup is None:
        return 1
    import asyncio

    from proxy.cli.doctor import run_doctor

    location = setup[0]
    if not location.exists():
        print(f"lcm-proxy: no database at {location.describe()}", file=sys.stderr)
        return 1
    if getattr(args, "repair", False):
        from proxy.cli.doctor import run_repair

        for line in asyncio.run(run_repair(location)):
            print(f"repaired: {line}")
    problems = asyncio.run(run_doctor(location))  # what remains: the exit status is 1 if anything does
    for problem in problems:
        print(f"problem: {problem}")
    where = location.data_dir if location.kind == "sqlite" else location.describe()
    print(f"{where}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Copy the SQLite store (``--data-dir``, else the config's) into the PostgreSQL database ``--to``."""
    if not is_postgres_url(args.to):
        print("lcm-proxy migrate: --to: expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE", file=sys.stderr)
        return 2
    setup = operator_setup(args)
    if setup is None:
        return 1
    location = setup[0]
    if location.kind != "sqlite":
        print(
            f"lcm-proxy migrate: the store is already PostgreSQL ({location.describe()}); migrate copies an SQLite"
            " store: name its data directory with --data-dir DIR",
            file=sys.stderr,
        )
        return 1
    if not location.exists():
        print(f"lcm-proxy migrate: no database at {location.describe()}", file=sys.stderr)
        return 1
    missing = missing_postgres_driver()
    if missing is not None:
        print(f"lcm-proxy migrate: --to: {missing}", file=sys.stderr)
        return 1
    from proxy.store.migrate import run_migrate

    return run_migrate(location.data_dir, args.to, batch_rows=args.batch_size)


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", "-c", default=_default_config(), metavar="PATH",
        help=f"YAML config file (default: $LCM_PROXY_CONFIG or {DEFAULT_CONFIG})",
    )  # fmt: skip


def _add_store(p: argparse.ArgumentParser) -> None:
    """The options that find the store an operator command works on."""
    _add_config(p)
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the proxy's data directory; no config is read then (compact still reads it for its model)",
    )
    p.add_argument(
        "--database-url", metavar="URL",
        help="a PostgreSQL store (postgresql://...) instead of the config's; no config is read then",
    )  # fmt: skip


def _add_serving_commands(sub: Any) -> None:
    """``serve`` and ``check-config``."""
    serve = sub.add_parser("serve", help="run the proxy server", description="Run the proxy server.")
    _add_config(serve)
    serve.add_argument("--host", help="bind address (default: general_settings.host; 127.0.0.1 without API keys)")
    serve.add_argument("--port", type=int, help="port (default: general_settings.port, 4000)")
    serve.add_argument("--workers", type=at_least_one, default=1, help="worker processes (default: 1)")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser(
        "check-config", help="validate a config file and summarise it", description="Validate a config file."
    )
    check.add_argument("config_path", nargs="?", metavar="PATH", help="config file (or use --config)")
    _add_config(check)
    check.set_defaults(func=cmd_check_config)


def _add_maintenance_commands(sub: Any) -> None:
    """``doctor`` and ``migrate``."""
    doctor = sub.add_parser(
        "doctor",
        help="check the database and stored files; exit 1 on any problem",
        description="Check the database and stored files.",
    )
    _add_store(doctor)
    doctor.add_argument(
        "--repair", action="store_true",
        help="first delete files left behind by interrupted requests (safe while the server runs: files it may"
        " still be writing are left alone)",
    )  # fmt: skip
    doctor.set_defaults(func=cmd_doctor)

    migrate = sub.add_parser(
        "migrate",
        help="copy an SQLite store into PostgreSQL (resumable)",
        description="Copy an SQLite store into PostgreSQL, ids kept. Stop the proxy first. An interrupted run"
        " resumes when the same command runs again; rows already in the target are compared, never overwritten."
        " Exit 1 if the counts differ or a payload could not be copied.",
    )  # fmt: skip
    _add_config(migrate)
    migrate.add_argument("--data-dir", metavar="DIR", help="the SQLite store's data directory (default: the config's)")
    migrate.add_argument("--to", required=True, metavar="URL", help="the target: postgresql://USER:PASSWORD@HOST/DB")
    migrate.add_argument(
        "--batch-size", type=at_least_one, default=500, metavar="N", help="rows per transaction (default: 500)"
    )
    migrate.set_defaults(func=cmd_migrate, database_url=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lcm-proxy",
        description="OpenAI-compatible reverse proxy with lossless context management.",
        epilog="Point any OpenAI client at http://HOST:PORT/v1. docs/configuration.md has the config reference.",
    )
    parser.add_argument("--version", action="version", version=f"lcm-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serving_commands(sub)
    add_reading_commands(sub, _add_store)
    add_ledger_command(sub, _add_store, cmd_ledger)
    add_deleting_commands(sub, _add_store)
    _add_maintenance_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "config_path", None):
        args.config = args.config_path
    if getattr(args, "user", None):
        if not args.tenant:
            print(
                f"lcm-proxy {args.command}: error: --user needs --tenant (the tenant the user is in)", file=sys.stderr
            )
            return 2
        args.tenant = user_scope(args.tenant, args.user)  # an end user's conversations live in a scope of their own
    start, end = getattr(args, "start_line", None), getattr(args, "end_line", None)
    if start is not None and end is not None and end < start:
        print(f"lcm-proxy {args.command}: error: --end-line {end} is before --start-line {start}", file=sys.stderr)
        return 2
    try:
        status = int(args.func(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of the output went away (``lcm-proxy show ID | head -1``). Like standard tools, stop
        # quietly with the status of a process ended by SIGPIPE; stdout goes to /dev/null so that Python's
        # own flush at exit does not report the closed pipe once more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return status
