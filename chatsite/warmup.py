"""The server process's warm-up: the moderation classifiers and the memory embedding model,
loaded in a background thread at start (chatsite/asgi.py), and whether it has finished.

Loading them holds the GIL for a few seconds; while it does, the event loop's Redis calls can
time out and open Redis's circuit breaker (core/redis_guard.py), which runs rate limits open.
So a process is not ready (``/readyz``, chatsite/health.py) until its warm-up is done, and a
load balancer sends it no turns before then.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings

logger = logging.getLogger(__name__)

_started = threading.Event()
_done = threading.Event()


def warm_up() -> None:
    """Load the moderation classifiers (the first check loads and trains them, ~1 s) so the
    first turn is not refused for a check that timed out (settings.CHAT_MODERATION_TIMEOUT_S),
    and the memory embedding model (~1-2 s) so the first turn with memory does not wait for
    it. Either failing is logged and shows on the first turn (moderation fails closed). Marks
    the warm-up done however it ends."""
    from moderation.base import moderator  # noqa: PLC0415
    from moderation.verdicts import policy_for  # noqa: PLC0415

    try:
        try:
            checker = moderator()
            checker.check_input("warm-up", policy_for(None))
            checker.check_output("warm-up", policy_for(None))
        except Exception:  # noqa: BLE001
            logger.exception("moderation warm-up failed")
        if getattr(settings, "CHAT_MEMORY_ENABLED", False):
            try:
                from inference.embeddings import embeddings_warm  # noqa: PLC0415

                embeddings_warm()
            except Exception:  # noqa: BLE001
                logger.exception("memory embedding warm-up failed")
    finally:
        _done.set()


def start() -> None:
    """Run :func:`warm_up` in a daemon thread (once per process)."""
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()


def pending() -> bool:
    """Whether a warm-up was started in this process and has not finished (a process that
    never started one, e.g. a test's in-process server, has nothing pending)."""
    return _started.is_set() and not _done.is_set()
