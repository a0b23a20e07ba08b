"""The ledger at work (proxy/engine/standing.py): which items a request forwards, and what goes stale."""

from __future__ import annotations

from proxy.engine.standing import MARKER, Standing
from proxy.store.records import LedgerItem, SummaryRecord


def item(n: int, kind: str, text: str, value: str, seq: int, **kw: object) -> LedgerItem:
    return LedgerItem(
        id=f"led_{n:016x}", conversation_id="c", kind=kind, slot=kw.pop("slot", f"s{n}"), value=value,  # type: ignore[arg-type]
        text=text, seq=seq, message_id=100 + seq, role="user", created_at=0.0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


BUDGET_OLD = item(1, "constraint", "The budget cap is $800.", "$800", 3, superseded_seq=40, superseded_by="led_2")
BUDGET_NEW = item(2, "constraint", "Quick update: keep spend under five hundred dollars.", "five hundred dollars", 40)
PUSH = item(3, "rule", "Never push to main.", "never", 5)
TRAVEL = item(4, "constraint", "The travel budget is $800 too.", "$800", 7)
DROPPED = item(5, "preference", "Answer in French.", "French", 9, state="dropped")


def test_the_block_holds_current_items_no_longer_forwarded_raw() -> None:
    standing = Standing.of([BUDGET_OLD, PUSH, TRAVEL, DROPPED, BUDGET_NEW])
    block, ids = standing.block(first_raw=30, room=500)
    assert ids == (PUSH.id, TRAVEL.id)  # the budget update (seq 40) is still forwarded raw; stale and dropped never
    assert "Never push to main." in block and "$800 too" in block and "French" not in block
    block, ids = standing.block(first_raw=41, room=500)
    assert ids == (PUSH.id, TRAVEL.id, BUDGET_NEW.id)  # source order: the block grows at its end
    assert standing.block(first_raw=41, room=500)[0] == block  # byte-stable
    assert standing.block(first_raw=0, room=500) == ("", ())


def test_superseded_words_are_masked_but_a_value_another_item_holds_is_not() -> None:
    standing = Standing.of([BUDGET_OLD, PUSH, BUDGET_NEW])
    assert standing.mask("- user: The budget cap is $800. Then lunch.") == f"- user: {MARKER} Then lunch."
    assert standing.mask("We said $800, not $8000.") == f"We said {MARKER}, not $8000."
    # A rule's value is a polarity ("never"): too common to mask anywhere; only its sentence would be.
    assert standing.mask("never mind") == "never mind"
    with_travel = Standing.of([BUDGET_OLD, PUSH, BUDGET_NEW, TRAVEL])
    assert with_travel.mask("Travel: $800.") == "Travel: $800."  # still the travel budget's current value
    assert Standing.of([PUSH]).mask("The budget cap is $800.") == "The budget cap is $800."


def test_summaries_are_masked_in_copies_and_the_stored_ones_stay() -> None:
    summary = SummaryRecord(
        id="sum_1", conversation_id="c", kind="leaf", depth=0, start_seq=0, end_seq=10,
        content="Facts stated (verbatim):\n- user: The budget cap is $800.", token_count=12, source_token_count=90,
        earliest_at=0.0, latest_at=1.0, descendant_count=0, file_ids=None, summarizer_model=None, escalation=0,
        created_at=0.0,
    )  # fmt: skip
    (masked,) = Standing.of([BUDGET_OLD, BUDGET_NEW]).masked_summaries([summary])
    assert masked.content == f"Facts stated (verbatim):\n- user: {MARKER}"
    assert summary.content.endswith("$800.")
    (same,) = Standing.of([PUSH]).masked_summaries([summary])
    assert same is summary
