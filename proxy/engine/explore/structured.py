"""Shape descriptions of structured data: keys and array lengths for JSON (and JSON Lines) and YAML, tags
and attributes for XML, columns, row count and samples for CSV/TSV.

Deterministic (cheap, reproducible, no upstream call) and bounded on hostile input: nesting is measured
without recursion, outlines stop at ``MAX_DEPTH`` and ``MAX_OUTLINE_LINES``, YAML is read from a prefix, XML
with a DTD is refused (entity expansion), and anything that will not parse gets excerpts instead.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import re
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

import yaml

from proxy.engine.explore.excerpts import explore_text_fallback
from proxy.engine.explore.kinds import SNIFF_LIMIT
from proxy.engine.explore.output import clip, error_name, finish

log = logging.getLogger("lcm_proxy.explore")

PARSE_LIMIT = 8 << 20  # whole-document parsers (JSON, XML) are C-fast up to here; beyond, fall back
MAX_DEPTH = 6  # shape descriptions stop here: deeper levels rarely help and may be hostile
MAX_NODES = 100_000  # depth measurement visits at most this many nodes (YAML aliases can form cycles)
MAX_OUTLINE_LINES = 60
YAML_LIMIT = 512 << 10  # PyYAML builds objects in Python (~2 s per MB even with the C parser)

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
        keys = f"; item keys: {', '.join(clip(str(k), 40) for k in list(merged)[:30])}" if merged else ""
        out.append(f"{pad}{label} ({_type_name(value)}{keys})")
        if not merged and value and isinstance(value[0], list) and depth + 1 < MAX_DEPTH:
            _outline(value[0], "[0]", depth + 1, out)  # arrays of arrays: describe the first
        value = merged
    else:
        out.append(f"{pad}{label} ({_type_name(value)})")
    if not isinstance(value, dict) or depth + 1 >= MAX_DEPTH:
        return
    for key, child in itertools.islice(value.items(), 30):
        _outline(child, clip(str(key), 60), depth + 1, out)
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
        log.debug("%d characters are no JSON document (%s); reading JSON Lines", len(content), error_name(error))
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
        "Child elements: " + ", ".join(f"{clip(t, 40)} ×{n}" for t, n in children.most_common(30)),
        "Attribute names: " + ", ".join(clip(a, 40) for a, _ in attributes.most_common(30)),
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
        f"Columns ({len(header)}): " + ", ".join(clip(h, 40) for h in header[:50]),
        f"Data rows: {count} (after the header row)",
    ]
    for row in samples:  # "column=value" lets the assignment redaction catch secret columns
        pairs = (f"{clip(h, 20)}={clip(v, 40)}" for h, v in zip(header, row, strict=False))
        lines.append("Sample: " + clip(" | ".join(pairs), 240))
    return lines


def explore_structured(kind: str, content: str, max_chars: int = 1600) -> str:
    """Deterministic shape description of JSON/JSON Lines, CSV/TSV, YAML or XML; excerpts if it won't parse."""
    explorers = {"json": _explore_json, "csv": _explore_csv, "yaml": _explore_yaml, "xml": _explore_xml}
    try:
        return finish(explorers[kind](content), max_chars)
    except Exception as error:  # malformed or hostile input: excerpts describe it instead
        log.debug("%d characters could not be explored as %s (%s); excerpts", len(content), kind, error_name(error))
        return explore_text_fallback(content, max_chars, note=f"could not be parsed as {kind.upper()}")
