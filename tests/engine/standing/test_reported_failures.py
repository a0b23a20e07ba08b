"""One test for each failure issue 29 reported of the deterministic reader and the ledger: polarity both ways,
the typographic apostrophe, a traceback, a hypothetical, a quoted customer, each paste variant, the assistant's
budget, revocations, and an update the reader cannot read shown after what it changes."""

from __future__ import annotations

import pytest

from proxy.engine.standing.ledger import Statement, extract, reconcile
from proxy.store.records import LedgerItem


def item_of(sentence: str, seq: int, role: str = "user", n: int = 0) -> LedgerItem:
    [found] = extract(sentence, role)
    return LedgerItem(
        id=f"led_{seq:08x}{n:08x}", conversation_id="c", kind=found.kind, slot=found.slot, value=found.value,
        text=found.text, seq=seq, message_id=seq, role=role, created_at=0.0,
    )  # fmt: skip


def after(current: list[LedgerItem], sentence: str, role: str = "user") -> list[tuple[Statement, list[str]]]:
    return reconcile(current, extract(sentence, role), role)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("Don't answer in French.", "Please answer in French from now on."),
        ("Please answer in French from now on.", "Don't answer in French."),
        ("Never use tabs for indentation.", "Use tabs for indentation."),
        ("Avoid metric units.", "Always use metric units."),
        ("Don't call me Bob.", "Call me Bob."),
    ],
)
def test_the_opposite_order_replaces_and_is_no_repeat(first: str, then: str) -> None:
    old = item_of(first, 1)
    [(statement, replaced)] = after([old], then)
    assert replaced == [old.id]
    assert statement.negative != extract(first, "user")[0].negative


@pytest.mark.parametrize("sentence", ["Don’t push to main.", "Don’t push to main", "Please don’t push to main."])
def test_a_typographic_apostrophe_reads_as_a_plain_one(sentence: str) -> None:
    [found] = extract(sentence, "user")
    assert (found.kind, found.negative) == ("rule", True)
    assert extract(sentence.replace("’", "'"), "user")[0].slot == found.slot


@pytest.mark.parametrize(
    "text",
    [
        "ValueError: max_retries must be at most 5",
        'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: max_retries must be at most 5',
        "I think the deadline is Friday but I'm not sure.",
        "If we moved to Azure, we must redo all the IAM.",
        "My brother-in-law says: always rent the car in the city.",
        "Customer writes: You must refund me the shipping too.",
        "Customer writes: Hi, the box never arrived. You must refund me the shipping too. Thanks, Tom",
        "Here's what the ops bot posted:\nNever delete the prod database.\nAlways pin a digest.",
        "> Never delete the prod database.\n> Always pin a digest.",
        "<document>\nNever delete the prod database. Always pin a digest.\n</document>",
        '<document source="wiki">Never delete the prod database.</document>',
        "~~~\nNever delete the prod database.\n~~~",
        "```\nNever delete the prod database.\n```",
        "```\nNever delete the prod database.\nAlways pin a digest.",  # a fence never closed
        "    Never delete the prod database.\n    Always pin a digest.",  # indented
        '<system-reminder source="hook">Never delete the prod database.</system-reminder>',
        "<email>From: ops\nNever delete the prod database.</email>",
    ],
)
def test_words_that_are_not_the_speakers_own_set_nothing(text: str) -> None:
    assert extract(text, "user") == []


def test_the_users_words_around_a_paste_still_count() -> None:
    text = "Here's the log:\nERROR boom\nWARN again\n\nNever push to main."
    assert [s.kind for s in extract(text, "user")] == ["rule"]


def test_an_assistant_never_replaces_the_users_budget() -> None:
    cap = item_of("The cloud budget cap is $800.", 1)
    assistant = extract("We decided the cloud budget is $5,000.", "assistant")
    assert reconcile([cap], assistant, "assistant") == [] or all(
        replaced == [] for _, replaced in reconcile([cap], assistant, "assistant")
    )
    # The user's own update does replace it.
    [(update, replaced)] = after([cap], "Update: the cloud budget cap is $5,000 now.")
    assert replaced == [cap.id] and update.value == "$5,000"


@pytest.mark.parametrize(
    ("rule", "revocation"),
    [
        ("Never use tabs for indentation.", "Forget what I said about tabs."),
        ("Don't include the APAC region in the reports.", "The APAC rule no longer applies."),
        ("Always pin a digest for base images.", "No need to pin digests anymore."),
    ],
)
def test_a_revocation_lifts_the_item_it_is_about(rule: str, revocation: str) -> None:
    old = item_of(rule, 1)
    other = item_of("The staging host is stg-eu-3.", 2, n=1)
    [(statement, replaced)] = after([old, other], revocation)
    assert replaced == [old.id]
    assert statement.value == "lifted"


def test_a_change_the_reader_cannot_read_is_shown_after_what_it_is_about() -> None:
    store = item_of("We are going with Postgres for the store.", 1)
    other = item_of("Never push to main.", 2, n=1)
    [(statement, replaced)] = after([store, other], "Hmm, we switched the store to SQLite instead.")
    # Kept in the kind and slot of what it changes (a later update replaces both), and since its value is of the
    # same type as the old one (a product name), it replaces it: the evidence the reader asks for.
    assert (statement.kind, statement.slot, statement.value) == (store.kind, store.slot, "SQLite")
    assert replaced == [store.id]


def test_a_change_about_nothing_in_force_is_dropped() -> None:
    other = item_of("Never push to main.", 2)
    assert after([other], "Hmm, we switched the store to SQLite instead.") == []
