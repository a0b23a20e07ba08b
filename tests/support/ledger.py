"""Standing instructions planted in a stored conversation through the store, as ingest would store them (for the
admin API's and the CLI's tests, which do not depend on extraction)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.store.location import Location
from proxy.store.records import LedgerItem

# The client's turns the planted items come from (seq 0, 2 and 4 of the conversation).
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Never push to main."},
    {"role": "assistant", "content": "Understood."},
    {"role": "user", "content": "The budget cap is $800."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "Quick update: keep spend under $500."},
]
RULE, OLD_BUDGET, BUDGET = "led_00000000000000a1", "led_00000000000000a2", "led_00000000000000a3"


async def plant(location: Location, conversation_id: str) -> list[LedgerItem]:
    """A rule (seq 0), a budget (seq 2) and its update (seq 4), which supersedes it; every item, as stored."""
    store, _ = location.stores()
    await store.open()
    try:
        ids = {m.seq: m.id for m in await store.read.messages(conversation_id, 0, 5)}
        base = LedgerItem(RULE, conversation_id, "rule", "push main", "never", "Never push to main.", 0, ids[0],
                          "user", 1_700_000_000.0)  # fmt: skip
        items = [
            base,
            replace(base, id=OLD_BUDGET, kind="constraint", slot="budget", value="$800",
                    text="The budget cap is $800.", seq=2, message_id=ids[2]),
            replace(base, id=BUDGET, kind="constraint", slot="budget", value="$500",
                    text="Quick update: keep spend under $500.", seq=4, message_id=ids[4]),
        ]  # fmt: skip
        async with store.write() as tx:
            await tx.add_ledger_items(items)
            await tx.supersede_ledger_items([OLD_BUDGET], BUDGET, 4)
        stored: list[LedgerItem] = await store.read.ledger(conversation_id, include_superseded=True)
        return stored
    finally:
        await store.close()
