"""Shared test helpers live in ``tests/support``: no test module (nor ``bench/``) imports a test module, so
moving or deleting a test never breaks another."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, a name imported from a package counted as its module too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_only_tests_support_is_imported_from_tests() -> None:
    sources = [*(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    wrong = sorted(
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources
        for name in imported_modules(path)
        if name.startswith("tests.") and not (name + ".").startswith("tests.support.")
    )
    assert wrong == []


def test_the_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text("from tests.engine.test_compaction import SETTINGS\nfrom tests.support.sim import TOOLS\n")
    assert imported_modules(source) == {"tests.engine.test_compaction.SETTINGS", "tests.support.sim.TOOLS"}
