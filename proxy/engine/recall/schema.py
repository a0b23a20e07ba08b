"""The recall tools as offered to the model: their names and JSON schemas, in the Chat Completions shape.

``lcm_grep`` searches, ``lcm_describe`` opens an id, ``lcm_expand`` goes one level down a summary and
``lcm_expand_query`` answers a question from the material behind summaries (``proxy.engine.recall.tools``
runs them).
"""

from __future__ import annotations

from typing import Any

RECALL_TOOL_NAMES = ("lcm_grep", "lcm_describe", "lcm_expand", "lcm_expand_query")
DEFAULT_CAP = 4000  # tokens

RECALL_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lcm_grep",
            "description": (
                "Search this conversation's full history (older turns are summarised in <summary> blocks; large "
                "files and tool outputs are stored out of line). Returns matching messages, summaries and stored "
                "files with ids to open with lcm_describe or lcm_expand."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression, or words for full_text mode."},
                    "mode": {"type": "string", "enum": ["regex", "full_text"], "default": "regex"},
                    "scope": {"type": "string", "enum": ["all", "messages", "summaries", "files"], "default": "all"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
                },
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lcm_describe",
            "description": (
                "Open an id from a <summary>, a stub ([LCM File: file_…], [LCM Tool Output: file_…]) or an "
                "lcm_grep result: a summary's content and lineage, a stored file's content (by line range), or "
                "one message."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "sum_…, file_… or msg_…"},
                    "start_line": {"type": "integer", "minimum": 1, "description": "Files: first line (1-based)."},
                    "end_line": {"type": "integer", "minimum": 1, "description": "Files: last line, inclusive."},
                    "max_bytes": {"type": "integer", "minimum": 100, "maximum": 200000, "default": 20000},
                },
                "required": ["id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lcm_expand",
            "description": "Go one level down a summary: its child summaries, or the original messages it covers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "A summary id (sum_…)."},
                    "token_cap": {"type": "integer", "minimum": 100, "maximum": 20000, "default": DEFAULT_CAP},
                },
                "required": ["id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lcm_expand_query",
            "description": (
                "Answer a question from the original material behind summaries: give summary ids, or a query to "
                "find them. Returns a focused answer that cites the ids it used."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "description": "The question to answer."},
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "query": {"type": "string", "description": "Full-text query used when no ids are given."},
                    "token_cap": {"type": "integer", "minimum": 500, "maximum": 30000, "default": 8000},
                },
                "required": ["prompt"],
            },
        },
    },
]
