"""Standing instructions the summary model reads (``proxy.engine.standing.proposals``), through the real engine
and a real SQLite file: the leaf pass asks for them at no extra call, the proxy keeps only what the user's own
words bear out, in any language, and records them in the transaction that swaps the summary in."""

from __future__ import annotations

import re
from typing import Any

from proxy.engine.engine import Budget
from proxy.store.location import Location
from tests.support.compaction import open_context_engine
from tests.support.engine import assistant, run, user

BUDGET = Budget(window=2000, output_reserve=300, tools=0)
FILLER = "Wir sind die Kalibrierungsnotizen für den Ostflügel noch einmal Zeile für Zeile durchgegangen. " * 3


class Reader:
    """A summary model that writes its notes, then lists what it read as standing: the user's German rule, a
    sentence from the pasted email (which the proxy must refuse) and one it made up (refused too)."""

    model = "summary-model"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
        self.prompts.append(user)
        lines = ["- Kalibrierung besprochen.", "STANDING:"]
        if "Pusht niemals direkt auf main" in user:
            lines.append("rule | Pusht niemals direkt auf main")
        if "Refund me the shipping" in user:
            lines.append("rule | You must refund me the shipping too")
        lines.append("constraint | The budget is 9000 euros")  # said by no one
        match = re.search(r"(led_[0-9a-f]{16}) \| rule \| .*niemals", user)
        if match and "Ab jetzt darfst du direkt auf main pushen" in user:
            lines.append(f"rule | Ab jetzt darfst du direkt auf main pushen | lifts {match.group(1)}")
        return "\n".join(lines)


def chat(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [user(f"Runde {i}: {FILLER}"), assistant(f"Runde {i} notiert.")]
    return out


def block_of(messages: list[dict[str, Any]]) -> str:
    """The standing-instructions block (the first message that opens with it, right after any instructions)."""
    for message in messages[:2]:
        text = str(message["content"])
        if text.startswith("<standing_instructions"):
            return text.split("</standing_instructions>")[0]
    return ""


def test_the_model_reads_a_german_rule_and_the_proxy_keeps_only_the_users_own_words(where: Location) -> None:
    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        reader = Reader()
        email = "Customer writes:\nRefund me the shipping too. You must refund me the shipping too.\n\nWas meinst du?"
        transcript = [
            {"role": "system", "content": "Du hilfst beim Ostflügel."},
            user("Eine Regel: Pusht niemals direkt auf main."), assistant("Verstanden."),
            user(email), assistant("Ich entwerfe eine Antwort."),
            *chat(24),
        ]  # fmt: skip
        prepared = await engine.prepare("t", transcript, BUDGET, reader)
        assert reader.prompts and "STANDING:" in reader.prompts[0]  # asked in the leaf pass's own call
        block = block_of(prepared.messages)
        assert "Pusht niemals direkt auf main." in block  # no English reader knows this sentence
        assert "refund me the shipping" not in block.lower()  # pasted: refused
        assert "9000" not in block  # in no message: refused

        # The lift, said later in German, named by the model with the item's id it was shown: the old rule goes.
        transcript += [user("Ab jetzt darfst du direkt auf main pushen."), assistant("Gut."), *chat(24)]
        prepared = await engine.prepare("t", transcript, BUDGET, reader)
        block = block_of(prepared.messages)
        assert "Ab jetzt darfst du direkt auf main pushen." in block
        assert "Pusht niemals" not in block
        assert any("<standing_so_far>" in p for p in reader.prompts[1:])
        await store.close()

    run(scenario())


def test_a_summariser_that_lists_nothing_changes_nothing(where: Location) -> None:
    """The deterministic reader stays: an English rule is kept whatever the model writes."""

    class Silent:
        model = "summary-model"

        async def complete(self, *, system: str, user: str, max_tokens: int, temperature: float) -> str:
            return "- Notes.\nSTANDING: none"

    async def scenario() -> None:
        engine, store, _ = await open_context_engine(where)
        transcript = [user("Never push to main."), assistant("OK."), *chat(24)]
        prepared = await engine.prepare("t", transcript, BUDGET, Silent())
        block = block_of(prepared.messages)
        assert "Never push to main." in block
        assert "STANDING" not in str(prepared.messages)  # the section never reaches a summary
        await store.close()

    run(scenario())
