"""``lcm-proxy ledger`` and the "Standing instructions" section of ``lcm-proxy show``, in this process, on both
stores: each item with the message it came from, pinned and dropped ones marked; pin, drop and restore; the exit
statuses of the other operator commands. Items are planted through the store (``tests.support.ledger``); the
languages the deterministic reader does not read are counted from a conversation ingested through the app."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.store.location import Location
from tests.support.cli import main
from tests.support.languages import NOT_READ, turns
from tests.support.ledger import BUDGET, OLD_BUDGET, RULE, TURNS, plant

KEYS = [{"key": "sk-alice-0000000", "tenant": "alice"}, {"key": "sk-bob-11111111", "tenant": "bob"}]
RULE_LINE = f"[rule] Never push to main. (msg 0, {RULE}"
BUDGET_LINE = f"[constraint] Quick update: keep spend under $500. (msg 4, {BUDGET}"


@pytest.fixture
def stored(app_factory: Any, where: Location, isolated_env: dict[str, str]) -> tuple[Any, str, str]:
    """(run ``lcm-proxy`` on the store, Alice's conversation with the ledger planted, one without a ledger)."""
    proxy = app_factory(
        api_keys=KEYS, where=where, lcm={"standing_instructions": "off"}
    )  # items planted, not extracted
    ids = []
    for headers in ({"authorization": "Bearer sk-alice-0000000"}, {"authorization": "Bearer sk-bob-11111111"}):
        response = proxy.client.post(
            "/v1/chat/completions", json={"model": "test-model", "messages": TURNS}, headers=headers
        )
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-lcm-conversation-id"])
    location = proxy.config.general_settings.location()
    asyncio.run(plant(location, ids[0]))
    store = ["--data-dir", str(location.data_dir)]
    store += ["--database-url", location.database_url] if location.database_url else []

    def cli(*args: str) -> Any:
        return main(*args, *store, env=isolated_env)

    return cli, ids[0], ids[1]


def test_show_lists_the_standing_instructions_in_a_section_of_their_own(stored: tuple[Any, str, str]) -> None:
    cli, conversation, plain = stored
    shown = cli("show", conversation)
    assert shown.returncode == 0, shown.stderr
    section = shown.stdout.split("\n\nStanding instructions:\n", 1)[1].split("\n\n", 1)
    assert section[0] == f"  {RULE_LINE})\n  {BUDGET_LINE})"
    assert section[1].startswith("seq  role") and "Quick update: keep spend under $500." in section[1]
    without = cli("show", plain)
    assert without.returncode == 0 and "Standing instructions" not in without.stdout
    assert without.stdout.startswith(f"conversation {plain}\n") and "\n\nseq  role" in without.stdout


def test_the_ledger_command_lists_pins_drops_and_restores(stored: tuple[Any, str, str]) -> None:
    cli, conversation, plain = stored
    listed = cli("ledger", conversation)
    assert (listed.returncode, listed.stdout) == (0, f"  {RULE_LINE})\n  {BUDGET_LINE})\n"), listed.stderr
    everything = cli("ledger", conversation, "--all").stdout.splitlines()
    assert (
        everything[1]
        == f"  [constraint] The budget cap is $800. (msg 2, {OLD_BUDGET}, superseded at msg 4 by {BUDGET})"
    )
    assert len(everything) == 3

    pinned = cli("ledger", conversation, "--pin", RULE)
    assert (pinned.returncode, pinned.stdout) == (0, f"pinned: {RULE_LINE}, pinned)\n")
    dropped = cli("ledger", conversation, "--drop", BUDGET)
    assert (dropped.returncode, dropped.stdout) == (0, f"dropped: {BUDGET_LINE}, dropped)\n")
    assert cli("ledger", conversation).stdout == f"  {RULE_LINE}, pinned)\n  {BUDGET_LINE}, dropped)\n"
    assert (
        f"Standing instructions:\n  {RULE_LINE}, pinned)\n  {BUDGET_LINE}, dropped)\n"
        in cli("show", conversation).stdout
    )
    restored = cli("ledger", conversation, "--restore", BUDGET)
    assert (restored.returncode, restored.stdout) == (0, f"active: {BUDGET_LINE})\n")
    assert cli("ledger", plain).stdout == f"no standing instructions in {plain}\n"


def test_unknown_ids_other_tenants_and_two_changes_are_refused(stored: tuple[Any, str, str]) -> None:
    cli, conversation, _ = stored
    show = cli("show", "conv_0123456789abcdef")
    ledger = cli("ledger", "conv_0123456789abcdef")
    assert ledger.returncode == show.returncode == 1
    assert ledger.stderr == show.stderr == "lcm-proxy: no conversation conv_0123456789abcdef\n"
    unknown = cli("ledger", conversation, "--drop", "led_ffffffffffffffff")
    assert unknown.returncode == 1 and "no ledger item led_ffffffffffffffff" in unknown.stderr
    for change in ("--pin", "--drop"):
        refused = cli("ledger", conversation, change, RULE, "--tenant", "bob")
        assert refused.returncode == 1 and refused.stdout == "" and "no conversation" in refused.stderr
    both = cli("ledger", conversation, "--pin", RULE, "--drop", BUDGET)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert cli("ledger", conversation).stdout == f"  {RULE_LINE})\n  {BUDGET_LINE})\n"  # nothing changed


def test_the_ledger_command_names_the_languages_the_deterministic_reader_does_not_read(
    app_factory: Any, where: Location, isolated_env: dict[str, str]
) -> None:
    proxy = app_factory(api_keys=KEYS, where=where)  # the ledger on: what ingest reads, as it reads it
    headers = {"authorization": "Bearer sk-alice-0000000"}
    response = proxy.client.post(
        "/v1/chat/completions", json={"model": "test-model", "messages": turns()}, headers=headers
    )
    assert response.status_code == 200, response.text
    conversation = response.headers["x-lcm-conversation-id"]
    location = proxy.config.general_settings.location()
    store = ["--data-dir", str(location.data_dir)]
    store += ["--database-url", location.database_url] if location.database_url else []

    listed = main("ledger", conversation, *store, env=isolated_env)
    assert listed.returncode == 0, listed.stderr
    items, _, languages = listed.stdout.partition("\n\n")
    assert "[preference] Please keep every estimate in metric units from now on." in items
    assert NOT_READ == [{"language": "de", "messages": 3}, {"language": "fr", "messages": 1}]
    assert languages == (
        "Languages the deterministic reader does not read (it reads en; only the summary model's proposals set"
        " items from these):\n"
        "  de: 3 messages not read by the deterministic reader\n"
        "  fr: 1 message not read by the deterministic reader\n"
    )
    shown = main("show", conversation, *store, env=isolated_env)  # show lists the items, not the languages
    assert shown.returncode == 0 and "deterministic reader" not in shown.stdout
