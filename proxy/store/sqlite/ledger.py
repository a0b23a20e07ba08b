"""The SQLite store's ledger of standing instructions (``ledger_items``, ``proxy.store.ledger``): its read
(``Reads.ledger``), mixed into ``sqlite.reads.Queries``, and its writes, mixed into the write transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiosqlite

from proxy.store.ledger import LEDGER_COLUMNS, forked, item_row
from proxy.store.records import LedgerItem

_VALUES = ", ".join("?" * len(LEDGER_COLUMNS.split(",")))


class SQLiteLedgerReads:
    if TYPE_CHECKING:  # provided by ``sqlite.reads.Queries``

        async def _all(self, sql: str, args: Sequence[Any]) -> list[Any]: ...
        async def _one(self, sql: str, args: Sequence[Any]) -> Any: ...

    async def ledger(
        self, conversation_id: str, include_superseded: bool = False, *, newest_superseded: int | None = None
    ) -> list[LedgerItem]:
        """The conversation's items by seq; without ``include_superseded`` only those no later statement
        replaced (dropped ones included: callers filter on ``LedgerItem.current``); with it and
        ``newest_superseded``, of the replaced ones only that many, the newest."""
        if include_superseded and newest_superseded is not None:
            rows = await self._all(
                f"SELECT {LEDGER_COLUMNS} FROM ledger_items WHERE conversation_id = ? AND superseded_seq IS NULL"
                f" UNION ALL SELECT * FROM (SELECT {LEDGER_COLUMNS} FROM ledger_items WHERE conversation_id = ?"
                f" AND superseded_seq IS NOT NULL ORDER BY seq DESC, id DESC LIMIT ?) AS newest ORDER BY seq, id",
                (conversation_id, conversation_id, newest_superseded),
            )
            return [LedgerItem(*r) for r in rows]
        # The open items alone through their own index (``ledger_items_open``: a literal condition, which a
        # partial index needs; a long conversation has replaced many more items than are open).
        open_only = "" if include_superseded else " AND superseded_seq IS NULL"
        rows = await self._all(
            f"SELECT {LEDGER_COLUMNS} FROM ledger_items WHERE conversation_id = ?{open_only} ORDER BY seq, id",
            (conversation_id,),
        )
        return [LedgerItem(*r) for r in rows]

    async def message_ids(self, conversation_id: str, start: int, end: int) -> dict[int, int]:
        """seq -> row id of the conversation's messages [start, end): what new items name."""
        rows = await self._all(
            "SELECT seq, id FROM messages WHERE conversation_id = ? AND seq >= ? AND seq < ?",
            (conversation_id, start, end),
        )
        return {int(seq): int(i) for seq, i in rows}


class SQLiteLedgerWrites(SQLiteLedgerReads):
    conn: aiosqlite.Connection

    async def add_ledger_items(self, items: Sequence[LedgerItem]) -> None:
        await self.conn.executemany(
            f"INSERT INTO ledger_items ({LEDGER_COLUMNS}) VALUES ({_VALUES})", [item_row(i) for i in items]
        )

    async def supersede_ledger_items(self, ids: Sequence[str], by: str, seq: int) -> None:
        """Mark ``ids`` replaced by item ``by``, stated in the message at ``seq``."""
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            await self.conn.execute(
                "UPDATE ledger_items SET superseded_seq = ?, superseded_by = ?"
                f" WHERE id IN ({','.join('?' * len(chunk))})",
                (seq, by, *chunk),
            )

    async def supersede_ledger_batch(self, supersessions: Sequence[tuple[str, str, int]]) -> None:
        await self.conn.executemany(
            "UPDATE ledger_items SET superseded_seq = ?, superseded_by = ? WHERE id = ?",
            [(seq, by, item_id) for item_id, by, seq in supersessions],
        )

    async def set_ledger_state(self, conversation_id: str, item_id: str, state: str) -> LedgerItem | None:
        row = await self._one(
            f"UPDATE ledger_items SET state = ? WHERE conversation_id = ? AND id = ? RETURNING {LEDGER_COLUMNS}",
            (state, conversation_id, item_id),
        )
        return LedgerItem(*row) if row else None

    async def set_ledger_upto(self, conversation_id: str, seq: int) -> None:
        await self.conn.execute("UPDATE conversations SET ledger_upto = ? WHERE id = ?", (seq, conversation_id))

    async def _copy_ledger(self, source_id: str, target_id: str, count: int) -> None:
        """The items of ``source_id`` stated before ``count`` into its fork ``target_id``, whose messages
        [0, count) are copied already."""
        # What of the parent was read: its watermark, up to the fork point (the fork reads the rest itself).
        await self.conn.execute(
            "UPDATE conversations SET ledger_upto = MIN(?, (SELECT ledger_upto FROM conversations WHERE id = ?))"
            " WHERE id = ?",
            (count, source_id, target_id),
        )
        items = await self.ledger(source_id, include_superseded=True)
        if not any(i.seq < count for i in items):
            return
        rows = await self._all("SELECT seq, id FROM messages WHERE conversation_id = ? AND seq < ?", (target_id, count))
        await self.conn.executemany(
            f"INSERT INTO ledger_items ({LEDGER_COLUMNS}) VALUES ({_VALUES})",
            forked(items, target_id, {int(seq): int(i) for seq, i in rows}, count),
        )

    async def _truncate_ledger(self, conversation_id: str, start: int) -> None:
        """Remove the items stated from message ``start`` on; those they superseded are current again."""
        await self.conn.execute(
            "UPDATE conversations SET ledger_upto = MIN(ledger_upto, ?) WHERE id = ?", (start, conversation_id)
        )
        await self.conn.execute(
            "UPDATE ledger_items SET superseded_seq = NULL, superseded_by = NULL"
            " WHERE conversation_id = ? AND superseded_seq >= ?",
            (conversation_id, start),
        )
        await self.conn.execute(
            "DELETE FROM ledger_items WHERE conversation_id = ? AND seq >= ?", (conversation_id, start)
        )
