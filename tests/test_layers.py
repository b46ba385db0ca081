"""Layers (issue 17): ``inference/`` and the shared ``core/`` package import no feature app, and
the gateway pipeline is imported by the apps above it, never by the layers below."""

from __future__ import annotations

import ast
import subprocess
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


# --- each feature app's public surface (issue 31) ---------------------------------------------

SURFACE_APPS = sorted(FEATURE_APPS | {"projects", "imports"})
# What any other app may import of a feature app: writes, reads (also split by concept:
# ``page_selectors``), models and the Django wiring.
SURFACE = {"models", "services", "selectors", "signals", "apps", "admin", "forms", "tasks"}
# Benchmarks measure an app's internals on purpose.
EXEMPT_IMPORTERS = {"bench"}

# Other modules of a feature app that another app may import, each with why. A key names a
# module, or a package for all its modules; "IMPORTER -> MODULE" allows that one importer only.
# A new entry needs a reason a reviewer accepts; one that nothing needs any more fails the test.
PUBLIC_MODULES: dict[str, str] = {
    "gateway": "the one admission pipeline (issue 27): a package whose modules are its surface",
    "accounts.callers": "the caller as values, which the gateway admits (no app's models in it)",
    "moderation.verdicts": "verdict value types every gate and stored turn carries",
    "moderation.base": "the moderator the gateway, imports and the warm-up ask",
    "moderation.gate": "the output gate that runs beside every answer stream",
    "memory.blocks": "the memory block a turn's prompt carries (conversations/plan.py)",
    "memory.commands": "'remember' / 'forget' in a message, parsed as the turn is submitted",
    "memory.updates": "those commands applied as the turn is submitted (conversations/submit.py)",
    "attachments.prompt": "attached files in a turn's prompt (conversations/, projects/prompt.py)",
    "attachments.files": "the upload checks and text extraction that project files share",
    "projects.prompt": "a project's passages in a turn's prompt (conversations/plan.py)",
    "projects.export": "the projects' part of a person's data export (privacy/)",
    "privacy.views -> accounts.throttle": "a password re-confirmation counts as a sign-in",
    "privacy.views -> accounts.request_info": "the client's address for that throttle",
    "projects.views -> conversations.chat_context": "project pages show the chat's sidebar",
    "conversations.regional_admin": "the admin base of every model stored in a region",
    # /v1's views drive the turn pipeline, as the chat page's views do (api/views.py docstring).
    "api.views -> conversations.plan": "the turn pipeline: an answer's admission",
    "api.views -> conversations.submit": "the turn pipeline: a message in, an answer started",
    "api.views -> conversations.turnstream": "the turn pipeline: the answer's stream",
    "api.views -> conversations.locks": "the turn pipeline: one answer at a time",
}


def _covers(key: str, module: str) -> bool:
    return module == key or module.startswith(key + ".")


def surface_allows(importer: str, module: str, public: dict[str, str]) -> str | None:
    """The rule or ``public`` key that lets ``importer`` (another app's module) import
    ``module`` (a feature app's), or None when nothing does."""
    app, _, rest = module.partition(".")
    name = rest.split(".")[0]
    if not rest or name in SURFACE or name.endswith(("_selectors", "_services")):
        return "surface"
    if (name in {"urls", "views"} or name.endswith("_views")) and importer.endswith(".urls"):
        return "URLconf"  # views are reached through a URLconf only
    if name == "api" and importer.split(".")[0] == "api":
        return "/v1"  # an app's /v1 routes, mounted and documented by the /v1 package
    for key in public:
        allowed_importer, arrow, target = key.rpartition(" -> ")
        if _covers(target, module) and (not arrow or importer == allowed_importer):
            return key
    return None


def surface_violations(
    graph: dict[str, set[str]], apps: list[str], public: dict[str, str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """``(importer, module)`` pairs where a module imports (lazily too) a feature app's module
    that neither its surface nor ``public`` allows, and the ``public`` keys that allow nothing."""
    violations, used = [], set()
    for importer, modules in sorted(graph.items()):
        if importer.split(".")[0] in EXEMPT_IMPORTERS:
            continue
        for module in sorted(modules):
            app = module.split(".")[0]
            if app not in apps or app == importer.split(".")[0]:
                continue
            rule = surface_allows(importer, module, public)
            if rule is None:
                violations.append((importer, module))
            used.add(rule)
    return violations, sorted(set(public) - used)


def test_the_surface_finder_sees_a_private_module_imported_from_another_app(tmp_path):
    """The check itself can fail: a lazy import of another app's private module, a view
    imported outside a URLconf, an unused allowlist entry; a URLconf's view, a surface module
    and an allowed one pass."""
    for package, files in {
        "shop": {"services.py": "", "internal.py": "", "views.py": "", "page_selectors.py": ""},
        "cart": {
            "services.py": "from shop.services import x\nfrom shop.page_selectors import y\n",
            "views.py": "def f():\n    from shop import internal\n    from shop.views import v\n",
            "urls.py": "from shop import views\n",
            "tasks.py": "import shop.pricing\n",
        },
    }.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        for name, text in files.items():
            (tmp_path / package / name).write_text(text)
    (tmp_path / "shop" / "pricing.py").write_text("")
    graph = import_graph(tmp_path, ["shop", "cart"])
    public = {"shop.pricing": "a reason", "shop.gone": "nothing imports it"}

    violations, unused = surface_violations(graph, ["shop", "cart"], public)

    assert violations == [("cart.views", "shop.internal"), ("cart.views", "shop.views")]
    assert unused == ["shop.gone"]


def test_other_apps_import_only_a_feature_apps_surface():
    """Another app imports a feature app's models, services, selectors, signals, apps, admin,
    forms and tasks; its views through a URLconf, its ``api`` from the /v1 package; anything
    else only as listed in PUBLIC_MODULES (lazy imports count)."""
    graph = import_graph(ROOT, PROJECT_PACKAGES)

    violations, unused = surface_violations(graph, SURFACE_APPS, PUBLIC_MODULES)

    assert violations == [], "imports past an app's surface:\n" + "\n".join(
        f"{importer} -> {module}" for importer, module in violations
    )
    assert unused == [], f"PUBLIC_MODULES entries nothing needs (remove them): {unused}"


# --- no module over 500 lines (issue 31) -------------------------------------------------------

MODULE_LINES_MAX = 500  # CONVENTIONS.md: split a module by concept before it passes ~500 lines


def long_modules(paths: list[Path], limit: int) -> dict[str, int]:
    """``{path: lines}`` of the Python files among ``paths`` longer than ``limit`` lines."""
    counts = {str(path): len(path.read_text().splitlines()) for path in paths}
    return {path: lines for path, lines in counts.items() if lines > limit}


def test_the_length_check_finds_a_long_module(tmp_path):
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * 3)
    long.write_text("x = 1\n" * 4)

    assert long_modules([short, long], limit=3) == {str(long): 4}


def test_no_module_is_over_500_lines():
    """Product, bench and test modules alike; migrations are generated and left out."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    paths = [ROOT / name for name in tracked if "/migrations/" not in name and (ROOT / name).exists()]

    assert len(paths) > 300  # the listing worked
    assert long_modules(paths, MODULE_LINES_MAX) == {}
