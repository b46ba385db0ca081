"""Circuit breakers for primary databases: a region whose primary is down is a degraded mode,
not a string of 500s (issue 20 part 4, "Outage region"; the shape of core/redis_guard.py).

One breaker per primary alias (``default``, ``region_us-east``, ...), per process (shared by its
threads). Every write service of a conversation passes :func:`primary_ensure` first
(core/regions.py ``atomic``), and so does every conversation creation
(``regions.region_for_new_conversation``):

- **Closed** (the normal state): the write connects to the primary. A failed connect is counted;
  ``settings.CHAT_REGION_BREAKER_FAILURES`` of them within ``CHAT_REGION_BREAKER_WINDOW_S``
  seconds open the breaker. The write itself is refused with :class:`PrimaryDown` (503).
- **Open**: writes to that primary are refused at once, without touching the network, for
  ``CHAT_REGION_BREAKER_OPEN_S`` seconds (the ``Retry-After`` they carry).
- **Half-open**: after the cool-down one write is let through as a probe; its connect closing
  the breaker, its failure opening it again for another cool-down.

Degraded modes while a region's breaker is open, each named and counted (core/metrics.py):

=================== =======================================================================
what                what happens
=================== =======================================================================
new conversation    created in ``settings.CHAT_REGION_FAILOVER[region]`` when residency
                    allows (``regions.region_for_new_conversation``); ``/v1`` says so in
                    ``region``. Counted in ``chat_region_failover_creates_total``.
                    Not allowed (no failover region, or an organisation whose residency
                    zone it leaves): 503 + ``Retry-After``, never a conversation elsewhere.
write to an         503 + ``Retry-After`` (:class:`PrimaryDown`), counted in
existing one        ``chat_region_connect_failures_total{result="refused"}``.
history read        served by the region's replicas, also for users who wrote a moment ago
                    (read-your-writes would send them to the primary;
                    core/dbrouter.py).
=================== =======================================================================

Connect failures are counted in ``chat_region_connect_failures_total{result="failed"}``; the
breaker's state is ``chat_region_breaker_open{region}``. Only failed *connects* count: an error
on a query of a live server says nothing about whether the server is up.

Patroni failover inside a region (tests/patroni_cluster.py) is below this: the region's URL
names every member, so once the standby is promoted connects succeed again and the probe closes
the breaker.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

from core import metrics
from core.errors import ApiError

logger = logging.getLogger(__name__)


class PrimaryDown(ApiError):
    """A write needs a primary that is down: 503 with an integer ``Retry-After`` >= 1 (seconds
    until the breaker's next probe), rendered by the ``/v1`` views like every ApiError."""

    def __init__(self, *, region: str, retry_after_s: int, message: str | None = None):
        super().__init__(
            503,
            "unavailable",
            message
            or (
                f"The {region} region's database is unavailable, so this conversation cannot "
                f"be changed right now; its history can still be read. Try again in "
                f"{retry_after_s} s."
            ),
            {"Retry-After": str(retry_after_s)},
            {"region": region},
        )
        self.region = region
        self.retry_after_s = retry_after_s


class Breaker:
    """The state of one primary's breaker (see the module docstring). ``clock`` gives seconds
    (monotonic); the thresholds are read from settings at each decision unless given."""

    def __init__(
        self,
        *,
        failures: int | None = None,
        window_s: float | None = None,
        open_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._failures_needed, self._window_s, self._open_s = failures, window_s, open_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failed_at: collections.deque[float] = collections.deque()
        self._opened_at: float | None = None
        self._probing = False

    @property
    def failures_needed(self) -> int:
        return self._failures_needed or settings.CHAT_REGION_BREAKER_FAILURES

    @property
    def window_s(self) -> float:
        return (
            self._window_s if self._window_s is not None else settings.CHAT_REGION_BREAKER_WINDOW_S
        )

    @property
    def open_s(self) -> float:
        return self._open_s if self._open_s is not None else settings.CHAT_REGION_BREAKER_OPEN_S

    @property
    def is_open(self) -> bool:
        """Open or half-open: the primary was found down and has not answered since."""
        return self._opened_at is not None

    def allow(self) -> bool:
        """Whether a connect may be tried now: closed, or the one probe after the cool-down."""
        with self._lock:
            if self._opened_at is None:
                return True
            if self._probing or self._clock() - self._opened_at < self.open_s:
                return False
            self._probing = True
            return True

    def failed(self) -> bool:
        """Record a failed connect; returns whether the breaker is open after it."""
        with self._lock:
            now = self._clock()
            if self._probing or self._opened_at is not None:
                self._opened_at, self._probing = now, False  # the probe failed: cool down again
                return True
            self._failed_at.append(now)
            while self._failed_at and now - self._failed_at[0] > self.window_s:
                self._failed_at.popleft()
            if len(self._failed_at) >= self.failures_needed:
                self._opened_at = now
                self._failed_at.clear()
            return self._opened_at is not None

    def succeeded(self) -> None:
        """Record a successful connect: the breaker closes and forgets earlier failures."""
        with self._lock:
            self._failed_at.clear()
            self._opened_at, self._probing = None, False

    def retry_after_s(self) -> int:
        """Whole seconds (>= 1) until the next probe may run."""
        if self._opened_at is None:
            return 1
        return max(1, math.ceil(self.open_s - (self._clock() - self._opened_at)))


_breakers: dict[str, Breaker] = {}
_breakers_lock = threading.Lock()


def breaker(alias: str) -> Breaker:
    """This process's breaker for the primary alias ``alias``."""
    with _breakers_lock:
        if alias not in _breakers:
            _breakers[alias] = Breaker()
        return _breakers[alias]


def reset() -> None:
    """Forget every breaker's state (tests)."""
    with _breakers_lock:
        _breakers.clear()


def region_of_alias(alias: str) -> str:
    """The region whose primary ``alias`` is (the default region for ``default``)."""
    for region, region_alias in getattr(settings, "CHAT_REGION_DATABASES", {}).items():
        if region_alias == alias:
            return region
    return settings.CHAT_DEFAULT_REGION if alias == DEFAULT_DB_ALIAS else alias


def is_down(alias: str) -> bool:
    """Whether the breaker of primary ``alias`` is open (reads then stay on replicas)."""
    found = _breakers.get(alias)
    return found is not None and found.is_open


def primary_ensure(alias: str) -> None:
    """Make sure a write can reach primary ``alias``: connect (or reuse the open connection)
    unless its breaker is open. Raises PrimaryDown (503, Retry-After) when the breaker is open
    or the connect failed; a failed connect is counted towards opening it."""
    state = breaker(alias)
    region = region_of_alias(alias)
    if not state.allow():
        metrics.REGION_CONNECT_FAILURES.labels(region=region, result="refused").inc()
        raise PrimaryDown(region=region, retry_after_s=state.retry_after_s())
    try:
        connections[alias].ensure_connection()
    except OperationalError as exc:
        metrics.REGION_CONNECT_FAILURES.labels(region=region, result="failed").inc()
        was_open = state.is_open
        if state.failed():
            metrics.REGION_BREAKER_OPEN.labels(region=region).set(1)
            if not was_open:
                logger.warning("the %s primary (%s) is down, breaker open: %s", region, alias, exc)
        raise PrimaryDown(region=region, retry_after_s=state.retry_after_s()) from None
    if state.is_open:
        logger.warning("the %s primary (%s) answers again, breaker closed", region, alias)
    state.succeeded()
    metrics.REGION_BREAKER_OPEN.labels(region=region).set(0)
