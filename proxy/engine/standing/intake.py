"""One request's standing instructions on their way to the store (``proxy.engine.standing.flow``).

Its new messages are read in one worker thread call (their statements, and the language of those the
deterministic reader took nothing from: ``proxy.engine.standing.languages``), planned in another against the
ledger as read before the write transaction, and the transaction that appends the messages writes the plan
(and logs the languages the deterministic reader does not read). When that transaction finds the conversation
elsewhere than the plan assumed (another request appended, forked or changed the ledger meanwhile), it raises
``LedgerMoved`` with what it saw; the ingestor rolls back, plans again off the loop from that, and retries (as
it does for messages it must prepare: ``proxy.engine.ingest``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.dialects import Dialect
from proxy.engine.identity import Located
from proxy.engine.standing import languages
from proxy.engine.standing.flow import LedgerMoved, Plan, Said, apply, forked_basis, plan_off_loop, said_all
from proxy.engine.standing.ledger import Statement
from proxy.store.base import Reads, Writes
from proxy.store.records import LedgerItem
from proxy.types import Message


class Intake:
    """The statements of one request's new messages, by transcript index, and the plan of their items."""

    def __init__(self, dialect: Dialect, enabled: bool = True) -> None:
        self.dialect = dialect
        self.enabled = enabled  # the ingestor keeps the ledger (``Ingestor.standing``)
        self._unread: dict[int, Message] = {}
        self._stated: dict[int, tuple[str, list[Statement]]] = {}
        self._unread_in: dict[int, str] = {}  # index -> language the deterministic reader does not read
        self.plan: Plan | None = None

    def add(self, index: int, message: Message) -> None:
        """The transcript's message at ``index``, as it is forwarded (a document stored out of line sets
        nothing), to be read with the others."""
        if self.enabled:
            self._unread[index] = message

    async def read(self) -> None:
        """Read the messages added since the last call, in one worker thread call."""
        if self._unread:
            indices = sorted(self._unread)
            heard = await said_all(self.dialect, [self._unread.pop(i) for i in indices])
            for i, (role, statements, language) in zip(indices, heard, strict=True):
                self._stated[i] = (role, statements)
                if language is not None:
                    self._unread_in[i] = language

    def new(self, start: int, end: int) -> Said:
        return [self._stated.get(i, ("", [])) for i in range(start, end)]

    async def prepare(self, basis: Sequence[LedgerItem], start: int, end: int) -> None:
        """Plan the items of messages [start, end) against the open items ``basis``, off the loop."""
        if self.enabled:
            await self.read()
            self.plan = await plan_off_loop(basis, start, self.new(start, end))

    async def guess(self, q: Reads, located: Located, end: int, bound: Callable[[int], int] | None = None) -> None:
        """The first plan, before the write transaction, for the conversation ``locate`` found: of the first
        chunk of its new messages up to ``end``, those from a seq to ``bound(seq)`` (``proxy.engine.chunks``;
        None: to ``end``). The transaction decides again: if it decides otherwise, ``write`` says so."""
        if not self.enabled:
            return
        conversation, action = located.conversation, located.action(end)
        bound = bound or (lambda _start: end)
        if conversation is None:
            await self.prepare([], 0, bound(0))
        elif action == "append":
            start = conversation.message_count
            await self.prepare(await q.ledger(conversation.id), start, bound(start))
        elif action == "fork":
            items = await q.ledger(conversation.id, include_superseded=True) if located.common else []
            await self.prepare(forked_basis(items, located.common), located.common, bound(located.common))

    async def follow(self, q: Reads, conversation_id: str, start: int, end: int) -> None:
        """The plan of the next chunk, messages [start, end), once the previous one committed: against the
        open items as stored now (``write`` finds out if another request changed them meanwhile)."""
        if self.enabled and any(self._stated.get(i, ("", [None]))[1] for i in range(start, end)):
            await self.prepare(await q.ledger(conversation_id), start, end)

    async def write(self, tx: Writes, conversation_id: str, start: int, end: int) -> int:
        """In the transaction that appended messages [start, end): write their plan (``flow.apply``). Raises
        ``LedgerMoved`` when the plan was made for other messages or another ledger. Returns items added.
        Messages in a language the deterministic reader does not read are logged (``languages.notice``)."""
        if not self.enabled:
            return 0
        planned = self.plan
        if planned is None or planned.start != start or planned.count != end - start:
            if all(i in self._stated and not self._stated[i][1] for i in range(start, end)):
                self._notice(conversation_id, start, end)
                return 0  # read, and nothing said: nothing to plan
            raise LedgerMoved(await tx.ledger(conversation_id), start)
        added = await apply(tx, conversation_id, start, planned)
        self._notice(conversation_id, start, end)
        return added

    def _notice(self, conversation_id: str, start: int, end: int) -> None:
        if self._unread_in:
            languages.notice(conversation_id, (self._unread_in.get(i) for i in range(start, end)))
