"""Errors of the engine layer, apart from the engine so that its helpers (tuning, nodes) can raise
them without importing the engine."""

from __future__ import annotations


class EngineUnavailable(RuntimeError):
    """The engine failed to start or died; requests cannot be served."""
