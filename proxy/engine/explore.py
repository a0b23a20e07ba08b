"""Exploration summaries: the few hundred tokens that stand in for a stored huge payload.

A stubbed file is only useful if the model can decide from the stub whether to drill down, so the summary
describes *shape*: keys and array lengths for JSON/YAML, columns and row count for CSV, tags for XML,
imports and signatures for code. Those are extracted deterministically (cheap, reproducible, no upstream
call); only free text goes to an LLM, with an excerpt-based fallback whenever the LLM fails or babbles.

Summaries are shown to a model and stored, so every one goes through ``redact_secrets`` before it is
returned, and no explorer may raise or run unbounded on hostile input (binary junk, entity bombs, deeply
nested or self-referencing documents, multi-megabyte pastes).
"""

from __future__ import annotations

import ast
import asyncio
import csv
import io
import itertools
import json
import logging
import re
import string
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from pathlib import PurePath
from typing import Any, Literal, Protocol

import yaml

from proxy.engine.injection import remove_instruction_overrides
from proxy.redaction import redact_secrets as redact_secrets  # re-exported: render.py and the tests use it

log = logging.getLogger("lcm_proxy.explore")

Kind = Literal["json", "csv", "yaml", "xml", "code", "text"]

SNIFF_LIMIT = 1 << 20  # structure is read from this prefix of very large inputs; counts use everything
PARSE_LIMIT = 8 << 20  # whole-document parsers (JSON, XML) are C-fast up to here; beyond, fall back
MAX_DEPTH = 6  # shape descriptions stop here: deeper levels rarely help and may be hostile
MAX_NODES = 100_000  # depth measurement visits at most this many nodes (YAML aliases can form cycles)
MAX_OUTLINE_LINES = 60
YAML_LIMIT = 512 << 10  # PyYAML builds objects in Python (~2 s per MB even with the C parser)

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
_LANGUAGES = {
    ".py": "Python", ".ts": "TypeScript", ".tsx": "TypeScript (TSX)", ".js": "JavaScript", ".jsx": "JavaScript",
    ".mjs": "JavaScript", ".go": "Go", ".rs": "Rust", ".java": "Java", ".kt": "Kotlin", ".c": "C",
    ".h": "C header", ".cc": "C++", ".cpp": "C++", ".hpp": "C++ header", ".cs": "C#", ".rb": "Ruby",
    ".php": "PHP", ".swift": "Swift", ".scala": "Scala", ".sh": "Shell", ".bash": "Shell", ".sql": "SQL",
    ".lua": "Lua", ".r": "R", ".m": "Objective-C/MATLAB",
}  # fmt: skip

# --- redaction -------------------------------------------------------------------------------------------

# ``redact_secrets`` and its rule set live in proxy.redaction, shared with the upstream error boundary.

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _finish(lines: list[str], max_chars: int) -> str:
    # Redact before capping: a cap that splits a token could leave a prefix no pattern recognises.
    text = _CONTROL.sub("\ufffd", redact_secrets("\n".join(lines)))
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "…"


_TOKEN_CHARS = string.ascii_letters + string.digits + "_-+/=."
_BOUNDARY = re.compile(r"[^\w+/=.-]")


def _redacted_prefix(text: str, n: int) -> str:
    """Redacted text covering at least ``text[:n]`` when possible, without redacting all of a huge string.

    The window is wider than ``n`` (redaction may shrink it) and drops its trailing run of token characters:
    a token cut in the middle might be too short for its pattern, and once redaction has shrunk what comes
    before it, that fragment could land inside the first ``n`` characters.
    """
    window = text[: n + 256]
    if len(window) < len(text):
        window = window.rstrip(_TOKEN_CHARS) or window
    return redact_secrets(window)


def _clip(text: str, limit: int) -> str:
    text = _redacted_prefix(text, limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _name(error: BaseException) -> str:
    """What a log line says of a swallowed exception: its class, never its message (which may quote the input)."""
    return type(error).__name__


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


# --- classification ----------------------------------------------------------------------------------------

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
    if ext in _LANGUAGES:
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
                "classify: %d chars are not one JSON document (%s); trying JSON Lines", len(content), _name(error)
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
        log.debug("classify: a %d-character line is no JSON value (%s)", len(line), _name(error))
        return False


# --- structured data ---------------------------------------------------------------------------------------


_SCALARS = {bool: "boolean", int: "number", float: "number", str: "string", type(None): "null"}


def _kind_of(value: Any) -> str:
    if isinstance(value, dict | list):
        return "object" if isinstance(value, dict) else "array"
    return _SCALARS.get(type(value), type(value).__name__)  # YAML also yields dates, bytes, sets


def _type_name(value: Any) -> str:
    if isinstance(value, dict):
        return f"object, {len(value)} keys"
    if isinstance(value, list):
        kinds = sorted({_kind_of(v) for v in value[:20]})
        return f"array[{len(value)}]" + (f" of {' | '.join(kinds)}" if kinds else "")
    return _kind_of(value)


def _depth(root: Any) -> tuple[int, bool]:
    """Nesting depth without recursion; the flag says the node budget ran out (count is a lower bound)."""
    best, stack, seen = 0, [(root, 1)], 0
    while stack and seen < MAX_NODES:
        value, level = stack.pop()
        seen += 1
        if isinstance(value, dict | list):
            best = max(best, level)
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, level + 1) for child in itertools.islice(children, 1000))
    return best, bool(stack)


