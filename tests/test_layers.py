"""Layers (issue 17): ``inference/`` and the shared ``core/`` package import no feature app, and
the gateway pipeline is imported by the apps above it, never by the layers below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FEATURE_APPS = {
    "accounts", "conversations", "api", "usage", "moderation", "memory", "workspaces", "sharing",
    "attachments", "feedback", "audit", "privacy", "gateway",
}  # fmt: skip


def imported_packages(path: Path) -> set[str]:
    """Top-level packages ``path`` imports anywhere (module level and inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_import_scanner_sees_lazy_imports(tmp_path):
    """The check itself can fail: an import inside a function counts."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from accounts.services import x\n    import usage.models\n")
    assert {"accounts", "usage"} <= imported_packages(module)


@pytest.mark.parametrize("layer", ["inference", "core"])
def test_a_lower_layer_imports_no_feature_app(layer):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & FEATURE_APPS)
        for path in sorted((ROOT / layer).rglob("*.py"))
        if imported_packages(path) & FEATURE_APPS
    }
    assert offenders == {}


def test_the_gateway_imports_no_feature_app_but_moderation():
    """The gateway owns the admission sequence but reads no app's models (issue 27): the caller
    arrives as values (accounts/callers.py), the ledger's writer by name. Lazy imports count."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & (FEATURE_APPS - {"gateway", "moderation"}))
        for path in sorted((ROOT / "gateway").rglob("*.py"))
        if imported_packages(path) & (FEATURE_APPS - {"gateway", "moderation"})
    }
    assert offenders == {}


# --- the storage modules import each other without a circle -----------------------------------

STORAGE = [
    "conversations.services", "conversations.writeback", "conversations.held", "conversations.cache",
    "conversations.selectors", "conversations.page_selectors", "conversations.search_selectors",
    "conversations.retention", "conversations.deletion",
    "conversations.tombstones", "conversations.turndata", "conversations.partitions",
    "core.regions", "attachments.services",
]  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    """Dotted modules ``path`` imports anywhere (``from conversations import cache`` counts as
    ``conversations.cache``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in ``graph`` (module -> modules it imports), or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_storage_modules_import_each_other_without_a_circle():
    """The held-answer store apart from the write-back worker, constants from partitions, the
    zero-retention decision in one selector: no storage module reaches itself again through
    its imports (lazy ones included)."""
    graph = {
        name: imported_modules(ROOT / (name.replace(".", "/") + ".py")) & set(STORAGE) - {name}
        for name in STORAGE
    }
    assert import_cycle(graph) is None


# --- no import cycle anywhere in the project (issue 31) ---------------------------------------

PROJECT_PACKAGES = sorted(
    path.parent.name
    for path in ROOT.glob("*/__init__.py")
    if path.parent.name not in {"tests", "node_modules"}
)

# Cycles allowed for now, each through a file another change owns (issue 31 leaves them for
# later). A cycle listed here must still be one; a new cycle anywhere fails the test.
KNOWN_CYCLES: list[frozenset[str]] = []


def module_files(root: Path, packages: list[str]) -> dict[str, Path]:
    """Dotted module name -> file for every ``.py`` under ``packages`` (migrations left out)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _longest_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is one of ``modules``."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that module ``name`` imports anywhere in its file (module level and
    inside functions). ``from a.b import c`` counts as ``a.b.c`` when that is a module, else
    as ``a.b``; relative imports are resolved against ``name``'s package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
        for target in targets:
            if (resolved := _longest_module(target, modules)) and resolved != name:
                found.add(resolved)
    return found


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    return {name: module_imports(name, path, modules) for name, path in modules.items()}


def strongly_connected_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative),
    each sorted; the list sorted too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def test_the_project_cycle_finder_sees_lazy_relative_and_from_imports(tmp_path):
    """The check itself can fail: a circle closed by a function-level import, a relative one,
    or ``from pkg import module`` is found; a name imported from a module is not a module."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import helper\n")
    (tmp_path / "pkg" / "b.py").write_text("def helper():\n    from . import c\n")
    (tmp_path / "pkg" / "c.py").write_text("def f():\n    from pkg import a\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.e\n")
    (tmp_path / "pkg" / "e.py").write_text("from pkg.d import name_not_a_module\n")
    (tmp_path / "pkg" / "f.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "migrations").mkdir()
    (tmp_path / "pkg" / "migrations" / "m.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.c"] == {"pkg.a"}
    assert "pkg.migrations.m" not in graph
    assert strongly_connected_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]
    (tmp_path / "pkg" / "c.py").write_text("")
    (tmp_path / "pkg" / "e.py").write_text("")
    assert strongly_connected_cycles(import_graph(tmp_path, ["pkg"])) == []


def test_no_module_of_the_project_reaches_itself_through_its_imports():
    """No import cycle among the product packages and bench/ (lazy imports inside functions
    count: they only hide a circle until the function runs)."""
    cycles = strongly_connected_cycles(import_graph(ROOT, PROJECT_PACKAGES))
    unexpected = [cycle for cycle in cycles if frozenset(cycle) not in KNOWN_CYCLES]
    stale = [sorted(known) for known in KNOWN_CYCLES if sorted(known) not in cycles]
    assert unexpected == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in unexpected)
    assert stale == [], f"known cycles that are gone (remove them from KNOWN_CYCLES): {stale}"
