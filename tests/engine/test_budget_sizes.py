"""The budget's division of a message limit: the standing-instructions block outranks recalled excerpts."""

from __future__ import annotations

from proxy.config.lcm import LcmSettings
from proxy.engine import budget


def test_the_block_takes_the_recall_reserve_when_its_items_need_it() -> None:
    settings = LcmSettings()
    limit = 800
    share, room = budget.ledger_share(settings, limit), budget.ledger_room(settings, limit)
    reserve = budget.sizes(settings, limit).recall
    assert room == share + reserve > share and reserve > 0
    within = budget.sizes(settings, limit, ledger=share)
    assert (within.ledger, within.recall) == (share, reserve)  # within its share: the recall block keeps its own
    beyond = budget.sizes(settings, limit, ledger=share + reserve // 2)
    assert beyond.ledger == share + reserve // 2 and beyond.recall == reserve - reserve // 2
    capped = budget.sizes(settings, limit, ledger=10 * limit)
    assert (capped.ledger, capped.recall) == (room, 0)
    assert capped.context == limit - room


def test_without_a_ledger_share_there_is_no_room() -> None:
    off = LcmSettings(standing_instructions="off")
    assert budget.ledger_room(off, 800) == 0
    assert budget.sizes(off, 800, ledger=500).ledger == 0
