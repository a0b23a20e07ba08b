"""The ledger of standing instructions over the admin API: ``GET /lcm/conversations/{id}/ledger`` lists it with
the message each item came from, ``POST .../ledger/{item}`` pins, drops or restores one; another tenant's key
sees none of it and changes nothing; the listing says which languages of the conversation's user and system messages
the deterministic reader does not read. Items are planted through the store (``tests.support.ledger``)."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.store.location import Location
from tests.support.languages import NOT_READ, turns
from tests.support.ledger import BUDGET, OLD_BUDGET, RULE, TURNS, plant

ALICE = {"authorization": "Bearer sk-alice-0000000"}
BOB = {"authorization": "Bearer sk-bob-11111111"}
KEYS = [{"key": "sk-alice-0000000", "tenant": "alice"}, {"key": "sk-bob-11111111", "tenant": "bob"}]


def started(app_factory: Any, where: Location) -> tuple[Any, str, dict[int, str]]:
    """A proxy holding Alice's conversation of ``TURNS`` with the ledger planted: (proxy, id, {seq: msg id})."""
    proxy = app_factory(
        api_keys=KEYS, where=where, lcm={"standing_instructions": "off"}
    )  # items planted, not extracted
    response = proxy.client.post("/v1/chat/completions", json={"model": "test-model", "messages": TURNS}, headers=ALICE)
    assert response.status_code == 200, response.text
    conversation = response.headers["x-lcm-conversation-id"]
    asyncio.run(plant(proxy.config.general_settings.location(), conversation))
    messages = proxy.client.get(f"/lcm/conversations/{conversation}/messages", headers=ALICE).json()["data"]
    return proxy, conversation, {m["seq"]: m["id"] for m in messages}


def test_the_ledger_is_listed_with_its_sources_and_pinned_dropped_restored(app_factory: Any, where: Location) -> None:
    proxy, conversation, msg = started(app_factory, where)
    client, path = proxy.client, f"/lcm/conversations/{conversation}/ledger"
    rule = {
        "id": RULE, "kind": "rule", "slot": "push main", "value": "never", "text": "Never push to main.", "seq": 0,
        "message_id": msg[0], "role": "user", "created_at": 1_700_000_000.0, "state": "active",
        "superseded_seq": None, "superseded_by": None,
    }  # fmt: skip
    budget = {**rule, "id": BUDGET, "kind": "constraint", "slot": "budget", "value": "$500",
              "text": "Quick update: keep spend under $500.", "seq": 4, "message_id": msg[4]}  # fmt: skip
    old_budget = {**budget, "id": OLD_BUDGET, "value": "$800", "text": "The budget cap is $800.", "seq": 2,
                  "message_id": msg[2], "superseded_seq": 4, "superseded_by": BUDGET}  # fmt: skip

    listed = client.get(path, headers=ALICE)
    # Every message of the conversation was looked at for its language (its turns and the answer relayed).
    languages = {"deterministic_reader": ["en"], "not_read": [], "scanned_from_seq": 0, "scanned_messages": 6}
    assert listed.status_code == 200
    assert listed.json() == {"object": "list", "data": [rule, budget], "languages": languages}
    everything = client.get(path, params={"all": "true"}, headers=ALICE).json()["data"]
    assert everything == [rule, old_budget, budget]

    pinned = client.post(f"{path}/{RULE}", json={"state": "pinned"}, headers=ALICE)
    assert pinned.status_code == 200 and pinned.json() == {**rule, "state": "pinned"}
    dropped = client.post(f"{path}/{BUDGET}", json={"state": "dropped"}, headers=ALICE)
    assert dropped.status_code == 200 and dropped.json() == {**budget, "state": "dropped"}
    # A dropped item is still listed (and said to be dropped): the user can restore it.
    assert client.get(path, headers=ALICE).json()["data"] == [
        {**rule, "state": "pinned"},
        {**budget, "state": "dropped"},
    ]
    restored = client.post(f"{path}/{BUDGET}", json={"state": "active"}, headers=ALICE)
    assert restored.status_code == 200 and restored.json() == budget


