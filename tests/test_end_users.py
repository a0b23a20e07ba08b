"""End users behind one key, and the admin key.

An app that serves many people through one proxy key names each of them (OpenAI's ``user`` field, or the
``X-LCM-User`` header): their conversations, recall and admin views are then kept apart as tenants' are,
even when they open with the same words (identity would otherwise make the second a continuation, or a fork,
of the first). The admin key (LiteLLM's ``general_settings.master_key``) may name any tenant under ``/lcm/``;
a tenant's own key may not.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from proxy.scopes import user_scope
from tests.support.cli import main
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy

ACME_KEY = "sk-proxy-acme-31f0aa"
OTHER_KEY = "sk-proxy-other-77c1bb"
MASTER_KEY = "sk-master-9d2e4f60"
OPENING = "Hello! I am planning a trip to Lisbon next month."
ALICE_SECRET = "passport P-ALICE-7731"


@pytest.fixture
def proxy(app_factory: Any) -> AppProxy:
    """In process: what is checked here is scopes and keys, which a socket changes nothing of."""
    keys = [{"key": ACME_KEY, "tenant": "acme"}, {"key": OTHER_KEY, "tenant": "other"}]
    return app_factory(api_keys=keys, master_key=MASTER_KEY)  # type: ignore[no-any-return]


def chat(proxy: AppProxy, key: str, messages: list[dict[str, Any]], **extra: Any) -> tuple[str, str]:
    """One request through the real SDK: the answer's text and the conversation the proxy stored it in."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, http_client=proxy.client)
    raw = client.chat.completions.with_raw_response.create(model="test-model", messages=messages, **extra)  # type: ignore[arg-type]
    return str(raw.parse().choices[0].message.content), raw.headers["x-lcm-conversation-id"]


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def admin(proxy: AppProxy, key: str, path: str, **params: str) -> httpx.Response:
    return proxy.client.get(f"{proxy.url}{path}", params=params, headers={"authorization": f"Bearer {key}"}, timeout=30)


def listed(proxy: AppProxy, key: str, **params: str) -> list[str]:
    response = admin(proxy, key, "/lcm/conversations", **params)
    assert response.status_code == 200, response.text
    return [c["id"] for c in response.json()["data"]]


@pytest.mark.parametrize("named_by", ["user-field", "header"])
def test_two_end_users_with_the_same_opening_never_cross(
    proxy: AppProxy, fake_upstream: FakeUpstream, named_by: str
) -> None:
    def as_user(user: str) -> dict[str, Any]:
        return {"user": user} if named_by == "user-field" else {"extra_headers": {"x-lcm-user": user}}

    opening = [{"role": "user", "content": OPENING}]
    answer, alice = chat(proxy, ACME_KEY, opening, **as_user("alice@example.com"))
    alice_turn = [*opening, {"role": "assistant", "content": answer}, {"role": "user", "content": ALICE_SECRET}]
    assert chat(proxy, ACME_KEY, alice_turn, **as_user("alice@example.com"))[1] == alice

    # Bob opens with the same words and gets the same (deterministic) answer: without end-user scopes his
    # transcript would continue Alice's conversation, then fork it at his second message.
    answer_bob, bob = chat(proxy, ACME_KEY, opening, **as_user("bob@example.com"))
    assert answer_bob == answer and bob != alice
    bob_turn = [*opening, {"role": "assistant", "content": answer}, {"role": "user", "content": "And the weather?"}]
    assert chat(proxy, ACME_KEY, bob_turn, **as_user("bob@example.com"))[1] == bob
    # What reached the model for Bob is his own transcript only.
    assert ALICE_SECRET not in str(fake_upstream.requests[-1].body["messages"])

    # Admin views, per user: each sees exactly their own conversation, not a fork of the other's.
    assert listed(proxy, ACME_KEY, user="alice@example.com") == [alice]
    assert listed(proxy, ACME_KEY, user="bob@example.com") == [bob]
    assert listed(proxy, ACME_KEY) == []  # the tenant's own scope holds no end user's conversation
    view = admin(proxy, ACME_KEY, f"/lcm/conversations/{bob}", user="bob@example.com").json()
    assert view["parent_id"] is None and view["message_count"] == 4
    for user in ("bob@example.com", None):
        params = {"user": user} if user else {}
        assert admin(proxy, ACME_KEY, f"/lcm/conversations/{alice}", **params).status_code == 404
        assert admin(proxy, ACME_KEY, f"/lcm/conversations/{alice}/messages", **params).status_code == 404
    # Search within Bob's scope never reaches Alice's words; within hers it does (the probe is not vacuous).
    grep = admin(proxy, ACME_KEY, f"/lcm/conversations/{bob}/grep", pattern="P-ALICE", user="bob@example.com")
    assert grep.status_code == 200 and "P-ALICE-7731" not in grep.text
    grep = admin(proxy, ACME_KEY, f"/lcm/conversations/{alice}/grep", pattern="P-ALICE", user="alice@example.com")
    assert grep.status_code == 200 and "P-ALICE-7731" in grep.text


def test_the_header_names_the_user_over_the_body(proxy: AppProxy) -> None:
    opening = [{"role": "user", "content": OPENING}]
    _, first = chat(proxy, ACME_KEY, opening, user="carol", extra_headers={"x-lcm-user": "dave"})
    assert listed(proxy, ACME_KEY, user="dave") == [first]
    assert listed(proxy, ACME_KEY, user="carol") == []


