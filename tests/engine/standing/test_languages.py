"""The languages of standing instructions (``proxy.engine.standing.languages``): what the deterministic reader
reads, ``detect`` on the speaker's own prose (None when a text is short or lingua is not sure), the count the
admin view shows, and the log line that says, once per conversation and language, that messages in a language
the reader does not read set items only through the summary model's proposals, with no content in it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from proxy.engine.standing import languages, ledger
from proxy.engine.standing.flow import heard
from tests.support.languages import CONTENT_WORDS, ENGLISH, FRENCH, GERMAN, MIXED, SHORT, turns

KEYS = [{"key": "sk-alice-0000000", "tenant": "alice"}]
ALICE = {"authorization": "Bearer sk-alice-0000000"}


def test_the_deterministic_reader_reads_english_only() -> None:
    assert frozenset({"en"}) == languages.READ
    assert languages.unread("de") and languages.unread("fr") and not languages.unread("en")
    assert not languages.unread(None)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        (GERMAN[0], "de"),
        (GERMAN[1], "de"),
        (FRENCH, "fr"),
        (ENGLISH, "en"),
        ("请始终用中文回答我的问题，谢谢你。", "zh"),
    ],
)
def test_a_sentence_is_detected_in_its_language(text: str, language: str) -> None:
    assert languages.detect(text) == language


@pytest.mark.parametrize("text", [SHORT, MIXED, "", "   ", "12345 67890 !!!", "ok", "kubectl get pods -n x"])
def test_a_short_or_mixed_fragment_names_no_language(text: str) -> None:
    assert languages.detect(text) is None


def test_only_the_speakers_own_prose_is_detected() -> None:
    pasted = f"Here is what the vendor wrote:\n{GERMAN[0]} {GERMAN[1]}\n\nThanks."
    fenced = f"```\n{FRENCH}\n{FRENCH}\n```\n{ENGLISH}"
    assert languages.spoken("user", pasted) is None  # the pasted German is not the user's; "Thanks." too short
    assert languages.spoken("user", fenced) == "en"
    assert languages.spoken("assistant", GERMAN[0]) is None  # not read for the user's standing word
    assert languages.spoken("tool", GERMAN[0]) is None
    assert languages.spoken("system", GERMAN[0]) == "de"


def test_the_input_is_bounded() -> None:
    # A megabyte of German after a paragraph of English: only the first characters of prose are looked at.
    assert languages.spoken("user", ENGLISH * 20 + " " + GERMAN[0] * 20_000) == "en"


def test_ingest_reads_the_language_only_of_what_the_reader_took_nothing_from() -> None:
    assert heard({"role": "user", "content": GERMAN[0]}).unread == "de"
    assert heard({"role": "user", "content": ENGLISH}).unread is None  # English: read
    assert heard({"role": "assistant", "content": GERMAN[0]}).unread is None


def test_the_tally_counts_user_and_system_messages_by_unread_language() -> None:
    said = [(m["role"], m["content"]) for m in turns()] + [("system", FRENCH), ("tool", FRENCH)]
    assert languages.tally(said) == {"de": 3, "fr": 2}
    assert languages.tally([("user", ENGLISH)]) == {}


def test_notice_logs_once_per_conversation_and_language_without_content(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lcm_proxy.standing"):
        languages.notice("conv_00000000000000aa", ["de", None, "en", "de", "fr"])
        languages.notice("conv_00000000000000aa", ["de", "fr"])
        languages.notice("conv_00000000000000bb", ["de"])
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "lcm_proxy.standing"]
    assert lines == [
        (logging.INFO, f"messages in {language} are not read by the deterministic reader; only the summary model's"
                       f" proposals can set standing instructions from them (conversation={conversation})")
        for conversation, language in (("conv_00000000000000aa", "de"), ("conv_00000000000000aa", "fr"),
                                       ("conv_00000000000000bb", "de"))
    ]  # fmt: skip


def test_a_conversation_ingested_through_the_app_is_logged_once(
    app_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = app_factory(api_keys=KEYS)
    transcript = turns()
    with caplog.at_level(logging.INFO, logger="lcm_proxy"):
        first = proxy.client.post("/v1/chat/completions", json={"model": "test-model", "messages": transcript[:3]},
                                  headers=ALICE)  # fmt: skip
        assert first.status_code == 200, first.text
        for end in (5, len(transcript), len(transcript)):  # appended to, then re-sent
            response = proxy.client.post("/v1/chat/completions", json={"model": "test-model",
                                         "messages": transcript[:end]}, headers=ALICE)  # fmt: skip
            assert response.status_code == 200, response.text
        conversation = first.headers["x-lcm-conversation-id"]
        # Far below its threshold the conversation is read when its ledger is asked for (here), not before.
        listed = proxy.client.get(f"/lcm/conversations/{conversation}/ledger", headers=ALICE)
        assert listed.status_code == 200, listed.text
        proxy.wait_idle()
    assert response.headers["x-lcm-conversation-id"] == conversation
    lines = [r.getMessage() for r in caplog.records if r.name == "lcm_proxy.standing"]
    assert lines == [
        f"messages in {language} are not read by the deterministic reader; only the summary model's proposals can"
        f" set standing instructions from them (conversation={conversation})"
        for language in ("de", "fr")
    ]
    every_line = "\n".join(r.getMessage() for r in caplog.records)
    assert not any(word in every_line for word in CONTENT_WORDS)


@pytest.mark.parametrize(
    "sentence",
    ["Eine Regel: Pusht niemals direkt auf main.", "Immer auf Deutsch antworten.", "Pas de tutoiement, jamais."],
)
def test_the_deterministic_reader_leaves_a_sentence_in_another_language_alone(sentence: str) -> None:
    assert languages.foreign(sentence)
    assert ledger.extract(sentence, "user") == []


@pytest.mark.parametrize(
    "sentence",
    [
        "The database password must never be logged.",  # lingua's fast mode calls it Italian
        "Brightline's signatory is Omar Haddad.",  # names are no language
        "no emojis pls",
        "eu-west-1 only",
    ],
)
def test_english_sentences_and_fragments_are_read(sentence: str) -> None:
    assert not languages.foreign(sentence)


def test_in_a_message_in_another_language_only_a_plainly_english_sentence_is_read() -> None:
    assert languages.foreign("Kein Deploy am Freitag, bitte.", "de")
    assert not languages.foreign("Never push to main without a review.", "de")