def test_a_bad_state_or_body_names_the_parameter_and_unknown_ids_are_not_found(
    app_factory: Any, where: Location
) -> None:
    proxy, conversation, _ = started(app_factory, where)
    client, path = proxy.client, f"/lcm/conversations/{conversation}/ledger"
    for body, code in (
        ({"state": "forgotten"}, "invalid_value"),
        ({"state": 1}, "invalid_value"),
        ({}, "missing_required_parameter"),
        (["pinned"], "missing_required_parameter"),
    ):
        refused = client.post(f"{path}/{RULE}", json=body, headers=ALICE)
        assert refused.status_code == 400, (body, refused.text)
        assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == ("state", code)
    refused = client.get(path, params={"all": "yes"}, headers=ALICE)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "all"
    for method, url in (
        ("GET", "/lcm/conversations/conv_0123456789abcdef/ledger"),
        ("POST", f"/lcm/conversations/conv_0123456789abcdef/ledger/{RULE}"),
        ("POST", f"{path}/led_ffffffffffffffff"),
    ):
        missing = client.request(method, url, json={"state": "pinned"}, headers=ALICE)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", missing.text
    assert client.get(path).status_code == 401
    assert [i["state"] for i in client.get(path, params={"all": "true"}, headers=ALICE).json()["data"]] == [
        "active"
    ] * 3


def test_another_tenant_neither_sees_nor_changes_the_ledger(app_factory: Any, where: Location) -> None:
    proxy, conversation, _ = started(app_factory, where)
    client, path = proxy.client, f"/lcm/conversations/{conversation}/ledger"
    for params in ({}, {"all": "true"}):
        hidden = client.get(path, params=params, headers=BOB)
        assert hidden.status_code == 404 and "push" not in hidden.text
    for state in ("pinned", "dropped", "active"):
        refused = client.post(f"{path}/{RULE}", json={"state": state}, headers=BOB)
        assert refused.status_code == 404 and "push" not in refused.text
    # Bob's own conversation holds no item of Alice's: naming her item there finds nothing either.
    bob = client.post("/v1/chat/completions", json={"model": "test-model", "messages": TURNS}, headers=BOB)
    bob_path = f"/lcm/conversations/{bob.headers['x-lcm-conversation-id']}/ledger"
    assert client.get(bob_path, headers=BOB).json()["data"] == []
    assert client.post(f"{bob_path}/{RULE}", json={"state": "dropped"}, headers=BOB).status_code == 404
    assert [i["state"] for i in client.get(path, params={"all": "true"}, headers=ALICE).json()["data"]] == [
        "active"
    ] * 3


def test_what_the_conversation_sets_is_listed_as_ingest_extracted_it(app_factory: Any, where: Location) -> None:
    """With the ledger on (the default), the same turns give the items by themselves: the rule, and the budget
    superseded by its update in other words."""
    proxy = app_factory(api_keys=KEYS, where=where)
    response = proxy.client.post("/v1/chat/completions", json={"model": "test-model", "messages": TURNS}, headers=ALICE)
    path = f"/lcm/conversations/{response.headers['x-lcm-conversation-id']}/ledger"
    current = proxy.client.get(path, headers=ALICE).json()["data"]
    assert [(i["kind"], i["text"], i["seq"]) for i in current] == [
        ("rule", "Never push to main.", 0),
        ("constraint", "Quick update: keep spend under $500.", 4),
    ]
    everything = proxy.client.get(path, params={"all": "true"}, headers=ALICE).json()["data"]
    (old,) = [i for i in everything if i["seq"] == 2]
    assert old["text"] == "The budget cap is $800." and old["superseded_seq"] == 4
    assert old["superseded_by"] == current[1]["id"]


def test_the_listing_names_the_languages_the_deterministic_reader_does_not_read(
    app_factory: Any, where: Location
) -> None:
    """Counted from the stored messages of a conversation ingested with the ledger on: its German and French user
    messages (not the assistant's, nor a short or a half-English one); the English one gave an item."""
    proxy = app_factory(api_keys=KEYS, where=where)
    transcript = turns()
    response = proxy.client.post("/v1/chat/completions", json={"model": "test-model", "messages": transcript},
                                 headers=ALICE)  # fmt: skip
    assert response.status_code == 200, response.text
    path = f"/lcm/conversations/{response.headers['x-lcm-conversation-id']}/ledger"
    for params in ({}, {"all": "true"}):
        listed = proxy.client.get(path, params=params, headers=ALICE).json()
        assert [i["text"] for i in listed["data"]][:1] == ["Please keep every estimate in metric units from now on."]
        assert listed["languages"] == {
            "deterministic_reader": ["en"], "not_read": NOT_READ, "scanned_from_seq": 0,
            "scanned_messages": len(transcript) + 1,  # and the answer the proxy relayed
        }  # fmt: skip
    assert proxy.client.get(path, headers=BOB).status_code == 404
