"""What both stores share of the ledger of standing instructions (``ledger_items``): the rows a fork's copy
of its parent's items gets.

A fork gets copies of the items stated before its fork point, under ids of its own (an item is the fork's to pin
or drop without touching its parent's), each naming the fork's copy of its message. What superseded them after
the fork point does not exist in the fork, so there they are current again; the same holds where a conversation
loses its later messages (a deletion that keeps a prefix for forks, a relayed answer replaced in place).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from proxy.store.records import LedgerItem

LEDGER_COLUMNS = (
    "id, conversation_id, kind, slot, value, text, seq, message_id, role, created_at, superseded_seq, "
    "superseded_by, state"
)


def new_item_id() -> str:
    return "led_" + secrets.token_hex(8)


def item_row(item: LedgerItem) -> tuple[Any, ...]:
    """``item``'s values in the order of ``LEDGER_COLUMNS``."""
    return (
        item.id, item.conversation_id, item.kind, item.slot, item.value, item.text, item.seq, item.message_id,
        item.role, item.created_at, item.superseded_seq, item.superseded_by, item.state,
    )  # fmt: skip


def forked(
    items: Sequence[LedgerItem], target_id: str, message_ids: dict[int, int], count: int
) -> list[tuple[Any, ...]]:
    """Rows of ``items`` (those stated before ``count``) copied into the fork ``target_id``: new ids, the fork's
    own messages (``message_ids``: seq -> id), and a supersession kept only when the statement behind it is
    before the fork point too."""
    ids = {item.id: new_item_id() for item in items if item.seq < count}
    rows = []
    for item in items:
        if item.seq >= count:
            continue
        kept = item.superseded_seq is not None and item.superseded_seq < count and item.superseded_by in ids
        by = ids[item.superseded_by or ""] if kept else None
        copy = LedgerItem(
            ids[item.id], target_id, item.kind, item.slot, item.value, item.text, item.seq, message_ids[item.seq],
            item.role, item.created_at, item.superseded_seq if kept else None, by, item.state,
        )  # fmt: skip
        rows.append(item_row(copy))
    return rows
