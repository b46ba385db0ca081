"""Docstrings and comments that point a reader at a module (``conversations/submit.py``) point at
one that exists: a module moved or folded leaves no stale pointer behind (issue 31; the
attachments prompt named a ``conversations/streaming.py`` long gone). Pure: reads the sources."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A path of the project's own packages as the docstrings write them: package/[more/]module.py,
# not part of a longer path or a dotted name.
MODULE_PATH = re.compile(r"(?<![\w/.])((?:[a-z_][a-z0-9_]*/)+[a-z_][a-z0-9_]*\.py)\b")


def packages() -> set[str]:
    """The project's top-level Python packages (the tests aside)."""
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}


def stale_references(root: Path, names: set[str]) -> dict[str, list[str]]:
    """Module paths under packages ``names`` that the ``.py`` files of those packages name and
    that do not exist under ``root``: path -> the files naming it."""
    stale: dict[str, list[str]] = {}
    for package in sorted(names):
        for source in sorted((root / package).rglob("*.py")):
            for match in MODULE_PATH.finditer(source.read_text()):
                path = match.group(1)
                if path.split("/", 1)[0] in names and not (root / path).is_file():
                    stale.setdefault(path, []).append(str(source.relative_to(root)))
    return stale


def test_the_scanner_finds_a_module_that_is_not_there(tmp_path):
    """Given a package whose docstring names one module that exists and one that does not,
    then only the missing one is reported, with the file naming it."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "real.py").write_text("")
    (tmp_path / "app" / "notes.py").write_text('"""See app/real.py and app/gone.py, not x.app/gone.py."""\n')

    assert stale_references(tmp_path, {"app"}) == {"app/gone.py": ["app/notes.py"]}


def test_every_module_a_docstring_names_exists():
    assert stale_references(ROOT, packages()) == {}
