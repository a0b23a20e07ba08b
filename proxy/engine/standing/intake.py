"""A run of stored messages' standing instructions on their way to the ledger (``proxy.engine.standing.flow``).

The messages are read in one worker thread call (their statements, and the language of those the
deterministic reader took nothing from: ``proxy.engine.standing.languages``), planned in another against the
ledger as read before the write transaction, and the transaction that moves the conversation's watermark over
them writes the plan (and logs the languages the deterministic reader does not read). When that transaction
finds the ledger elsewhere than the plan assumed (a summariser's items, a pin, meanwhile), it raises
``LedgerMoved`` with what it saw; the reader (``proxy.engine.standing.reader``) plans again off the loop from
that, and retries.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.dialects import Dialect
from proxy.engine.standing import languages
from proxy.engine.standing.flow import LedgerMoved, Plan, Said, apply, plan_off_loop, said_all
from proxy.engine.standing.ledger import Statement
from proxy.store.base import Writes
from proxy.store.records import LedgerItem
from proxy.types import Message


class Intake:
    """The statements of a run of messages, by seq, and the plan of their items."""

    def __init__(self, dialect: Dialect, enabled: bool = True) -> None:
        self.dialect = dialect
        self.enabled = enabled  # the ledger is kept
        self._unread: dict[int, Message] = {}
        self._stated: dict[int, tuple[str, list[Statement]]] = {}
        self._unread_in: dict[int, str] = {}  # index -> language the deterministic reader does not read
        self.plan: Plan | None = None

    def add(self, index: int, message: Message) -> None:
        """The message at ``index``, as it is forwarded (a document stored out of line sets nothing), to be
        read with the others."""
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

    def stated(self, start: int, end: int) -> bool:
        """Whether any of the messages [start, end) read so far says something."""
        return any(self._stated.get(i, ("", []))[1] for i in range(start, end))

    def new(self, start: int, end: int) -> Said:
        return [self._stated.get(i, ("", [])) for i in range(start, end)]

    async def prepare(self, basis: Sequence[LedgerItem], start: int, end: int) -> None:
        """Plan the items of messages [start, end) against the open items ``basis``, off the loop."""
        if self.enabled:
            await self.read()
            self.plan = await plan_off_loop(basis, start, self.new(start, end))

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
