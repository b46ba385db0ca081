"""The gateway's admission queue: at most ``max_num_seqs`` requests in an engine at once.

vLLM schedules by priority only among requests it holds; once a request runs it keeps its batch
slot to the end. So when free-tier streams fill every slot, a paid turn waits for a free one to
finish, however high its priority (DESIGN.md, "Checked: scheduling_policy=priority ... only
matters when requests wait"). The gateway therefore admits requests to the engine itself, one
:class:`Admission` per engine:

- **Slots.** At most ``max_num_seqs`` requests hold a slot (the engine's continuous-batching
  width: ``engine.max_num_seqs`` when the engine has one, else ``settings.CHAT_MAX_NUM_SEQS``).
  The rest wait here, where they cost nothing and can be shed (inference/router.py ``shed``).
- **Reserved slots.** In ``"priority"`` mode (``settings.CHAT_SCHEDULING``), a request with
  ``reserved_ok=False`` (free tier, background jobs) is admitted only while more than
  ``R = settings.CHAT_RESERVED_SLOTS`` slots are free, so R slots stay idle for paid turns
  whoever holds the others: a paid turn finds a slot at once even when free traffic saturates
  the engine. Free requests therefore hold at most ``slots - R``, and fewer while paid turns
  hold some of those (a fixed ``slots - R`` cap for free requests was measured first: with
  more paid turns in flight than R, paid turns queued behind the 12 free ones and paid TTFT p99
  was 1.36 s, bench/priority_bench.py). So that free traffic never stops outright under a paid
  flood, one free request may run whenever none does.
- **Order.** ``"priority"`` mode: by (priority, arrival), lower priority first (vLLM's
  convention); ``"fcfs"`` mode: by arrival only, and no reserved slots (the baseline the
  priority benchmark compares against, bench/priority_bench.py).

- **The cap.** ``limit()`` is how many of the slots may be held now: the slots, within the
  operator's (or a test's) :meth:`set_limit` ceiling, and, while ``settings.CHAT_ADMISSION_
  ADAPTIVE`` is on, within the adaptive cap of this engine's :class:`inference.limiter.
  TpotLimiter` (issue 19). Running streams feed it TPOT samples (:meth:`observe_tpot`, from
  inference/serving.py); it cuts the cap when admitted streams are slower than the TPOT target
  and raises it when there is room and requests wait behind it. Lowering the cap preempts
  nobody: running requests finish, the queue grows, and load shedding (inference/router.py
  ``shed``) reads that queue. Its changes count in ``chat_admission_limit_changes_total``.
- **Expected wait.** :meth:`expected_wait_s` estimates how long a request arriving now would
  wait (its place in the queue x the mean slot hold time / the cap), so a free turn that would
  wait past ``CHAT_SHED_FREE_WAIT_S`` is shed at the door (a 503 before streaming starts).
- **Across the gateway -> engine hop.** Gateways without an engine keep no queue of their own
  in front of a remote engine (inference/serving.py): the engine process's queue is this one,
  and a forwarded turn arrives with its tier and priority (api/completions.py, the service-only
  ``admission`` field), so paid turns keep the reserved slots there too. The depths are
  published under vLLM's names (``vllm:num_requests_waiting`` / ``_running``) for the gateways'
  shedding (DESIGN.md, "Production topology").
- **Grants.** The last ``GRANT_LOG`` grants (tag, priority, reserved_ok, seconds waited) are kept
  in ``grants`` and logged at INFO, so an operator (and the production-topology test) can see
  who was admitted in what order.

A waiter cancelled while it waits (a Stop, a client gone) leaves the queue at once; one
cancelled just after it was granted a slot gives the slot back; so no slot leaks and nobody
behind it is stuck. Settings are read on every decision, so tests (and operators' reloads)
take effect at once.

Single event loop: one Admission serves the coroutines of one loop (the server process's).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from django.conf import settings

from core import metrics
from inference.limiter import LimiterConfig, TpotLimiter

logger = logging.getLogger(__name__)

SCHEDULING_MODES = ("priority", "fcfs")
GRANT_LOG = 256  # grants kept in Admission.grants
HOLD_EWMA_ALPHA = 0.2  # weight of the newest slot hold time in the mean (expected_wait_s)


@dataclass(order=True)
class _Waiter:
    key: tuple[int, ...]
    reserved_ok: bool = field(compare=False)
    future: asyncio.Future = field(compare=False)
    tag: str = field(default="", compare=False)
    queued_at: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Grant:
    """One admission: ``tag`` (the caller's label, e.g. the request id), its ``priority`` and
    ``reserved_ok``, ``waited_s`` seconds in the queue, and ``arrival`` / ``granted``: the
    positions of its arrival and of its grant in one sequence of queue events (so request A
    was still waiting when B arrived iff ``A.arrival < B.arrival < A.granted``: order without
    clocks)."""

    tag: str
    priority: int
    reserved_ok: bool
    waited_s: float
    arrival: int = 0
    granted: int = 0


class Admission:
    """The admission queue of one engine (see the module docstring).

    ``slots`` overrides the slot count (default: read from settings on every decision);
    ``label`` names the engine in ``chat_admission_waiting{engine}``.
    """

    def __init__(self, *, slots: int | None = None, label: str = "default", model_name: str = "") -> None:
        self._slots = slots
        self._limit: int | None = None
        self.label = label
        self.model_name = model_name or label
        self.grants: collections.deque[Grant] = collections.deque(maxlen=GRANT_LOG)
        self._heap: list[_Waiter] = []
        self._sequence = itertools.count()  # arrivals and grants, in order (Grant.arrival, .granted)
        self._running = 0
        self._running_unreserved = 0  # slots held by reserved_ok=False requests
        self._waiting = 0  # live (not cancelled, not granted) waiters in the heap
        self._limiter = TpotLimiter(initial=self.slots)
        self._hold_s: float | None = None  # moving mean of slot hold times, seconds
        self._publish()

    # --- configuration, read at decision time ----------------------------------------------

    @property
    def slots(self) -> int:
        """How many requests may hold a slot at once (>= 1)."""
        return max(1, int(self._slots if self._slots is not None else settings.CHAT_MAX_NUM_SEQS))

    def ceiling(self) -> int:
        """The most slots that may be held: :meth:`set_limit`'s value within 1..``slots``
        (default: all of them). The adaptive cap moves below it."""
        return self.slots if self._limit is None else max(1, min(self._limit, self.slots))

    def limit(self) -> int:
        """How many slots may be held now: the adaptive cap within :meth:`ceiling` while
        :meth:`adaptive` is on, else the ceiling."""
        if self.adaptive() and self._limiter.last is not None:  # fully open until a decision
            return max(1, min(self._limiter.limit, self.ceiling()))
        return self.ceiling()

    def set_limit(self, limit: int | None) -> None:
        """Set the ceiling of the running cap (None: back to ``slots``); raising it admits
        waiters at once, lowering it lets running requests finish (nobody is preempted)."""
        self._limit = None if limit is None else int(limit)
        self._dispatch()

    def reset_cap(self) -> None:
        """Forget the adaptive cap: fully open (the ceiling) until the limiter's next decision
        (after a configuration change; the engine bench starts each phase so)."""
        self._limiter = TpotLimiter(initial=self.slots)
        self._dispatch()

    @staticmethod
    def adaptive() -> bool:
        """``settings.CHAT_ADMISSION_ADAPTIVE``: whether the cap follows measured TPOT."""
        return bool(getattr(settings, "CHAT_ADMISSION_ADAPTIVE", False))

    def observe_tpot(self, tpot_s: float) -> None:
        """One TPOT sample of a stream holding a slot (seconds per token over its last few
        tokens, inference/serving.py). With :meth:`adaptive` on, the limiter may move the cap
        (counted in ``chat_admission_limit_changes_total{engine, direction}``, logged at
        INFO); raising it admits waiters at once. Off: ignored. With ``CHAT_ADMISSION_*``
        settings out of range (system check chat.E005) the cap stays where it is and the error
        is logged: a bad setting must not break the streams that report to it."""
        if not self.adaptive():
            return
        metrics.ADMISSION_TPOT.labels(engine=self.label).observe(tpot_s)
        try:
            config = LimiterConfig.from_settings()
        except (TypeError, ValueError) as exc:
            logger.error("admission %s: the adaptive cap is not adjusted: %s", self.label, exc)
            return
        decision = self._limiter.observe(
            tpot_s, running=self._running, waiting=self._waiting, max_limit=self.ceiling(),
            config=config,
        )  # fmt: skip
        if decision is None:
            return
        changes = metrics.ADMISSION_LIMIT_CHANGES
        changes.labels(engine=self.label, direction=decision.direction).inc()
        logger.info(
            "admission %s: cap %s %d -> %d (window TPOT p90 %.1f ms); %d running, %d waiting",
            self.label, decision.direction, decision.before, decision.after,
            decision.tpot_s * 1000, self._running, self._waiting,
        )  # fmt: skip
        self._dispatch()

    def expected_wait_s(self) -> float:
        """Seconds a request arriving now would wait for a slot, estimated: 0 while one is free
        for it; else its place behind everyone queued, times the mean slot hold time (a moving
        average of finished requests') over the cap (slots free up about cap / hold time per
        second). 0 before any request has finished (no evidence)."""
        places = self._waiting + 1 - max(0, self.limit() - self._running)
        if places <= 0 or self._hold_s is None:
            return 0.0
        return places * self._hold_s / self.limit()

    @staticmethod
    def mode() -> str:
        """``settings.CHAT_SCHEDULING``: ``"priority"`` or ``"fcfs"``. Raises ValueError for
        anything else (a typo must not silently turn tier isolation off)."""
        mode = getattr(settings, "CHAT_SCHEDULING", "priority")
        if mode not in SCHEDULING_MODES:
            raise ValueError(f"CHAT_SCHEDULING must be one of {SCHEDULING_MODES}, not {mode!r}")
        return mode

    def reserved(self) -> int:
        """Slots kept free for ``reserved_ok`` requests: ``CHAT_RESERVED_SLOTS`` in priority
        mode (at most ``slots - 1``), 0 in fcfs mode."""
        if self.mode() == "fcfs":
            return 0
        return min(max(0, int(getattr(settings, "CHAT_RESERVED_SLOTS", 0))), self.limit() - 1)

    # --- state ------------------------------------------------------------------------------

    def waiting(self) -> int:
        """Requests queued for a slot now (all tiers)."""
        return self._waiting

    def running(self) -> int:
        """Requests holding a slot now."""
        return self._running

    @asynccontextmanager
    async def slot(self, *, priority: int, reserved_ok: bool, tag: str = "") -> AsyncIterator[None]:
        """Hold one engine slot for the body of the ``async with``.

        ``priority``: lower is served first (priority mode; ignored in fcfs mode).
        ``reserved_ok``: whether the request may take the reserved slots (paid / enterprise
        user turns); False for free-tier turns and background jobs.
        ``tag``: a label for the grant log (the request id).
        Waits (without limit) while no slot is available; cancelling the waiting task removes
        it from the queue (CancelledError propagates). The slot is released however the body
        ends (return, exception, cancellation, generator close).
        """
        await self._acquire(priority=priority, reserved_ok=reserved_ok, tag=tag)
        granted_at = time.monotonic()
        try:
            yield
        finally:
            held = time.monotonic() - granted_at
            self._hold_s = held if self._hold_s is None else (
                HOLD_EWMA_ALPHA * held + (1 - HOLD_EWMA_ALPHA) * self._hold_s
            )  # fmt: skip
            self._release(reserved_ok)

    async def _acquire(self, *, priority: int, reserved_ok: bool, tag: str) -> None:
        # fcfs: everyone at one priority, so arrival alone decides.
        key = (0 if self.mode() == "fcfs" else priority, next(self._sequence))
        loop = asyncio.get_running_loop()
        waiter = _Waiter(key, reserved_ok, loop.create_future(), tag, time.monotonic())
        heapq.heappush(self._heap, waiter)
        self._waiting += 1
        self._dispatch()  # room now: granted here, and the await below returns at once
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                # Granted, then cancelled before it could run: give the slot back.
                self._release(reserved_ok)
            else:
                waiter.future.cancel()  # marks it dead; _dispatch drops it from the heap
                self._waiting -= 1
                if len(self._heap) > 2 * self._waiting + 16:  # many dead entries: drop them
                    self._heap = [w for w in self._heap if not w.future.done()]
                    heapq.heapify(self._heap)
                self._publish()
                # It may have been the head holding others back; let whoever fits go now.
                self._dispatch()
            raise

    def _fits(self, reserved_ok: bool) -> bool:
        if self._running >= self.limit():
            return False
        if reserved_ok or self._running < self.limit() - self.reserved():
            return True
        return self._running_unreserved == 0  # never starve free traffic outright

    def _take(self, reserved_ok: bool) -> None:
        self._running += 1
        if not reserved_ok:
            self._running_unreserved += 1
        self._publish()

    def _release(self, reserved_ok: bool) -> None:
        self._running -= 1
        if not reserved_ok:
            self._running_unreserved -= 1
        self._publish()
        self._dispatch()

    def _dispatch(self) -> None:
        """Grant slots to waiters in queue order while there is room. A waiter kept out only by
        the reserved-slot rule is skipped (it cannot run yet), so it never blocks a paid
        request behind it; skipped waiters keep their place."""
        skipped: list[_Waiter] = []
        while self._heap and self._running < self.limit():
            waiter = heapq.heappop(self._heap)
            if waiter.future.done():  # cancelled while waiting
                continue
            if not self._fits(waiter.reserved_ok):
                skipped.append(waiter)
                continue
            self._take(waiter.reserved_ok)
            self._waiting -= 1
            waiter.future.set_result(None)
            self._log_grant(waiter)
        for waiter in skipped:
            heapq.heappush(self._heap, waiter)
        self._publish()

    def _log_grant(self, waiter: _Waiter) -> None:
        grant = Grant(
            waiter.tag, waiter.key[0], waiter.reserved_ok, time.monotonic() - waiter.queued_at,
            arrival=waiter.key[-1], granted=next(self._sequence),
        )  # fmt: skip
        self.grants.append(grant)
        logger.info(
            "admission %s: granted %s (priority %d, reserved_ok %s) after %.3f s; %d running, %d waiting",
            self.label, grant.tag or "-", grant.priority, grant.reserved_ok, grant.waited_s,
            self._running, self._waiting,
        )  # fmt: skip

    def _publish(self) -> None:
        metrics.ADMISSION_WAITING.labels(engine=self.label).set(self._waiting)
        metrics.ADMISSION_RUNNING.labels(engine=self.label).set(self._running)
        metrics.ADMISSION_LIMIT.labels(engine=self.label).set(self.limit())
        metrics.ENGINE_WAITING.labels(model_name=self.model_name).set(self._waiting)
        metrics.ENGINE_RUNNING.labels(model_name=self.model_name).set(self._running)


_admissions: dict[int, tuple[weakref.ref, Admission]] = {}


def engine_label(engine: object) -> str:
    """A short, stable name for an engine in metrics: its remote URL + model, its model folder's
    name, or its class name."""
    url = getattr(engine, "base_url", "")
    if url:
        return f"{url} {getattr(engine, 'model', '')}".strip()
    path = getattr(engine, "model_path", "")
    if path:
        return os.path.basename(str(path).rstrip("/")) or str(path)
    return type(engine).__name__


def served_model_name(engine: object) -> str:
    """The model name requests name when they reach ``engine`` (vLLM's ``model_name`` label):
    a remote engine's ``model``; the process's own model folder serves
    ``settings.CHAT_MODEL_NAME``; another folder its name."""
    model = getattr(engine, "model", "")
    if isinstance(model, str) and model:
        return model
    path = str(getattr(engine, "model_path", "") or "")
    if path and os.path.realpath(path) == os.path.realpath(str(settings.CHAT_MODEL_PATH)):
        return settings.CHAT_MODEL_NAME
    return engine_label(engine)


def admission_for(engine: object) -> Admission:
    """The admission queue of ``engine`` (created on first use, one per engine object, dropped
    with the engine). Its slot count is ``engine.max_num_seqs`` when the engine has one (the
    width it was started with), else ``settings.CHAT_MAX_NUM_SEQS`` at each decision."""
    entry = _admissions.get(id(engine))
    if entry is not None and entry[0]() is engine:
        return entry[1]
    width = getattr(engine, "max_num_seqs", None)
    admission = Admission(
        slots=width if isinstance(width, int) and width > 0 else None,
        label=engine_label(engine),
        model_name=served_model_name(engine),
    )
    key = id(engine)

    def forget(ref: weakref.ref, key: int = key) -> None:
        if _admissions.get(key, (None,))[0] is ref:
            del _admissions[key]

    _admissions[key] = (weakref.ref(engine, forget), admission)
    return admission