def _outline(value: Any, label: str, depth: int, out: list[str]) -> None:
    # Bounded by MAX_DEPTH and the line budget, so recursion is safe even on cyclic YAML. The format is
    # "name (type)" rather than "name: type" so that a key named "token" is not mistaken for a secret.
    if len(out) >= MAX_OUTLINE_LINES:
        return
    pad = "  " * depth
    if isinstance(value, list):
        objects = [v for v in value[:20] if isinstance(v, dict)]
        merged: dict[Any, Any] = {}
        for item in objects:
            for key, child in item.items():
                merged.setdefault(key, child)
        keys = f"; item keys: {', '.join(_clip(str(k), 40) for k in list(merged)[:30])}" if merged else ""
        out.append(f"{pad}{label} ({_type_name(value)}{keys})")
        if not merged and value and isinstance(value[0], list) and depth + 1 < MAX_DEPTH:
            _outline(value[0], "[0]", depth + 1, out)  # arrays of arrays: describe the first
        value = merged
    else:
        out.append(f"{pad}{label} ({_type_name(value)})")
    if not isinstance(value, dict) or depth + 1 >= MAX_DEPTH:
        return
    for key, child in itertools.islice(value.items(), 30):
        _outline(child, _clip(str(key), 60), depth + 1, out)
    if len(value) > 30 and len(out) < MAX_OUTLINE_LINES:
        out.append(f"{pad}  … {len(value) - 30} more keys")


def _describe_tree(title: str, value: Any) -> list[str]:
    depth, partial = _depth(value)
    lines = [title, f"Nesting depth: {'at least ' if partial else ''}{depth}", "Structure:"]
    _outline(value, "(root)", 1, lines)
    return lines


def _explore_json(content: str) -> list[str]:
    try:
        if len(content) <= PARSE_LIMIT:
            return _describe_tree("Kind: JSON document", json.loads(content))
    except Exception as error:
        log.debug("%d characters are no JSON document (%s); reading JSON Lines", len(content), _name(error))
    # JSON Lines: one value per line. Parse a prefix only; the record count still covers everything.
    records = [json.loads(line) for line in content[:SNIFF_LIMIT].splitlines()[:2000] if line.strip()]
    total = sum(1 for line in content.splitlines() if line.strip())
    lines = _describe_tree(f"Kind: JSON Lines, {total} records", records)
    return [lines[0], f"Structure of the first {len(records)} records as one array:", *lines[1:]]


def _explore_yaml(content: str) -> list[str]:
    text, note = content, ""
    if len(content) > YAML_LIMIT:
        text = content[: content.rfind("\n", 0, YAML_LIMIT) + 1 or YAML_LIMIT]
        note = f" (structure from the first {YAML_LIMIT >> 10} KB)"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = list(itertools.islice(yaml.load_all(text, Loader=loader), 50))
    title = f"Kind: YAML document{note}" if len(docs) == 1 else f"Kind: YAML stream, {len(docs)} documents{note}"
    return _describe_tree(title, docs[0] if len(docs) == 1 else docs)


def _local(tag: Any) -> str:
    return str(tag).rsplit("}", 1)[-1]


