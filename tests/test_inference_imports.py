"""inference/imports.py: the heavy libraries the engine and the embedding model share are imported
once, one thread at a time, before either path's own imports."""

from __future__ import annotations

import sys
import threading

import pytest

from inference import imports


def test_the_shared_libraries_are_imported_whole_from_many_threads_at_once(monkeypatch):
    # Given a process where the shared import has not run yet
    monkeypatch.setattr(imports, "_done", False)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run() -> None:
        start.wait()
        try:
            imports.shared_libraries_import()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    # When four threads ask for it at the same moment
    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    # Then none failed and the libraries are complete modules (not partially initialised)
    assert errors == []
    assert imports._done
    assert hasattr(sys.modules["accelerate.state"], "AcceleratorState")
    assert hasattr(sys.modules["transformers"], "AutoTokenizer")


def test_a_missing_optional_library_is_skipped_and_a_required_one_raises(monkeypatch):
    monkeypatch.setattr(imports, "_done", False)
    monkeypatch.setattr(imports, "SHARED", ("json", "no_such_optional_library"))
    imports.shared_libraries_import()
    assert imports._done

    monkeypatch.setattr(imports, "_done", False)
    monkeypatch.setattr(imports, "SHARED", ("transformers_missing_for_the_test",))
    monkeypatch.setattr(imports, "_required", ("transformers_missing_for_the_test",))
    with pytest.raises(ImportError):
        imports.shared_libraries_import()
    assert not imports._done
