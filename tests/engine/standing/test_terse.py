"""The shapes of terse chat (``standing.terse``), the material a message quotes (``speech.own_prose``), number
words (``standing.values``), and the changes said in few words (``standing.changes``): each shape read in a
sentence of its own making, and the look-alikes that must set nothing."""

from __future__ import annotations

import pytest

from proxy.engine.standing.ledger import extract, reconcile
from proxy.engine.standing.speech import own_prose
from proxy.engine.standing.terse import one_off, terse
from proxy.engine.standing.values import digits
from proxy.store.records import LedgerItem


def item(sentence: str, seq: int) -> LedgerItem:
    [found] = extract(sentence, "user")
    return LedgerItem(f"led_{seq:016x}", "conv", found.kind, found.slot, found.value, found.text, seq, 100 + seq,
                      "user", 0.0)  # fmt: skip


SHAPES = [
    ("no tracking pixels in any newsletter", "rule", "never"),
    ("none at all in the release notes", "rule", "never"),
    ("'synergy' is off limits too", "rule", "never"),
    ("The payments module is not to be touched", "rule", "never"),
    ("us-east-2 only", "constraint", "us-east-2"),
    ("postgres only for persistence", "constraint", "postgres"),
    ("two screenshots per ticket max", "constraint", "2 screenshots per ticket max"),
    ("12 slides tops", "constraint", "12 slides tops"),
    ("Voice: dry and direct.", "preference", "dry and direct"),
    ("Invoice numbers have to be zero-padded", "rule", "zero-padded"),
    ("every heading is sentence case wherever it appears", "rule", "sentence"),
    ("I don't want to see lorem ipsum anywhere", "rule", "never"),
    ("today I want to get the onboarding flow merged", "goal", "get the onboarding flow merged"),
    ("goal for today: a green build on the release branch", "goal", "a green build on the release branch"),
    ("hey, I'm Noor, I run the night shift", "name", "Noor"),
    ("The approver for Acme is Lena Fischer.", "name", "Lena Fischer"),
]


@pytest.mark.parametrize(("sentence", "kind", "value"), SHAPES)
def test_each_shape_sets_an_item(sentence: str, kind: str, value: str) -> None:
    found = terse(digits(sentence))
    assert found is not None and found[0] == kind and found[2] == value


NOT_SHAPES = [
    "no problem, thanks",
    "no, that's the wrong file",
    "No worries at all.",
    "the tests are red",
    "Subject: quarterly numbers",
    "structure is: intro, body, outro",
    "My plan is to finish the parser first.",
    "I'm not sure yet",
    "it should be fine",
]


@pytest.mark.parametrize("sentence", NOT_SHAPES)
def test_look_alikes_set_nothing(sentence: str) -> None:
    assert terse(sentence) is None


@pytest.mark.parametrize(
    "sentence",
    ["don't load it", "Don't change anything yet", "switch it.", "just curious, don't merge it", "run it again"],
)
def test_an_order_about_the_thing_at_hand_is_a_one_off(sentence: str) -> None:
    assert one_off(sentence)
    assert extract(sentence, "user") == []


@pytest.mark.parametrize("sentence", ["never load it again", "Don't merge anything on Fridays, ever"])
def test_an_order_with_a_habit_is_not_a_one_off(sentence: str) -> None:
    assert not one_off(sentence)


def test_the_roles_of_two_parties_stay_apart() -> None:
    first, second = extract("The signatory for Acme is Lena Fischer. Brightline's signatory is Omar Haddad.", "user")
    assert (first.value, second.value) == ("Lena Fischer", "Omar Haddad")
    assert reconcile([item(first.text, 1)], [second])[0][1] == []  # the second names another party's signatory


PASTES = [
    "look how pushy theirs is:\n\n---\nYou must buy now! Always free shipping.\n---\n\nours should be calm",
    'a customer wrote this on the site: "You should never buy any other brand, always order the big box."',
    "this fired an hour ago:\n\n:fire: [AlertBot] SEV2 on eu-1\nFREEZE all changes to eu-1. Never restart the broker.\n\n"
    "not ours to handle",
    "the venue sent their house rules:\n\nGuests must leave by 11pm.\nNever bring outside food.\n\nfine by me",
]


@pytest.mark.parametrize("message", PASTES)
def test_pasted_and_quoted_material_sets_nothing(message: str) -> None:
    statements = extract(message, "user")
    assert all("must" not in s.text.lower() and "never" not in s.text.lower() for s in statements), statements


def test_the_speakers_own_words_around_a_paste_are_kept() -> None:
    prose = own_prose("the school sent this:\n\nPupils must not bring nuts.\n\nno nuts in any dinner either")
    assert "Pupils" not in prose and "no nuts in any dinner either" in prose
    assert [s.value for s in extract("the school sent this:\n\nPupils must not bring nuts.\n\nno nuts in any dinner either",
                                     "user")] == ["never"]  # fmt: skip


def test_number_words_read_as_digits() -> None:
    assert digits("keep it under twenty-five minutes") == "keep it under 25 minutes"
    assert digits("no one pushes to main") == "no one pushes to main"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("keep each sprint review under 30 minutes", "sprint reviews are 45 minutes now"),
        ("Never deploy the billing service on Fridays.", "forget the billing deploy rule"),
        ("no emojis in release notes", "scratch the release notes emoji rule"),
    ],
)
def test_a_change_in_few_words_reaches_its_item(old: str, new: str) -> None:
    [first] = extract(old, "user")
    statements = extract(new, "user")
    assert statements, new
    changes = reconcile([item(first.text, 1)], statements)
    assert any(ids for _, ids in changes), (new, changes)


def test_a_sentence_labelled_with_its_kind_is_an_item_of_that_kind() -> None:
    [preference] = extract("USER PREFERENCE: User prefers one decisive recommendation over a list.", "user")
    [fact] = extract("FACT: The staging host is db-7.internal.", "user")
    assert (preference.kind, fact.kind) == ("preference", "name")
    [code] = extract("USER PREFERENCE: The user's contact code is QRT-4411.", "user")
    [update] = extract("USER PREFERENCE: User's contact code: ZZB-0042.", "user")
    assert reconcile([item(code.text, 1)], [update])[0][1] == ["led_0000000000000001"]  # same topic, same type
    assert reconcile([item(preference.text, 1)], [code])[0][1] == []  # two preferences, two topics


@pytest.mark.parametrize(
    ("sentence", "value"),
    [
        ("the upload size cap is 25 MB now, not 10", "25 MB"),
        ("standups are 15 mins each", "15 mins"),
        ("bump the retry budget to 7", "7"),
    ],
)
def test_a_quantity_said_of_a_named_thing_is_a_limit(sentence: str, value: str) -> None:
    found = terse(sentence)
    assert found is not None and found[0] == "constraint" and found[2] == value


def test_a_number_with_no_unit_said_of_someone_is_no_limit() -> None:
    assert terse("my daughter is 7") is None


def test_the_agents_decisions_and_rules_set_nothing() -> None:
    assert extract("We'll use PostgreSQL 16 for the store. Never push to main.", "assistant") == []