def _explore_xml(content: str) -> list[str]:
    # Without defusedxml, refusing DTDs outright is the simple way to be safe from entity expansion.
    if re.search(r"<!(?:DOCTYPE|ENTITY)", content, re.I) or len(content) > PARSE_LIMIT:
        raise ValueError("refusing to parse XML with a DTD, or too large")
    root = ET.fromstring(content)
    children = Counter(_local(child.tag) for child in root)
    attributes: Counter[str] = Counter()
    total, depth, stack = 0, 0, [(root, 1)]
    while stack:
        node, level = stack.pop()
        total, depth = total + 1, max(depth, level)
        if total <= MAX_NODES:
            attributes.update(_local(a) for a in node.attrib)
        stack.extend((child, level + 1) for child in node)
    namespaces = sorted({str(e.tag)[1:].split("}")[0] for e in itertools.islice(root.iter(), 1000)
                         if str(e.tag).startswith("{")})  # fmt: skip
    lines = [
        "Kind: XML document",
        f"Root element: <{_local(root.tag)}> ({len(root)} children, {total} elements, depth {depth})",
        "Child elements: " + ", ".join(f"{_clip(t, 40)} ×{n}" for t, n in children.most_common(30)),
        "Attribute names: " + ", ".join(_clip(a, 40) for a, _ in attributes.most_common(30)),
    ]
    return lines + ([f"Namespaces: {', '.join(namespaces[:5])}"] if namespaces else [])


def _explore_csv(content: str) -> list[str]:
    sample = "\n".join(content[:16384].splitlines()[:20])
    try:
        sniffed = csv.Sniffer().sniff(sample, delimiters=",\t;|")
        delimiter, quote = sniffed.delimiter, sniffed.quotechar or '"'
    except csv.Error:  # e.g. a single column
        delimiter, quote = ("\t" if sample.count("\t") > sample.count(",") else ","), '"'
    rows = (row for row in csv.reader(io.StringIO(content), delimiter=delimiter, quotechar=quote) if row)
    header = next(rows, [])
    samples = list(itertools.islice(rows, 3))
    count = len(samples) + sum(1 for _ in rows)
    lines = [
        "Kind: CSV table",
        "Delimiter: " + ("tab" if delimiter == "\t" else repr(delimiter)),
        f"Columns ({len(header)}): " + ", ".join(_clip(h, 40) for h in header[:50]),
        f"Data rows: {count} (after the header row)",
    ]
    for row in samples:  # "column=value" lets the assignment redaction catch secret columns
        pairs = (f"{_clip(h, 20)}={_clip(v, 40)}" for h, v in zip(header, row, strict=False))
        lines.append("Sample: " + _clip(" | ".join(pairs), 240))
    return lines


def explore_structured(kind: str, content: str, max_chars: int = 1600) -> str:
    """Deterministic shape description of JSON/JSON Lines, CSV/TSV, YAML or XML; excerpts if it won't parse."""
    explorers = {"json": _explore_json, "csv": _explore_csv, "yaml": _explore_yaml, "xml": _explore_xml}
    try:
        return _finish(explorers[kind](content), max_chars)
    except Exception as error:  # malformed or hostile input: excerpts describe it instead
        log.debug("%d characters could not be explored as %s (%s); excerpts", len(content), kind, _name(error))
        return explore_text_fallback(content, max_chars, note=f"could not be parsed as {kind.upper()}")


# --- code --------------------------------------------------------------------------------------------------

_IMPORT = re.compile(
    r"^\s*(?:import\b|from\s+\S+\s+import\b|#\s*include\b|#import\b|use\s+[\w:]|using\s+[\w.]+\s*;|package\s"
    r"|require(?:_once)?\b|(?:const|let|var)\s+\S+\s*=\s*require\(|library\(|extern\s+crate\b)"
)
_MODIFIERS = (
    r"(?:(?:export|default|pub(?:\([\w:]+\))?|public|private|protected|internal|static|abstract|final|async"
    r"|override|open|sealed|data|inline|extern|unsafe|virtual|declare|local|const)\s+)*"
)
_SIGNATURE = re.compile(
    r"^[ \t]{0,4}(?:"
    + _MODIFIERS
    + r"(?:function\*?|class|interface|struct|enum|trait|impl|type|fn|func|fun|def|module|namespace|object"
    r"|protocol|extension|sub)\b"
    r"|export\s+(?:const|let|var)\s"
    r"|create\s+(?:or\s+replace\s+)?(?:table|view|function|procedure|index)\b"
    r"|[\w.]+\s*<-\s*function\b"  # R
    r"|\w+\s*\(\)\s*\{"  # shell
    r"|(?:[\w:<>\[\],*&]+\s+)+\**~?\w+\s*\([^;{}]*\)\s*(?:const\s*)?(?:throws\s+[\w., ]+)?\{?\s*$)",  # C-like
    re.I,
)
_NOT_A_SIGNATURE = re.compile(r"^\s*(?:[*/#]|(?:if|for|while|switch|return|else|catch|do|new|throw|case)\b)")


def _strip_body(line: str) -> str:
    """Cut a declaration at the first brace or arrow outside parentheses: what follows is the body."""
    depth, python = 0, re.match(r"(?:async\s+)?(?:def|class)\s", line) is not None
    for i, char in enumerate(line):
        depth += (char in "([") - (char in ")]")
        if depth <= 0 and (char == "{" or line.startswith("=>", i) or (python and char == ":")):
            return line[:i].rstrip()
    return line.rstrip()


