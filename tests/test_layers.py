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
