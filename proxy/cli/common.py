"""What the commands share: loading the config (saying what is wrong instead of a traceback), and finding the
store an operator command works on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from proxy.config.loading import Needed, load_config
from proxy.config.settings import ProxyConfig
from proxy.errors import ConfigError
from proxy.store.location import Location, is_postgres_url, missing_postgres_driver


def load_or_say(path: str, needed: Needed | None = None) -> ProxyConfig | None:
    try:
        return load_config(path, needed)
    except ConfigError as exc:
        print(f"lcm-proxy: {exc}", file=sys.stderr)
        return None


def store_keys(path: str) -> bool:
    """The keys an operator command reads from the config to find the database."""
    return path.startswith(("general_settings.data_dir", "general_settings.database_url"))


def compact_keys(path: str) -> bool:
    """``compact`` also calls the summary model: the timeouts and lcm_settings, and (checked when the model is
    chosen, see ``ModelRouter.resolve``) that model's own deployment. Never the proxy's API keys."""
    proxy_keys = path.startswith(("general_settings.api_keys", "general_settings.master_key"))
    return path.startswith(("general_settings", "lcm_settings")) and not proxy_keys


def driver_missing(location: Location, where: str = "general_settings.database_url") -> bool:
    """A PostgreSQL store without its driver (an optional extra): said, naming the extra, instead of a traceback."""
    problem = missing_postgres_driver() if location.database_url is not None else None
    if problem is not None:
        print(f"lcm-proxy: {where}: {problem}", file=sys.stderr)
    return problem is not None


def operator_setup(args: argparse.Namespace) -> tuple[Location, ProxyConfig | None] | None:
    """Where the conversations are, and for ``compact`` the config. ``--data-dir`` or ``--database-url`` need
    no config at all; from a config only what the command uses must resolve (no upstream key just to read
    the database)."""
    compact = args.command == "compact"
    config = None
    given = args.data_dir or args.database_url
    if compact or not given:
        config = load_or_say(args.config, compact_keys if compact else store_keys)
        if config is None:
            return None
    if given:
        if args.database_url and not is_postgres_url(args.database_url):
            print("lcm-proxy: --database-url: expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE", file=sys.stderr)
            return None
        data_dir = Path(args.data_dir).expanduser() if args.data_dir else Path(".")
        location = Location(data_dir, args.database_url or None)
        return None if driver_missing(location, "--database-url") else (location, config)
    assert config is not None
    location = config.general_settings.location()
    return None if driver_missing(location) else (location, config)


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
