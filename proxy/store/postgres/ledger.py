"""The PostgreSQL store's ledger of standing instructions (``lcm.ledger_items``, ``proxy.store.ledger``): its
read (``Reads.ledger``), mixed into ``postgres.reads.PostgresReads``, and its writes, mixed into the write
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from proxy.store.ledger import LEDGER_COLUMNS, forked, item_row
from proxy.store.records import LedgerItem

_VALUES = ", ".join(["%s"] * len(LEDGER_COLUMNS.split(",")))


class PostgresLedgerReads:
    if TYPE_CHECKING:  # provided by ``postgres.reads.Session``

        async def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]: ...
        async def _one(self, sql: str, args: Sequence[Any] = ()) -> Any: ...
        async def _run(self, sql: str, args: Sequence[Any] = ()) -> int: ...

    async def ledger(
        self, conversation_id: str, include_superseded: bool = False, *, newest_superseded: int | None = None
    ) -> list[LedgerItem]:
        """The conversation's items by seq; without ``include_superseded`` only those no later statement
        replaced (dropped ones included: callers filter on ``LedgerItem.current``); with it and
        ``newest_superseded``, of the replaced ones only that many, the newest."""
        if include_superseded and newest_superseded is not None:
            rows = await self._all(
                f"SELECT {LEDGER_COLUMNS} FROM lcm.ledger_items WHERE conversation_id = %s AND superseded_seq IS NULL"
                f" UNION ALL SELECT * FROM (SELECT {LEDGER_COLUMNS} FROM lcm.ledger_items WHERE conversation_id = %s"
                f" AND superseded_seq IS NOT NULL ORDER BY seq DESC, id DESC LIMIT %s) AS newest ORDER BY seq, id",
                (conversation_id, conversation_id, newest_superseded),
            )
            return [LedgerItem(*r) for r in rows]
        # The open items alone through their own index (``ledger_items_open``: a literal condition, which a
        # partial index needs; a long conversation has replaced many more items than are open).
        open_only = "" if include_superseded else " AND superseded_seq IS NULL"
        rows = await self._all(
            f"SELECT {LEDGER_COLUMNS} FROM lcm.ledger_items WHERE conversation_id = %s{open_only} ORDER BY seq, id",
            (conversation_id,),
        )
        return [LedgerItem(*r) for r in rows]

    async def message_ids(self, conversation_id: str, start: int, end: int) -> dict[int, int]:
        """seq -> row id of the conversation's messages [start, end): what new items name."""
        rows = await self._all(
            "SELECT seq, id FROM lcm.messages WHERE conversation_id = %s AND seq >= %s AND seq < %s",
            (conversation_id, start, end),
        )
        return {int(seq): int(i) for seq, i in rows}


class PostgresLedgerWrites(PostgresLedgerReads):
    async def add_ledger_items(self, items: Sequence[LedgerItem]) -> None:
        await self._insert([item_row(i) for i in items])

    async def _insert(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            await self._run(
                f"INSERT INTO lcm.ledger_items ({LEDGER_COLUMNS}) VALUES {', '.join([f'({_VALUES})'] * len(chunk))}",
                [value for row in chunk for value in row],
            )

    async def supersede_ledger_items(self, ids: Sequence[str], by: str, seq: int) -> None:
        """Mark ``ids`` replaced by item ``by``, stated in the message at ``seq``."""
        await self._run(
            "UPDATE lcm.ledger_items SET superseded_seq = %s, superseded_by = %s WHERE id = ANY(%s::text[])",
            (seq, by, list(ids)),
        )

    async def supersede_ledger_batch(self, supersessions: Sequence[tuple[str, str, int]]) -> None:
        if supersessions:
            ids, bys, seqs = (list(column) for column in zip(*supersessions, strict=True))
            await self._run(
                "UPDATE lcm.ledger_items AS l SET superseded_seq = u.seq, superseded_by = u.by_id"
                " FROM unnest(%s::text[], %s::text[], %s::integer[]) AS u(id, by_id, seq) WHERE l.id = u.id",
                (ids, bys, seqs),
            )

    async def set_ledger_state(self, conversation_id: str, item_id: str, state: str) -> LedgerItem | None:
        row = await self._one(
            f"UPDATE lcm.ledger_items SET state = %s WHERE conversation_id = %s AND id = %s RETURNING {LEDGER_COLUMNS}",
            (state, conversation_id, item_id),
        )
        return LedgerItem(*row) if row else None

    async def set_ledger_upto(self, conversation_id: str, seq: int) -> None:
        await self._run("UPDATE lcm.conversations SET ledger_upto = %s WHERE id = %s", (seq, conversation_id))

    async def _copy_ledger(self, source_id: str, target_id: str, count: int) -> None:
        """The items of ``source_id`` stated before ``count`` into its fork ``target_id``, whose messages
        [0, count) are copied already."""
        # What of the parent was read: its watermark, up to the fork point (the fork reads the rest itself).
        await self._run(
            "UPDATE lcm.conversations SET ledger_upto = LEAST(%s, (SELECT ledger_upto FROM lcm.conversations"
            " WHERE id = %s)) WHERE id = %s",
            (count, source_id, target_id),
        )
        items = await self.ledger(source_id, include_superseded=True)
        if not any(i.seq < count for i in items):
            return
        rows = await self._all(
            "SELECT seq, id FROM lcm.messages WHERE conversation_id = %s AND seq < %s", (target_id, count)
        )
        await self._insert(forked(items, target_id, {int(seq): int(i) for seq, i in rows}, count))

    async def _truncate_ledger(self, conversation_id: str, start: int) -> None:
        """Remove the items stated from message ``start`` on; those they superseded are current again."""
        await self._run(
            "UPDATE lcm.conversations SET ledger_upto = LEAST(ledger_upto, %s) WHERE id = %s", (start, conversation_id)
        )
        await self._run(
            "UPDATE lcm.ledger_items SET superseded_seq = NULL, superseded_by = NULL"
            " WHERE conversation_id = %s AND superseded_seq >= %s",
            (conversation_id, start),
        )
        await self._run(
            "DELETE FROM lcm.ledger_items WHERE conversation_id = %s AND seq >= %s", (conversation_id, start)
        )
