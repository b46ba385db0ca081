"""The ``Moderator`` interface, the process-wide moderator and the fail-closed async check.

DESIGN.md's request path runs the input gate after the rate limit and before any engine work,
and the output gate beside the stream. Both call ``acheck``, which runs the (synchronous, CPU)
classifier on a small dedicated thread pool with a timeout, so a slow or broken classifier can
neither stall the event loop nor let a turn through unchecked: an exception or a timeout gives a
``moderation_unavailable`` verdict that refuses the turn unless the organisation chose
fail-open (PF-M2), and is counted in ``chat_moderation_failures_total``.

Which moderator: ``settings.CHAT_MODERATOR`` (dotted path of a class built with no arguments):
``moderation.local.LocalModerator`` (default) or ``moderation.guard.GuardModerator``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol, runtime_checkable

from django.conf import settings
from django.utils.module_loading import import_string

from core import metrics
from moderation.verdicts import Policy, Verdict

GATES = ("input", "output")

logger = logging.getLogger(__name__)


@runtime_checkable
class Moderator(Protocol):
    """A classifier behind the moderation gates.

    ``name``: what verdicts record as ``classifier`` (``"local"``, ``"guard:<pool>"``);
    ``version``: the classifier's version string. Both checks are synchronous (they run on
    ``acheck``'s worker threads), may raise (``acheck`` turns that into a fail-closed verdict)
    and must be safe to call from several threads at once.
    """

    name: str
    version: str

    def check_input(self, text: str, policy: Policy) -> Verdict:
        """The verdict on a user message (whole), gate ``"input"``. Budget: < 50 ms p99 for
        4,000 characters on the gateway's CPU."""
        ...

    def check_output(self, text: str, policy: Policy) -> Verdict:
        """The verdict on one window of an answer (moderation/window.py), gate ``"output"``;
        includes the system-prompt leak check against ``policy.system_prompt``."""
        ...


_lock = threading.Lock()
_moderator: Moderator | None = None
_executor: ThreadPoolExecutor | None = None


def moderator() -> Moderator:
    """The process-wide moderator: ``import_string(settings.CHAT_MODERATOR)()``, built on first
    use (the local moderator loads its models then: ~1-2 s; see ``moderator_warm``) and cached.
    Raises ImportError / the constructor's exception if it cannot be built."""
    global _moderator
    if _moderator is None:
        with _lock:
            if _moderator is None:
                _moderator = import_string(settings.CHAT_MODERATOR)()
    return _moderator


def moderator_reset() -> None:
    """Forget the process-wide moderator (tests that change ``settings.CHAT_MODERATOR``)."""
    global _moderator
    with _lock:
        _moderator = None


def moderator_warm() -> Moderator:
    """Build the moderator now (at server start), so the first turn's check is not the one that
    loads the classifiers and runs into the timeout. Returns it; raises like ``moderator()``."""
    return moderator()


def _pool() -> ThreadPoolExecutor:
    """The moderation worker threads. Separate from the default executor so checks never queue
    behind unrelated blocking work; a few threads, because the checks are CPU-bound and a
    timed-out check keeps its thread until it returns."""
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                workers = int(settings.CHAT_MODERATION_THREADS)
                _executor = ThreadPoolExecutor(max_workers=workers,
                                               thread_name_prefix="moderation")
    return _executor


class _Queued(Exception):
    """A check waited ``CHAT_MODERATION_QUEUE_S`` for a worker thread and never started."""


def _failed(gate: str, policy: Policy, error: str, mod: Moderator | None) -> Verdict:
    flagged = not policy.fail_open
    return Verdict(
        flagged=flagged,
        categories=("moderation_unavailable",) if flagged else (),
        scores={},
        classifier=getattr(mod, "name", None) or settings.CHAT_MODERATOR,
        version=getattr(mod, "version", None) or "unknown",
        gate=gate,
        error=error,
    )


