"""What every settings module reads the environment with (chatsite/settings/base.py and the
topic modules it imports): the project's folders and the typed environment readers.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("CHAT_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    """Read a boolean environment variable ("1", "true", "yes", "on" are true)."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    """Read an integer environment variable."""
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)
