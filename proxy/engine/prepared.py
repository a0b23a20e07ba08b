"""What ``prepare`` hands the wire layer: the messages to forward, and what was sent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from proxy.dialects import CHAT, Dialect
from proxy.engine.budget import Sizes
from proxy.engine.render import summary_tokens
from proxy.store.records import SummaryRecord
from proxy.types import Messages

# none: nothing done; scheduled: a background compaction follows the response; inline: compacted first;
# deferred: the inline compaction ran past its deadline and goes on in the background; evicted: material
# left the forwarded view to fit.
Compaction = Literal["none", "scheduled", "inline", "deferred", "evicted"]


@dataclass(frozen=True)
class Sent:
    """What one request forwarded, for headers and the admin views."""

    summaries: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    first_raw: int = 0
    dropped: int = 0  # raw messages before first_raw that were neither summarised nor forwarded
    recalled: tuple[int, ...] = ()  # message ids quoted by auto-recall
    tokens: int = 0
    ledger: tuple[str, ...] = ()  # ids of the standing instructions forwarded


@dataclass(frozen=True)
class View:
    """The stored context of a request's first ``count`` messages: summaries, then raw ``[upto, count)``."""

    summaries: list[SummaryRecord]
    upto: int
    roles: list[str]  # of raw messages [offset, count): the newest ones only, when that was enough to read
    costs: list[int]
    required: int  # first seq that must be forwarded raw (``assemble.required_start``)
    dialect: Dialect  # the wire format of the request, in which the summaries are rendered
    offset: int = -1  # first seq ``roles`` and ``costs`` cover (-1: ``upto``, all of the raw messages)
    raw_tokens: int = -1  # of all raw messages [upto, count) (-1: ``sum(costs)``)

    @property
    def start(self) -> int:
        return self.upto if self.offset < 0 else self.offset

    @property
    def complete(self) -> bool:
        """Whether ``roles`` and ``costs`` cover every raw message (what eviction needs)."""
        return self.start == self.upto

    @property
    def tokens(self) -> int:
        raw = sum(self.costs) if self.raw_tokens < 0 else self.raw_tokens
        return summary_tokens(self.summaries, self.dialect) + raw


@dataclass(frozen=True)
class Prepared:
    conversation_id: str | None
    messages: Messages
    tokens_sent: int
    tokens_forwarded: int
    compaction: Compaction
    budget: int
    recall: bool = False  # offer the recall tools with this request
    room: int = 0  # tokens still free for messages after the assembled context (the recall loop's budget)
    transcript_length: int = 0  # messages of the request after its instructions: what its recall may see
    sent: Sent = field(default_factory=Sent)
    sizes: Sizes | None = None
    tip_chain: str | None = None  # chain hash of the request's last message: the relayed answer follows it
    dialect: Dialect = CHAT  # the wire format of the request (and of the answer stored after it)