def _python_outline(content: str) -> tuple[list[str], list[str]]:
    imports: list[str] = []
    signatures: list[str] = []
    for node in ast.parse(content).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(ast.unparse(node))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            signatures.append(f"{prefix} {node.name}({ast.unparse(node.args)}){returns}")
        elif isinstance(node, ast.ClassDef):
            bases = f"({', '.join(ast.unparse(b) for b in node.bases)})" if node.bases else ""
            methods = [m.name for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
            signatures.append(f"class {node.name}{bases}" + (f": methods {', '.join(methods)}" if methods else ""))
    return imports, signatures


def _pattern_outline(content: str) -> tuple[list[str], list[str]]:
    imports: list[str] = []
    signatures: list[str] = []
    in_go_imports = False
    for line in content.splitlines():
        if len(line) > 300:
            continue  # minified or generated; also bounds regex work per line
        if in_go_imports:
            in_go_imports = line.strip() != ")"
            if in_go_imports and line.strip():
                imports.append(line.strip())
        elif _IMPORT.match(line):
            in_go_imports = line.strip() == "import ("
            imports.append(line.strip())
        elif _SIGNATURE.match(line) and not _NOT_A_SIGNATURE.match(line):
            signatures.append(_strip_body(line.strip()))
    return imports, signatures


def explore_code(name: str, content: str, max_chars: int = 2000) -> str:
    """Deterministic outline of source code: language, size, imports, top-level signatures without bodies."""
    try:
        ext = PurePath(name or "").suffix.lower()
        language = _LANGUAGES.get(ext, "unknown language")
        lines = [f"Kind: {language} source", f"Lines: {_line_count(content)}"]
        head = content[:SNIFF_LIMIT]
        if len(content) > SNIFF_LIMIT:
            head = head[: head.rfind("\n") + 1]  # whole lines, so a prefix of valid Python still parses
            lines.append(f"(outline of the first {SNIFF_LIMIT >> 20} MB)")
        outline: tuple[list[str], list[str]] | None = None
        if language == "Python":
            try:
                outline = _python_outline(head)
            except Exception as error:  # SyntaxError, or RecursionError on absurd nesting: use the regexes
                log.debug("%d characters of Python do not parse (%s); outline by pattern", len(head), _name(error))
                lines.append("(not valid Python; outline by pattern matching)")
        imports, signatures = outline or _pattern_outline(head)
        lines.append(f"Imports ({len(imports)}):")
        lines += [f"  {_clip(line, 160)}" for line in imports[:15]] + (["  …"] if len(imports) > 15 else [])
        lines.append(f"Top-level declarations ({len(signatures)}):")
        lines += [f"  {_clip(line, 160)}" for line in signatures[:40]] + (["  …"] if len(signatures) > 40 else [])
        return _finish(lines, max_chars)
    except Exception as error:  # the pattern outline is not expected to fail: a bug, or input it never met
        log.warning("the code outline of %d characters failed (%s); excerpts", len(content), _name(error))
        return explore_text_fallback(content, max_chars, note="code outline failed")


# --- free text ---------------------------------------------------------------------------------------------


def _sections(text: str) -> list[str]:
    found: list[str] = []
    previous = ""
    for line in itertools.islice(text.splitlines(), 50_000):
        stripped = line.strip()
        if re.match(r"#{1,6}\s+\S", stripped):
            found.append(stripped)
        elif re.fullmatch(r"(=+|-+)", stripped) and len(stripped) >= 3 and previous and len(previous) <= 80:
            found.append(previous)
        elif 3 <= len(stripped) <= 60 and stripped[0].isalnum() and stripped.isupper():
            found.append(stripped)
        previous = stripped
        if len(found) >= 20:
            break
    return found


def _head(text: str, n: int) -> str:
    window = _redacted_prefix(text, n)
    if len(window) <= n:
        return window
    cut = max(window.rfind("\n", n // 2, n), window.rfind(" ", n // 2, n))
    return window[: cut if cut > 0 else n]


def _tail(text: str, n: int) -> str:
    # Start on a line (or at least token) boundary: the anonymous end of a secret matches no pattern.
    start = len(text) - n
    if start <= 0:
        return redact_secrets(text)
    cut = text.find("\n", start, start + n // 2)
    boundary = _BOUNDARY.search(text, start, start + n // 2) if cut < 0 else None
    cut = boundary.start() if boundary else cut
    return redact_secrets(text[cut + 1 if cut >= 0 else start :])


def explore_text_fallback(content: str, max_chars: int = 1600, *, note: str = "") -> str:
    """Counts, section headers and labelled head/tail excerpts: the summary when no LLM summary is usable."""
    try:
        lines = ["Kind: text (excerpts)"] + ([f"Note: {note}"] if note else [])
        lines.append(f"Size: {len(content)} chars, {_line_count(content)} lines, {len(content.split())} words")
        head_text = content[:SNIFF_LIMIT]
        sections = [_clip(s, 80) for s in _sections(head_text)]
        budget = max_chars // 3
        while sections and sum(len(s) + 3 for s in sections) > budget:
            sections.pop()
        if sections:
            lines += ["Sections:"] + [f"  {s}" for s in sections]
        used = sum(len(line) + 1 for line in lines) + 40
        size = max(0, min(500, (max_chars - used) // 2))
        if len(content) <= 2 * size:
            lines += ["Full text:", content]
        elif size:
            lines += ["Beginning:", _head(content, size), "…", "End:", _tail(content, size)]
        return _finish(lines, max_chars)
    except Exception as error:  # the last fallback must not fail: a bug, or input it never met
        log.warning("the excerpts of %d characters failed (%s); size only", len(content), _name(error))
        return f"Kind: text (excerpts)\nSize: {len(content)} chars"[:max_chars]


# --- entry point -------------------------------------------------------------------------------------------


class TextSummarizer(Protocol):
    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str: ...


_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)


def _strip_thinking(text: str) -> str:
    text = _THINK.sub("", text)
    # Some templates emit only the closing tag; the reasoning is everything before it.
    return text.rsplit("</think>", 1)[-1].strip()


class CallCap(Protocol):
    """The hourly cap on summary-model calls (``proxy.engine.summarize.Guard``)."""

    def take_call(self, conversation_id: str) -> bool: ...


class ExplorationBudget:
    """What one request may spend on LLM exploration: at most ``calls`` summary-model calls, none after
    ``seconds`` from the budget's creation (a call started earlier is cut off then), and each one charged to
    ``cap`` under ``key``. Past the budget, free text gets the deterministic summary."""

    def __init__(
        self,
        calls: int,
        seconds: float,
        cap: CallCap | None = None,
        key: str = "explore",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.calls_left = calls
        self.deadline = clock() + seconds
        self.cap = cap
        self.key = key
        self.clock = clock

    def take(self) -> float | None:
        """Spend one call: the seconds it may take, or None when no call may be made."""
        remaining = self.deadline - self.clock()
        if self.calls_left <= 0 or remaining <= 0:
            return None
        if self.cap is not None and not self.cap.take_call(self.key):
            return None
        self.calls_left -= 1
        return remaining


CLASSIFY_OFF_LOOP = 64 << 10  # characters: classifying may parse up to SNIFF_LIMIT of JSON


async def exploration_summary(
    name: str,
    mime: str | None,
    content: str,
    summarizer: TextSummarizer | None,
    *,
    max_tokens: int = 400,
    budget: ExplorationBudget | None = None,
) -> str:
    """The summary placed in a file stub. Structured data and code never reach the LLM; free text does while
    ``budget`` (when given) allows."""
    # Parsing megabytes is CPU work: keep it off the event loop.
    if len(content) > CLASSIFY_OFF_LOOP:
        kind = await asyncio.to_thread(classify, name, mime, content)
    else:
        kind = classify(name, mime, content)
    if kind == "code":
        return await asyncio.to_thread(explore_code, name, content)
    if kind != "text":
        return await asyncio.to_thread(explore_structured, kind, content)
    timeout = budget.take() if summarizer is not None and budget is not None else None
    if summarizer is not None and (budget is None or timeout is not None):
        try:
            call = summarizer.summarize_text(content, name=name, max_tokens=max_tokens)
            raw = await (call if timeout is None else asyncio.wait_for(call, timeout))
            summary = _strip_thinking(raw) if isinstance(raw, str) else ""
            # Far over budget means the model ignored the instructions (or echoed the document).
            if summary and len(summary) <= 16 * max_tokens:
                # A model-written description of untrusted text goes into every forwarded stub of the file.
                lines = ["Kind: text (LLM summary)", remove_instruction_overrides(summary)]
                return _finish(lines, 16 * max_tokens + 64)
        except Exception as error:  # a timeout or an upstream error: the excerpts below stand in
            log.warning(
                "exploration summary of a %d-character document failed (%s); using excerpts",
                len(content),
                type(error).__name__,
            )
    return await asyncio.to_thread(explore_text_fallback, content)