def test_an_empty_user_header_leaves_the_body_user_in_charge(proxy: AppProxy) -> None:
    # A client (or a gateway filling a header template) that sends X-LCM-User with no value names nobody: the
    # body's ``user`` still applies, as when the header is absent, and nothing is filed under the tenant.
    opening = [{"role": "user", "content": OPENING}]
    _, grace = chat(proxy, ACME_KEY, opening, user="grace", extra_headers={"x-lcm-user": ""})
    assert listed(proxy, ACME_KEY, user="grace") == [grace]
    assert listed(proxy, ACME_KEY) == []
    # The admin views read it the same way: an empty header leaves ``?user=`` in charge.
    response = proxy.client.get(
        f"{proxy.url}/lcm/conversations", params={"user": "grace"}, headers={**bearer(ACME_KEY), "x-lcm-user": ""}
    )
    assert response.status_code == 200 and [c["id"] for c in response.json()["data"]] == [grace]


def test_the_same_user_id_in_two_tenants_is_two_scopes(proxy: AppProxy) -> None:
    opening = [{"role": "user", "content": OPENING}]
    _, acme = chat(proxy, ACME_KEY, opening, user="erin")
    _, other = chat(proxy, OTHER_KEY, opening, user="erin")
    assert acme != other
    assert listed(proxy, ACME_KEY, user="erin") == [acme]
    assert listed(proxy, OTHER_KEY, user="erin") == [other]
    assert user_scope("acme", "erin") != user_scope("other", "erin")
    assert user_scope("acme", None) == "acme" and "erin" not in user_scope("acme", "erin")


def test_only_the_admin_key_names_another_tenant(proxy: AppProxy) -> None:
    opening = [{"role": "user", "content": OPENING}]
    _, acme = chat(proxy, ACME_KEY, opening)
    _, frank = chat(proxy, ACME_KEY, opening, user="frank")
    # The master key reads any tenant's conversations by naming it (and an end user in it).
    assert listed(proxy, MASTER_KEY, tenant="acme") == [acme]
    assert listed(proxy, MASTER_KEY, tenant="acme", user="frank") == [frank]
    assert admin(proxy, MASTER_KEY, f"/lcm/conversations/{acme}", tenant="acme").status_code == 200
    assert admin(proxy, MASTER_KEY, f"/lcm/conversations/{acme}").status_code == 404  # its own tenant: not there
    # A tenant's key naming another tenant is refused outright, and naming its own changes nothing.
    refused = admin(proxy, OTHER_KEY, "/lcm/conversations", tenant="acme")
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error" and refused.json()["error"]["param"] == "tenant"
    assert admin(proxy, OTHER_KEY, f"/lcm/conversations/{acme}", tenant="acme").status_code == 403
    assert listed(proxy, ACME_KEY, tenant="acme") == [acme]
    bad = admin(proxy, MASTER_KEY, "/lcm/conversations", tenant="../acme")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tenant"
    # Deleting follows the same rule: another tenant's key is refused, the master key names the scope.
    url = f"{proxy.url}/lcm/conversations/{frank}"
    refused = proxy.client.delete(
        url, params={"tenant": "acme", "user": "frank"}, headers=bearer(OTHER_KEY), timeout=30
    )
    assert refused.status_code == 403 and listed(proxy, ACME_KEY, user="frank") == [frank]
    assert (
        proxy.client.delete(url, params={"tenant": "acme"}, headers=bearer(MASTER_KEY), timeout=30).status_code == 404
    )
    deleted = proxy.client.delete(
        url, params={"tenant": "acme", "user": "frank"}, headers=bearer(MASTER_KEY), timeout=30
    )
    assert deleted.status_code == 200 and listed(proxy, ACME_KEY, user="frank") == []
    # The master key is also a chat key, of a tenant of its own.
    _, master = chat(proxy, MASTER_KEY, opening)
    assert master not in (acme, frank) and listed(proxy, MASTER_KEY) == [master]


def test_a_user_field_of_the_wrong_type_is_a_400_naming_it(proxy: AppProxy) -> None:
    response = proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "user": 5},
        headers={"authorization": f"Bearer {ACME_KEY}"},
        timeout=30,
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "user"


def test_the_cli_names_an_end_user_and_deletes_everything_of_theirs(proxy: AppProxy) -> None:
    """A privacy request for one end user: ``purge --tenant T --user U --yes`` deletes that user's
    conversations and nobody else's, reading the same scopes the chat requests wrote."""
    opening = [{"role": "user", "content": OPENING}]
    _, grace = chat(proxy, ACME_KEY, opening, user="grace")
    _, heidi = chat(proxy, ACME_KEY, opening, user="heidi")
    data = ["--data-dir", str(proxy.config.general_settings.data_dir)]
    listed_by_cli = main("conversations", *data, "--tenant", "acme", "--user", "grace")
    assert listed_by_cli.returncode == 0 and grace in listed_by_cli.stdout and heidi not in listed_by_cli.stdout
    lonely = main("conversations", *data, "--user", "grace")
    assert lonely.returncode == 2 and "--user needs --tenant" in lonely.stderr
    purged = main("purge", *data, "--tenant", "acme", "--user", "grace", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert listed(proxy, ACME_KEY, user="grace") == [] and listed(proxy, ACME_KEY, user="heidi") == [heidi]
    assert "grace" not in purged.stderr + purged.stdout  # the audit names scopes by hash, never the user id
