"""``lcm-proxy ledger ID``: a conversation's standing instructions (``standing.ledger``), each with the message
it came from, and the languages of its messages that the deterministic reader does not read (with how many
messages each); ``--pin``, ``--drop`` or ``--restore`` one of them. Also the "Standing instructions" section of
``lcm-proxy show``. Run by ``proxy.cli.operator`` (its errors, its exit statuses) over the admin service."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from proxy.engine.admin import AdminViews

CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
CHANGES = {"pin": "pinned", "drop": "dropped", "restore": "active"}  # option -> the state it sets


def item_line(item: dict[str, Any]) -> str:
    """``[kind] text (msg SEQ, id[, pinned | dropped | superseded ...])``, one line whatever the text holds."""
    notes = [f"msg {item['seq']}", item["id"]]
    if item["state"] != "active":
        notes.append(item["state"])
    if item["superseded_seq"] is not None:
        notes.append(f"superseded at msg {item['superseded_seq']} by {item['superseded_by']}")
    text = " ".join(item["text"].split())
    # Client text reaches the operator's terminal: never let it carry escape sequences.
    return CONTROL_CHARACTERS.sub("?", f"[{item['kind']}] {text} ({', '.join(notes)})")


def ledger_lines(items: list[dict[str, Any]]) -> list[str]:
    """Those in force first (pinned marked), then those the user dropped, each by seq."""
    dropped = [i for i in items if i["state"] == "dropped"]
    return [f"  {item_line(i)}" for i in [*(i for i in items if i["state"] != "dropped"), *dropped]]


async def show_section(views: AdminViews, conversation_id: str) -> list[str]:
    """``show``'s section: nothing at all for a conversation without standing instructions."""
    items = (await views.ledger(None, conversation_id, with_languages=False))["data"]
    return ["", "Standing instructions:", *ledger_lines(items)] if items else []


async def ledger_text(
    views: AdminViews, conversation_id: str, tenant: str | None, every: bool, change: tuple[str, str] | None
) -> str:
    """The list, or (``change``: (option, item id)) the one item as that option left it."""
    if change is not None:
        option, item_id = change
        item = await views.set_ledger_state(tenant, conversation_id, item_id, CHANGES[option])
        return f"{CHANGES[option]}: {item_line(item)}"
    listed = await views.ledger(tenant, conversation_id, every)
    items = listed["data"]
    lines = ledger_lines(items) if items else [f"no standing instructions in {conversation_id}"]
    return "\n".join([*lines, *language_lines(listed["languages"])])


def language_lines(languages: dict[str, Any]) -> list[str]:
    """What the deterministic reader did not read (``AdminViews.unread_languages``): nothing when it read all."""
    if not languages["not_read"]:
        return []
    reads = ", ".join(languages["deterministic_reader"])
    scanned = "" if languages["scanned_from_seq"] == 0 else f" (of the newest {languages['scanned_messages']})"
    return [
        "",
        f"Languages the deterministic reader does not read (it reads {reads}; only the summary model's"
        f" proposals set items from these){scanned}:",
        *(f"  {n['language']}: {n['messages']} message{'' if n['messages'] == 1 else 's'} not read by the"
          " deterministic reader" for n in languages["not_read"]),
    ]  # fmt: skip


def ledger_change(args: argparse.Namespace) -> tuple[str, str] | None:
    """(option, item id) of the one change ``--pin``/``--drop``/``--restore`` asks for, or None (a listing)."""
    changes = [(option, getattr(args, option)) for option in CHANGES if getattr(args, option)]
    return changes[0] if changes else None


def add_ledger_command(
    sub: Any, add_store: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], int]
) -> None:
    """``ledger`` on the CLI's subcommands, run by ``run`` (the operator commands' runner); ``add_store`` adds
    the options that find the store."""
    ledger = sub.add_parser(
        "ledger",
        help="show a conversation's standing instructions; pin or drop one",
        description="List the standing instructions kept in front of the model for a conversation, each with the"
        " message it came from; or change one: a pinned item is kept first when the ledger must shrink, a"
        " dropped one is never forwarded again, a restored one is active again.",
    )  # fmt: skip
    ledger.add_argument("conversation_id", metavar="ID", help="conversation id (conv_...) or the client's key for it")
    ledger.add_argument("--all", action="store_true", dest="every", help="also the items later statements superseded")
    change = ledger.add_mutually_exclusive_group()
    change.add_argument("--pin", metavar="ITEM", help="pin the item led_...")
    change.add_argument("--drop", metavar="ITEM", help="drop the item led_...")
    change.add_argument("--restore", metavar="ITEM", help="make the item led_... active again")
    add_store(ledger)
    ledger.add_argument("--tenant", help="refuse a conversation of another tenant")
    ledger.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
    ledger.set_defaults(func=run)
