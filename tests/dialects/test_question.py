"""What a user message asks (``Dialect.question``), the query of auto-recall: in Messages, the user's own words,
not what Claude Code adds around them (its reminders and command notes open the message; the words come last)."""

from __future__ import annotations

from proxy.dialects import CHAT, MESSAGES


def test_claude_codes_notes_around_the_words_are_not_the_question() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>\nToday's date is 2026-11-29.\n</system-reminder>"},
            {
                "type": "text",
                "text": "<local-command-caveat>The command below was run directly.</local-command-caveat>",
            },
            {"type": "text", "text": "<command-name>/compact</command-name>"},
            {"type": "text", "text": "What is the deploy key id I gave you?"},
            {
                "type": "text",
                "text": "<system-reminder>\n<total_tokens>9 tokens left</total_tokens>\n</system-reminder>",
            },
        ],
    }
    assert MESSAGES.question(message) == "What is the deploy key id I gave you?"
    assert "command" in MESSAGES.text(message)  # the message's text keeps them: only the query leaves them out


def test_a_plain_message_is_its_own_question() -> None:
    assert MESSAGES.question({"role": "user", "content": "where is the key?"}) == "where is the key?"
    assert CHAT.question({"role": "user", "content": "where is the key?"}) == "where is the key?"


def test_a_long_reminder_block_is_never_stored_out_of_line() -> None:
    """Claude Code's reminders are instructions (CLAUDE.md, its skills list): forwarded verbatim, never a stub."""
    reminder = {"type": "text", "text": "<system-reminder>\n" + "skill: does things. " * 2000 + "</system-reminder>"}
    words = {"type": "text", "text": "pasted: " + "log line " * 2000}
    sites = MESSAGES.payload_sites({"role": "user", "content": [reminder, words]})
    assert [s.path for s in sites] == [["content", 1, "text"]]
