"""One thread at a time imports the heavy ML libraries the engine and the embedding model share.

Why: the engine's start (vLLM, on the server's loop and a worker thread) and the embedding model's
first load (sentence-transformers, on the embedding thread) both import transformers and
accelerate. Two threads importing the same circular package graph in different orders can meet
Python's module-lock deadlock avoidance, which hands one of them a partially initialised module:
a bench saw the engine fail to start with "cannot import name 'AcceleratorState' from partially
initialized module 'accelerate.state'" while a project turn's question was being embedded.
Importing them here first, under one lock, leaves both paths finding them complete.
"""

from __future__ import annotations

import importlib
import threading

_lock = threading.Lock()
_done = False

# In import order: what both paths pull in (accelerate may be absent: then it is skipped).
SHARED = ("torch", "transformers", "accelerate", "accelerate.state")
# Those without which neither path can run: their ImportError is raised.
_required = ("torch", "transformers")


def shared_libraries_import() -> None:
    """Import :data:`SHARED` once per process, one thread at a time (module docstring). Cheap
    after the first call. Raises ImportError only for a library of ``_required`` missing."""
    global _done
    if _done:
        return
    with _lock:
        if _done:
            return
        for name in SHARED:
            try:
                importlib.import_module(name)
            except ImportError:
                if name in _required:
                    raise
        _done = True
