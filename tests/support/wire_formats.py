"""Stored transcripts of the three wire formats, as real clients send them (Claude Code's Messages with
thinking and parallel tool calls, Codex's Responses items with encrypted reasoning), for the dialect tests."""

from __future__ import annotations

from typing import Any

SIGNATURE = "EqQBCkYIARgCKkD" + "x9Zq" * 200  # an opaque, long thinking signature: never read, always kept

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Which files mention the deploy key? The key id is K-7781."},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "PRIVATE-CHAIN: grep both folders at once.", "signature": SIGNATURE},
            {"type": "text", "text": "Searching both folders."},
            {"type": "tool_use", "id": "toolu_A", "name": "Grep", "input": {"pattern": "deploy", "path": "src"}},
            {"type": "tool_use", "id": "toolu_B", "name": "Grep", "input": {"pattern": "deploy", "path": "ops"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_A", "content": "src/deploy.py:3: KEY = load()"},
            {"type": "tool_result", "tool_use_id": "toolu_B", "content": [{"type": "text", "text": "ops/ci.yml:9"}]},
            {"type": "text", "text": "<system-reminder>Files may have changed.</system-reminder>"},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "RDAT" * 50},
            {"type": "text", "text": "Two files: src/deploy.py and ops/ci.yml."},
        ],
    },
    {"role": "user", "content": [{"type": "text", "text": "Open ops/ci.yml.", "cache_control": {"type": "ephemeral"}}]},
]
MESSAGES_ROLES = ["user", "assistant", "tool", "assistant", "user"]

RESPONSES: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the tests; ticket T-4410."}]},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "PRIVATE-SUMMARY: two commands at once."}],
        "encrypted_content": "gAAAAAB" + "enc" * 300,
    },
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": '{"cmd":"pytest -q"}'},
    {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "shell", "arguments": '{"cmd":"ruff ."}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "3 passed"},
    {"type": "function_call_output", "call_id": "call_2", "output": "All checks passed!"},
    {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAAAB" + "xyz" * 100},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Tests pass, lint clean."}]},
    {"role": "user", "content": "Now commit it."},  # an easy input message: no "type"
]
RESPONSES_ROLES = [
    "developer",
    "user",
    "reasoning",
    "tool_call",
    "tool_call",
    "tool",
    "tool",
    "reasoning",
    "assistant",
    "user",
]

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Use tools."},
    {"role": "user", "content": "Weather in Oslo and Bergen?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Bergen"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "4C"},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "7C"}]},
    {"role": "assistant", "content": "Oslo 4C, Bergen 7C."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Thanks!"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        ],
    },
]
