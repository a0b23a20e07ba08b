"""Command line: ``lcm-proxy serve | check-config``.

Nothing here imports LiteLLM at module level: ``--help``, ``--version`` and ``check-config`` must answer
instantly and offline (LiteLLM costs seconds to import and may try the network).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy import __version__
from proxy.config import ProxyConfig, load_config
from proxy.errors import ConfigError
from proxy.logs import configure_serving_logs

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


def _load(path: str) -> ProxyConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"lcm-proxy: {exc}", file=sys.stderr)
        return None


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    settings = config.general_settings
    names = ", ".join(d.model_name for d in config.model_list)
    print(f"{args.config}: OK")
    print(f"  models:  {names}")
    print(f"  listen:  {settings.bind_host()}:{settings.port}")
    print(f"  auth:    {len(settings.api_keys)} API key(s)" if settings.api_keys else "  auth:    off (single tenant)")
    print(f"  data:    {settings.resolved_data_dir()}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    settings = config.general_settings
    # Whatever the level, no library logs content, and no line shows a configured credential.
    configure_serving_logs(config)
    host = args.host or settings.bind_host()
    port = settings.port if args.port is None else args.port
    if not settings.api_keys and not _is_loopback(host):
        log.warning(
            "listening on %s with NO API keys: anyone who can reach this port can use your upstream keys",
            host,
        )

    import uvicorn

    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": settings.log_level,
        "access_log": settings.access_log,
        "timeout_graceful_shutdown": 10,
        # uvicorn's own loggers propagate to the handler configured above instead of handlers of their own:
        # one format, credentials masked and query strings cut in their lines too.
        "log_config": None,
    }
    log.info("lcm-proxy %s listening on http://%s:%s (config %s)", __version__, host, port, args.config)
    if args.workers > 1:
        # Workers are separate processes: they import the app from the environment.
        os.environ["LCM_PROXY_CONFIG"] = str(Path(args.config).resolve())
        uvicorn.run("proxy.app:app_from_environment", factory=True, workers=args.workers, **common)
    else:
        from proxy.app import create_app

        uvicorn.run(create_app(config, serving=True), **common)
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    from proxy.operator import run_operator

    return run_operator(
        config,
        args.command,
        tenant=args.tenant,
        limit=getattr(args, "limit", 100) or 100,
        conversation_id=getattr(args, "conversation_id", None),
        model=getattr(args, "model", None),
        pattern=getattr(args, "pattern", None),
        mode=getattr(args, "mode", "regex"),
        item_id=getattr(args, "item_id", None),
        start_line=getattr(args, "start_line", None),
        end_line=getattr(args, "end_line", None),
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 1
    import asyncio

    from proxy.doctor import run_doctor
    from proxy.store.sqlite import DB_NAME

    data_dir = config.general_settings.resolved_data_dir()
    if not (data_dir / DB_NAME).exists():
        print(f"lcm-proxy: no database at {data_dir / DB_NAME}", file=sys.stderr)
        return 1
    problems = asyncio.run(run_doctor(data_dir))
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{data_dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lcm-proxy",
        description="OpenAI-compatible reverse proxy with lossless context management.",
        epilog="Point any OpenAI client at http://HOST:PORT/v1. README.md has the config reference.",
    )
    parser.add_argument("--version", action="version", version=f"lcm-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add_config(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config", "-c", default=_default_config(), metavar="PATH",
            help=f"YAML config file (default: $LCM_PROXY_CONFIG or {DEFAULT_CONFIG})",
        )  # fmt: skip

    serve = sub.add_parser("serve", help="run the proxy server", description="Run the proxy server.")
    add_config(serve)
    serve.add_argument("--host", help="bind address (default: general_settings.host; 127.0.0.1 without API keys)")
    serve.add_argument("--port", type=int, help="port (default: general_settings.port, 4000)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser(
        "check-config", help="validate a config file and summarise it", description="Validate a config file."
    )
    check.add_argument("config_path", nargs="?", metavar="PATH", help="config file (or use --config)")
    add_config(check)
    check.set_defaults(func=cmd_check_config)

    listing = sub.add_parser("conversations", help="list stored conversations", description="List conversations.")
    add_config(listing)
    listing.add_argument("--tenant", help="only this tenant's conversations")
    listing.add_argument("--limit", type=int, default=100, help="at most this many, newest first (default: 100)")
    listing.set_defaults(func=cmd_operator)
    for name, text in (
        ("show", "show one conversation: its summary DAG and messages"),
        ("export", "print a conversation's original transcript as JSON (stored files restored)"),
        ("compact", "run a full compaction sweep on a conversation now"),
    ):
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("conversation_id", metavar="ID", help="conversation id (conv_...)")
        add_config(p)
        p.add_argument("--tenant", help="refuse a conversation of another tenant")
        if name == "compact":
            p.add_argument("--model", help="summary model_name (default: summary_model, else the last one used)")
        p.set_defaults(func=cmd_operator)

    grep = sub.add_parser(
        "grep",
        help="search a conversation's messages, summaries and stored files",
        description="Search a conversation (and the conversations it was forked from).",
    )
    grep.add_argument("pattern", help="regular expression (or words with --mode full_text)")
    grep.add_argument("--conversation", dest="conversation_id", required=True, metavar="ID", help="conversation id")
    grep.add_argument("--mode", choices=["regex", "full_text"], default="regex")
    grep.add_argument("--limit", type=int, default=20)
    grep.add_argument("--tenant", help="refuse a conversation of another tenant")
    add_config(grep)
    grep.set_defaults(func=cmd_operator)

    describe = sub.add_parser(
        "describe",
        help="show a summary (lineage, content), a stored file or a message",
        description="Describe a sum_..., file_... or msg_... id.",
    )
    describe.add_argument("item_id", metavar="ID")
    describe.add_argument("--start-line", type=int, dest="start_line")
    describe.add_argument("--end-line", type=int, dest="end_line")
    describe.add_argument("--tenant", help="refuse an id of another tenant")
    add_config(describe)
    describe.set_defaults(func=cmd_operator)

    doctor = sub.add_parser(
        "doctor",
        help="check the database and stored files; exit 1 on any problem",
        description="Check the database and stored files.",
    )
    add_config(doctor)
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "config_path", None):
        args.config = args.config_path
    return int(args.func(args))