async def acheck(gate: str, text: str, policy: Policy, *,
                 timeout_s: float | None = None) -> Verdict:
    """Check ``text`` at ``gate`` (``"input"``: ``check_input``; ``"output"``: ``check_output``)
    under ``policy`` on a moderation worker thread, waiting at most ``timeout_s`` seconds
    (default ``settings.CHAT_MODERATION_TIMEOUT_S``) from when the check starts on its thread,
    after at most ``settings.CHAT_MODERATION_QUEUE_S`` for a free thread (a burst of checks on
    a small machine queues: that wait is load, not a hung classifier, so it does not count
    against the timeout). Never raises for a classifier failure:

    - the moderator's verdict (its ``gate`` set to ``gate``) when the check returns in time;
    - when it raises (building the moderator included), times out or never gets a thread: a
      verdict with ``error`` saying why, flagged ``("moderation_unavailable",)`` unless
      ``policy.fail_open`` (then clean but still carrying the error); counted in
      ``chat_moderation_failures_total{gate, reason="error"|"timeout"|"queue"}`` (PF-M2).

    Every call counts in ``chat_moderation_checks_total{gate, result=clean|flagged|failed}``
    and ``chat_moderation_seconds{gate}``; flagged categories in
    ``chat_moderation_flagged_total{gate, category}``. A timed-out check is not interrupted (a
    thread cannot be): its result is discarded when it ends. Raises ValueError for an unknown
    gate (a programming error, not a classifier failure).
    """
    if gate not in GATES:
        raise ValueError(f"unknown moderation gate {gate!r}; expected one of {GATES}")
    timeout = settings.CHAT_MODERATION_TIMEOUT_S if timeout_s is None else timeout_s
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    mod: Moderator | None = _moderator
    try:
        if mod is None:
            # First use in this process: loading the classifiers is not the check, so it is not
            # held to the check's timeout (moderator_warm() at start avoids this wait).
            mod = await loop.run_in_executor(_pool(), moderator)
            started = time.perf_counter()
        check = mod.check_input if gate == "input" else mod.check_output
        running = asyncio.Event()
        abandoned = threading.Event()  # set when the wait for a thread gave up: never run

        def run() -> Verdict | None:
            if abandoned.is_set():
                return None
            loop.call_soon_threadsafe(running.set)
            return check(text, policy)

        future = loop.run_in_executor(_pool(), run)
        try:
            # Waiting for a worker thread is load, not a broken classifier: it has its own,
            # longer limit, and the check's timeout counts from when the check starts.
            await asyncio.wait_for(running.wait(), settings.CHAT_MODERATION_QUEUE_S)
        except TimeoutError:
            abandoned.set()  # a thread that picks it up later returns at once
            future.cancel()
            raise _Queued from None
        verdict = await asyncio.wait_for(future, timeout)
        if not isinstance(verdict, Verdict):
            raise TypeError(
                f"{type(mod).__name__} returned {type(verdict).__name__}, not a Verdict"
            )
        verdict = replace(verdict, gate=gate)
        result = "flagged" if verdict.flagged else "clean"
    except _Queued:
        queue_s = settings.CHAT_MODERATION_QUEUE_S
        verdict = _failed(gate, policy, f"busy: no worker free within {queue_s:g} s", mod)
        metrics.MODERATION_FAILURES.labels(gate=gate, reason="queue").inc()
        logger.warning("%s moderation check waited %g s for a worker (%s)", gate, queue_s,
                       "let through: fail-open" if policy.fail_open else "refused: fail closed")
        result = "failed"
    except TimeoutError:
        verdict = _failed(gate, policy, f"timeout: no verdict within {timeout:g} s", mod)
        metrics.MODERATION_FAILURES.labels(gate=gate, reason="timeout").inc()
        logger.warning("%s moderation check timed out after %g s (%s)", gate, timeout,
                       "let through: fail-open" if policy.fail_open else "refused: fail closed")
        result = "failed"
    except Exception as exc:  # noqa: BLE001 - any classifier failure fails closed (PF-M2)
        verdict = _failed(gate, policy, f"error: {type(exc).__name__}: {exc}"[:500], mod)
        metrics.MODERATION_FAILURES.labels(gate=gate, reason="error").inc()
        logger.exception("%s moderation check failed (%s)", gate,
                         "let through: fail-open" if policy.fail_open else "refused: fail closed")
        result = "failed"
    metrics.MODERATION_SECONDS.labels(gate=gate).observe(time.perf_counter() - started)
    metrics.MODERATION_CHECKS.labels(gate=gate, result=result).inc()
    for category in verdict.categories:
        metrics.MODERATION_FLAGGED.labels(gate=gate, category=category).inc()
    return verdict
