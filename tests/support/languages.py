"""A conversation partly in languages the deterministic reader of standing instructions does not read (for the
tests of ``proxy.engine.standing.languages``, the admin API and the CLI): three German user messages, one French,
English ones, and short or mixed ones that name no language."""

from __future__ import annotations

from typing import Any

GERMAN = (
    "Antworte bitte ab jetzt immer auf Deutsch und halte die Antworten kurz.",
    "Das Budget für den Cluster liegt bei höchstens viertausend Euro im Monat.",
    "Bitte niemals direkt auf den Hauptzweig pushen, immer über einen Merge-Request.",
)
FRENCH = "Garde toujours les réponses courtes et écris les dates au format européen."
ENGLISH = "Please keep every estimate in metric units from now on."
SHORT = "ok danke"  # too few letters to name a language
MIXED = "Das Budget liegt bei 4200 Euro, never exceed it please ok"  # half German, half English: lingua is not sure
# Words of the messages above that must never reach a log line.
CONTENT_WORDS = ("Antworte", "Budget", "Hauptzweig", "réponses", "metric", "danke")


def turns() -> list[dict[str, Any]]:
    """The transcript, user and assistant turns alternating, ending on a user turn."""
    said = [GERMAN[0], ENGLISH, GERMAN[1], SHORT, FRENCH, MIXED, GERMAN[2]]
    out: list[dict[str, Any]] = []
    for i, text in enumerate(said):
        if i:
            out.append({"role": "assistant", "content": "Verstanden." if i % 2 else "Understood, noted."})
        out.append({"role": "user", "content": text})
    return out


# What the admin view counts for ``turns()``: the German and French user messages (the assistant's are not read
# for the user's standing word, and the short and mixed ones name no language).
NOT_READ = [{"language": "de", "messages": 3}, {"language": "fr", "messages": 1}]
