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
    "conversations.selectors", "conversations.retention", "conversations.deletion",
    "conversations.tombstones", "conversations.turndata", "conversations.partitions",
    "conversations.regions", "attachments.services",
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
