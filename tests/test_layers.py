"""The layers of ``proxy/`` hold: no import circle between modules, and ``.importlinter``'s contracts (which CI
also runs as ``lint-imports``) are kept. A broken contract's message names the import that breaks it."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

from tests.support import REPO


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_module_of_proxy_imports_itself_in_a_circle() -> None:
    graph = grimp.build_graph("proxy")  # deferred (function-level) and TYPE_CHECKING imports included
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_import_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    status = lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "0 broken" in out and "kept" in out


def test_a_broken_contract_names_the_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The store may not import the engine: a contract saying the reverse (the engine may not import the store)
    is broken by today's code, and the report names an import that breaks it."""
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    proxy\n\n[importlinter:contract:x]\nname = reversed\n"
        "type = forbidden\nsource_modules =\n    proxy.engine\nforbidden_modules =\n    proxy.store\n"
    )
    status = lint_imports(config_filename=str(config), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert status == 1
    assert "proxy.engine." in out and "-> proxy.store." in out
