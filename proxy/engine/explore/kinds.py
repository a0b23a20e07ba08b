"""Which explorer a stored payload gets: its declared mime type, then its file extension, then its content.

JSON, CSV, YAML and XML get a shape description, source code an outline, anything else (free text) an LLM
summary or excerpts. Sniffing the content reads a bounded prefix, never a whole multi-megabyte paste.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from pathlib import PurePath
from typing import Literal

from proxy.engine.explore.output import error_name

log = logging.getLogger("lcm_proxy.explore")

Kind = Literal["json", "csv", "yaml", "xml", "code", "text"]

SNIFF_LIMIT = 1 << 20  # structure is read from this prefix of very large inputs; counts use everything

_MIME_KINDS: dict[str, Kind] = {
    "application/json": "json", "application/x-ndjson": "json", "application/jsonl": "json",
    "text/csv": "csv", "text/tab-separated-values": "csv",
    "application/yaml": "yaml", "application/x-yaml": "yaml", "text/yaml": "yaml", "text/x-yaml": "yaml",
    "application/xml": "xml", "text/xml": "xml",
}  # fmt: skip
_EXT_KINDS: dict[str, Kind] = {
    ".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv", ".tsv": "csv",
    ".yaml": "yaml", ".yml": "yaml", ".xml": "xml",
}  # fmt: skip
LANGUAGES = {
    ".py": "Python", ".ts": "TypeScript", ".tsx": "TypeScript (TSX)", ".js": "JavaScript", ".jsx": "JavaScript",
    ".mjs": "JavaScript", ".go": "Go", ".rs": "Rust", ".java": "Java", ".kt": "Kotlin", ".c": "C",
    ".h": "C header", ".cc": "C++", ".cpp": "C++", ".hpp": "C++ header", ".cs": "C#", ".rb": "Ruby",
    ".php": "PHP", ".swift": "Swift", ".scala": "Scala", ".sh": "Shell", ".bash": "Shell", ".sql": "SQL",
    ".lua": "Lua", ".r": "R", ".m": "Objective-C/MATLAB",
}  # fmt: skip

_XML_ROOT = re.compile(r"<(?!html\b|!doctype\s+html)[A-Za-z_!][\w.:-]*[\s>/]", re.I)


def classify(name: str, mime: str | None, content: str) -> Kind:
    """Pick an exploration strategy: declared mime type, then file extension, then the content itself."""
    base = (mime or "").split(";")[0].strip().lower()
    if base in _MIME_KINDS:
        return _MIME_KINDS[base]
    if base.endswith("+json"):
        return "json"
    if base.endswith("+xml") and base != "application/xhtml+xml":
        return "xml"
    ext = PurePath(name or "").suffix.lower()
    if ext in _EXT_KINDS:
        return _EXT_KINDS[ext]
    if ext in LANGUAGES:
        return "code"
    head, end = content[:4096].lstrip(), content[-4096:].rstrip()
    if head[:1] in ("{", "[") and end[-1:] in ("}", "]"):
        if len(content) > SNIFF_LIMIT:
            return "json"  # too big to confirm cheaply; explore_structured falls back if it is not
        try:
            if isinstance(json.loads(content), dict | list):
                return "json"
        except Exception as error:
            log.debug(
                "classify: %d chars are not one JSON document (%s); trying JSON Lines", len(content), error_name(error)
            )
            # JSON Lines: the first two lines each hold an object.
            first = [line for line in itertools.islice(content.splitlines(), 50) if line.strip()][:2]
            if len(first) == 2 and all(_is_json_object(line) for line in first):
                return "json"
    if head.startswith("<?xml") or (_XML_ROOT.match(head) and end.endswith(">")):
        return "xml"
    return "text"


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except Exception as error:
        log.debug("classify: a %d-character line is no JSON value (%s)", len(line), error_name(error))
        return False
