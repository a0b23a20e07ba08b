"""Outlines of source code: language, size, imports and top-level signatures without their bodies.

Python is read with ``ast`` (falling back to patterns when it does not parse); other languages by line
patterns that recognise imports and declarations of the common languages. Deterministic, no upstream call.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import PurePath

from proxy.engine.explore.excerpts import explore_text_fallback, line_count
from proxy.engine.explore.kinds import LANGUAGES, SNIFF_LIMIT
from proxy.engine.explore.output import clip, error_name, finish

log = logging.getLogger("lcm_proxy.explore")

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
        language = LANGUAGES.get(ext, "unknown language")
        lines = [f"Kind: {language} source", f"Lines: {line_count(content)}"]
        head = content[:SNIFF_LIMIT]
        if len(content) > SNIFF_LIMIT:
            head = head[: head.rfind("\n") + 1]  # whole lines, so a prefix of valid Python still parses
            lines.append(f"(outline of the first {SNIFF_LIMIT >> 20} MB)")
        outline: tuple[list[str], list[str]] | None = None
        if language == "Python":
            try:
                outline = _python_outline(head)
            except Exception as error:  # SyntaxError, or RecursionError on absurd nesting: use the regexes
                log.debug("%d characters of Python do not parse (%s); outline by pattern", len(head), error_name(error))
                lines.append("(not valid Python; outline by pattern matching)")
        imports, signatures = outline or _pattern_outline(head)
        lines.append(f"Imports ({len(imports)}):")
        lines += [f"  {clip(line, 160)}" for line in imports[:15]] + (["  …"] if len(imports) > 15 else [])
        lines.append(f"Top-level declarations ({len(signatures)}):")
        lines += [f"  {clip(line, 160)}" for line in signatures[:40]] + (["  …"] if len(signatures) > 40 else [])
        return finish(lines, max_chars)
    except Exception as error:  # the pattern outline is not expected to fail: a bug, or input it never met
        log.warning("the code outline of %d characters failed (%s); excerpts", len(content), error_name(error))
        return explore_text_fallback(content, max_chars, note="code outline failed")
