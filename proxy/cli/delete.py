"""The deleting commands: ``lcm-proxy delete ID`` and ``lcm-proxy purge`` (``proxy.cli.operator`` runs them,
``proxy.engine.deletion`` decides what goes).

Confirmation: a deleting command asks on a terminal (``[y/N]``, no by default) unless ``--yes`` is given;
without a terminal (a script, cron) it needs ``--yes`` and otherwise deletes nothing (exit status 2). ``purge
--tenant T`` without ``--older-than`` deletes everything of that tenant (a privacy request) and needs
``--yes`` even on a terminal. ``--dry-run`` lists what a purge would delete and needs no yes. Each deletion's
audit line (``lcm_proxy.audit``) goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from typing import Any

from proxy.cli.operator import cmd_operator
from proxy.logs import FORMAT

DURATION = re.compile(r"([0-9]{1,6})([dhm])")
UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60}


def _duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``: seconds."""
    match = DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 30d, 12h or 90m (days, hours, minutes), got {text!r}"
        )
    return int(match.group(1)) * UNIT_SECONDS[match.group(2)]


def _confirmation(args: argparse.Namespace) -> Callable[[str], bool] | None:
    """How a deleting command gets its yes: --yes, else a question on the terminal. Without a terminal (a
    script, cron) and without --yes nothing is deleted: None."""
    if args.yes:
        return lambda question: True
    if not sys.stdin.isatty():
        return None

    def ask(question: str) -> bool:
        try:
            return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
        except EOFError:
            return False

    return ask


def cmd_delete(args: argparse.Namespace) -> int:
    """``delete ID`` and ``purge``: deleting commands need a yes (``_confirmation``); ``purge --tenant`` with
    no ``--older-than`` (everything of a tenant) needs --yes itself. Each deletion's audit line goes to stderr."""
    command = f"lcm-proxy {args.command}"
    purge, dry_run = args.command == "purge", getattr(args, "dry_run", False)
    if purge and args.older_than is None and args.tenant is None:
        print(
            f"{command}: error: name what to delete: --older-than DURATION, --tenant TENANT, or both", file=sys.stderr
        )
        return 2
    if purge and args.older_than is None and not (args.yes or dry_run):
        print(f"{command}: error: deleting everything of tenant {args.tenant} needs --yes", file=sys.stderr)
        return 2
    confirm = _confirmation(args)
    if confirm is None and not dry_run:
        print(f"{command}: error: stdin is not a terminal to confirm on: pass --yes to delete", file=sys.stderr)
        return 2
    audit = logging.getLogger("lcm_proxy.audit")
    if not audit.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        audit.addHandler(handler)
        audit.setLevel(logging.INFO)
    args.confirm = confirm or (lambda question: False)
    return cmd_operator(args)


def add_deleting_commands(sub: Any, add_store: Callable[[argparse.ArgumentParser], None]) -> None:
    """``delete`` and ``purge`` on the CLI's subcommands; ``add_store`` adds the options that find the store."""

    def add_deleting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--yes", "-y", action="store_true", help="delete without asking")
        p.add_argument(
            "--vacuum-full", action="store_true",
            help="then rewrite the store's files (SQLite VACUUM, PostgreSQL VACUUM FULL: locks each table while it"
            " runs)",
        )  # fmt: skip

    delete = sub.add_parser(
        "delete",
        help="delete a conversation and everything stored with it",
        description="Delete a conversation: its messages, summaries, files no other conversation uses, and their"
        " traces in the store's files (docs/operations.md). Forks keep the prefix they share with it until they"
        " are deleted too. Asks for confirmation on a terminal; elsewhere it needs --yes.",
    )  # fmt: skip
    delete.add_argument("conversation_id", metavar="ID", help="conversation id (conv_...) or the client's key for it")
    add_store(delete)
    delete.add_argument("--tenant", help="refuse a conversation of another tenant")
    delete.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
    add_deleting(delete)
    delete.set_defaults(func=cmd_delete)

    purge = sub.add_parser(
        "purge",
        help="delete conversations idle for longer than a duration, or all of a tenant's",
        description="Delete the conversations whose last activity is older than --older-than (of --tenant only, if"
        " given); --tenant alone deletes everything of that tenant and needs --yes. Forks keep what they share"
        " with a deleted conversation. Asks for confirmation on a terminal; elsewhere it needs --yes.",
    )  # fmt: skip
    purge.add_argument(
        "--older-than", type=_duration, metavar="DURATION", help="idle for longer than this: 30d, 12h or 90m"
    )
    purge.add_argument("--tenant", help="only this tenant's conversations")
    purge.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
    purge.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    add_store(purge)
    add_deleting(purge)
    purge.set_defaults(func=cmd_delete)
