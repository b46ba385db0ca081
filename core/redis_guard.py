"""Redis access with short timeouts and a circuit breaker: Redis down is a degraded mode, not an
outage (issue 4, "Hot cache").

Every Redis use in the product goes through :func:`acall` / :func:`call` (or checks
:func:`allow` and reports :func:`failed` / :func:`succeeded` itself, for long-lived
connections). Each one names its *part* and a fallback, so a dead Redis costs a feature, never a
turn:

============== =====================================================================
part           what happens while Redis is unavailable
============== =====================================================================
``cache``      the hot conversation cache is skipped; history is read from PostgreSQL
               (conversations/cache.py). Entries that missed writes meanwhile are
               recognised as stale afterwards and refilled.
``turnlog``    answers still stream from the generating process's in-memory TurnStream,
               but are not mirrored, so they cannot be resumed on another process or after
               the generating process lost them; a resume that needs Redis gets a clear
               503 / ``error`` event (conversations/turnlog.py).
``lock``       the one-generating-turn-per-conversation lock falls back to the
               process-local check (conversations/answer_lock.py; conversations/locks.py
               ``ensure_idle``).
``cancel``     a cancel cannot reach another process; the pub/sub listener reconnects by
               itself once Redis is back (conversations/cancels.py).
``idempotency`` Idempotency-Key records are kept in this process only (api/idempotency.py).
``writeback``  finished answers are inserted synchronously (conversations/writeback.py).
``ratelimit``  (issue 5) limits fail open: :func:`rate_limit_fail_open`.
``health``     ``/healthz`` reports ``"redis": "degraded"`` (still 200: not unready).
============== =====================================================================

Each failure is logged (once per part per outage, so an outage does not flood the log) and
counted in ``chat_redis_unavailable_total{part}`` (core/metrics.py).

**Timeouts.** Connecting gives up after ``settings.CHAT_REDIS_CONNECT_TIMEOUT_S`` (0.5 s) and a
reply after ``settings.CHAT_REDIS_SOCKET_TIMEOUT_S`` (2 s). A connection error is retried once at
once (a pooled connection may be a stale socket from before a Redis restart); a timeout is not.

**Circuit breaker.** A connection error or timeout opens the breaker for
``settings.CHAT_REDIS_BREAKER_OPEN_S`` (3 s): calls meanwhile fail at once without touching the
network (a dead Redis is paid for once, not on every call). After that one call is let through
as a probe; its success closes the breaker, its failure opens it again. So when Redis comes back
every path recovers by itself within a few seconds, without a restart. The breaker is per
process (shared by every thread and event loop in it). Error *replies* (``ResponseError``) fail
the call softly but do not open the breaker: Redis is up.

**Regions** (issue 20, "Region-scoped stores"). A region's conversation data (event logs, held
answers, hot cache, locks, tombstones) lives on its own Redis server,
``settings.CHAT_REGION_REDIS_URLS`` (region -> URL): every client and guarded call takes a
``region`` (None: the global ``settings.REDIS_URL``, which also holds rate-limit buckets,
idempotency records and the Celery broker; a region without a server of its own uses it too).
Each server has its own circuit breaker, so one region's outage degrades that region only;
:data:`breaker` is the global server's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import metrics

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What a Redis call can raise when Redis is unreachable or misbehaves (OSError: socket errors
# redis-py does not wrap).
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)
# The subset that means "Redis is unreachable" (opens the breaker).
_OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    asyncio.TimeoutError,
)


class RedisUnavailable(RedisConnectionError):
    """Redis could not be used for this call (it failed, or the circuit breaker is open).

    A subclass of redis-py's ``ConnectionError``, so ``except RedisError`` catches it too."""


class CircuitBreaker:
    """Closed (calls go through) until an outage error; then open for ``open_s`` seconds (calls
    refused at once); then one probe per ``open_s`` until a call succeeds. Thread-safe."""

    def __init__(
        self, open_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._open_s = open_s
        self._clock = clock
        self._lock = threading.Lock()
        self._opened_at: float | None = None  # None: closed
        self._retry_at = 0.0
        self.logged_parts: set[str] = set()  # parts that logged during the current outage

    @property
    def open_s(self) -> float:
        """Seconds calls are refused after an outage error (default:
        ``settings.CHAT_REDIS_BREAKER_OPEN_S``)."""
        if self._open_s is not None:
            return self._open_s
        return float(settings.CHAT_REDIS_BREAKER_OPEN_S)

    @property
    def is_open(self) -> bool:
        """Whether Redis is considered unavailable right now (degraded mode)."""
        return self._opened_at is not None

    def allow(self) -> bool:
        """Whether a call may go to Redis now (closed, or this is the probe after ``open_s``)."""
        if self._opened_at is None:
            return True
        with self._lock:
            if self._opened_at is None:
                return True
            now = self._clock()
            if now < self._retry_at:
                return False
            self._retry_at = now + self.open_s  # one probe per window
            return True

    def record_success(self) -> None:
        """A call succeeded: close the breaker (logs the recovery once)."""
        if self._opened_at is None:
            return
        with self._lock:
            if self._opened_at is None:
                return
            down_s = self._clock() - self._opened_at
            self._opened_at = None
            self.logged_parts.clear()
        metrics.REDIS_UP.set(1)
        logger.warning("Redis is reachable again after %.1f s: leaving degraded mode", down_s)

    def record_failure(self, exc: BaseException) -> None:
        """An outage error: open the breaker (or keep it open) for ``open_s`` seconds."""
        with self._lock:
            now = self._clock()
            self._retry_at = now + self.open_s
            if self._opened_at is not None:
                return
            self._opened_at = now
        metrics.REDIS_UP.set(0)
        metrics.REDIS_BREAKER_OPENED.inc()
        logger.warning(
            "Redis unavailable (%s: %s): degraded mode; history from PostgreSQL, streams not "
            "resumable elsewhere, locks process-local, rate limits open; retrying every %.0f s",
            type(exc).__name__, exc, self.open_s,
        )  # fmt: skip

    def reset(self) -> None:
        """Close the breaker without logging (tests)."""
        with self._lock:
            self._opened_at = None
            self._retry_at = 0.0
            self.logged_parts.clear()
        metrics.REDIS_UP.set(1)


breaker = CircuitBreaker()  # the global server's (settings.REDIS_URL)
_region_breakers: dict[str, CircuitBreaker] = {}  # a region server's URL -> its breaker


def url_for(region: str | None = None) -> str:
    """The Redis URL holding ``region``'s data: its ``settings.CHAT_REGION_REDIS_URLS`` entry,
    else (also for None) the global ``settings.REDIS_URL``."""
    if region is not None:
        url = getattr(settings, "CHAT_REGION_REDIS_URLS", {}).get(region)
        if url:
            return url
    return settings.REDIS_URL


def regions_with_servers() -> list[str | None]:
    """One region per distinct Redis server, the global one (None) first: for work done on every
    server (the write-back sweep, the cancel listener, purges)."""
    seen = {settings.REDIS_URL: None}
    for region in getattr(settings, "CHAT_REGION_REDIS_URLS", {}):
        seen.setdefault(url_for(region), region)
    return list(seen.values())


def breaker_for(region: str | None = None) -> CircuitBreaker:
    """The circuit breaker of the server holding ``region``'s data (:func:`url_for`)."""
    url = url_for(region)
    if url == settings.REDIS_URL:
        return breaker
    found = _region_breakers.get(url)
    if found is None:
        with _sync_lock:
            found = _region_breakers.setdefault(url, CircuitBreaker())
    return found


def allow(part: str, *, region: str | None = None) -> bool:
    """Whether ``part`` may call ``region``'s Redis now; if not, the skipped call is counted."""
    if breaker_for(region).allow():
        return True
    metrics.REDIS_UNAVAILABLE.labels(part=part).inc()
    return False


def available(*, region: str | None = None) -> bool:
    """Whether this process currently considers ``region``'s Redis reachable (breaker closed).
    Views use it to tell "not found" from "cannot know while Redis is down"."""
    return not breaker_for(region).is_open


def failed(part: str, exc: BaseException, fallback: str = "", *, region: str | None = None) -> None:
    """Report a failed call of ``part`` to ``region``'s Redis: count it, open that server's
    breaker on an outage error, and log it (once per part per outage; ``fallback`` says what
    the part does instead)."""
    metrics.REDIS_UNAVAILABLE.labels(part=part).inc()
    if isinstance(exc, _OUTAGE_ERRORS):
        server = breaker_for(region)
        server.record_failure(exc)
        if part in server.logged_parts:
            return
        server.logged_parts.add(part)
    logger.warning(
        "Redis call for %s failed (%s: %s)%s%s",
        part, type(exc).__name__, exc, f"; {fallback}" if fallback else "",
        f" [{region}'s server]" if url_for(region) != settings.REDIS_URL else "",
    )  # fmt: skip


def succeeded(*, region: str | None = None) -> None:
    """Report a successful call to ``region``'s Redis (closes its breaker after an outage)."""
    breaker_for(region).record_success()


_RAISE: Any = object()


def _unavailable(part: str, default: Any) -> Any:
    if default is _RAISE:
        raise RedisUnavailable(f"Redis is unavailable ({part})")
    return default


# --- clients --------------------------------------------------------------------------------------


def _connection_kwargs(retry_cls) -> dict:
    return {
        "socket_connect_timeout": settings.CHAT_REDIS_CONNECT_TIMEOUT_S,
        "socket_timeout": settings.CHAT_REDIS_SOCKET_TIMEOUT_S,
        # One immediate retry on a connection error only: a stale pooled socket after a Redis
        # restart reconnects; a timeout is not paid twice.
        "retry": retry_cls(NoBackoff(), 1, (RedisConnectionError,)),
    }


# Clients are kept per server URL (tests point processes at other servers).
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, aioredis.Redis]] = (
    weakref.WeakKeyDictionary()
)
_sync_clients: dict[str, redis.Redis] = {}
_sync_lock = threading.Lock()


def async_client(*, region: str | None = None) -> aioredis.Redis:
    """This event loop's asyncio client of ``region``'s Redis (:func:`url_for`; asyncio clients
    cannot cross loops), strings decoded. A blocking pool of ``settings.CHAT_REDIS_POOL_MAX``
    connections: a burst of readers waits (up to 10 s) for a connection instead of failing when
    the pool is at its size."""
    from redis.asyncio.retry import Retry  # noqa: PLC0415

    url = url_for(region)
    loop = asyncio.get_running_loop()
    clients = _async_clients.setdefault(loop, {})
    client = clients.get(url)
    if client is None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=settings.CHAT_REDIS_POOL_MAX,
            timeout=10,
            decode_responses=True,
            **_connection_kwargs(Retry),
        )
        client = clients[url] = aioredis.Redis(connection_pool=pool)
    return client


def async_client_for_blocking(
    read_timeout_s: float | None, *, region: str | None = None
) -> aioredis.Redis:
    """A new asyncio client of ``region``'s Redis for a long-lived blocking reader (XREAD BLOCK,
    pub/sub) whose reads may legitimately wait ``read_timeout_s`` seconds (None: forever);
    connect timeout as for the others."""
    from redis.asyncio.retry import Retry  # noqa: PLC0415

    kwargs = _connection_kwargs(Retry)
    kwargs["socket_timeout"] = read_timeout_s
    return aioredis.Redis.from_url(url_for(region), decode_responses=True, **kwargs)


def sync_client(*, region: str | None = None) -> redis.Redis:
    """The process's synchronous client of ``region``'s Redis (thread-safe pool, same short
    timeouts; replies are bytes). For sync code: selectors, services, Celery tasks."""
    from redis.retry import Retry  # noqa: PLC0415

    url = url_for(region)
    client = _sync_clients.get(url)
    if client is None:
        with _sync_lock:
            client = _sync_clients.get(url)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    max_connections=settings.CHAT_REDIS_POOL_MAX,
                    **_connection_kwargs(Retry),
                )
                _sync_clients[url] = client
    return client


# --- guarded calls ----------------------------------------------------------------------------


async def acall(
    part: str,
    fn: Callable[[aioredis.Redis], Awaitable[T]],
    *,
    default: Any = _RAISE,
    fallback: str = "",
    region: str | None = None,
) -> T:
    """Run ``await fn(client)`` with this loop's client of ``region``'s Redis (None: the global
    one) unless that server's breaker is open.

    On a Redis failure (or an open breaker) the call is counted and logged (see :func:`failed`)
    and ``default`` is returned; without a ``default`` it raises :class:`RedisUnavailable`.
    """
    if not allow(part, region=region):
        return _unavailable(part, default)
    try:
        result = await fn(async_client(region=region))
    except REDIS_ERRORS as exc:
        failed(part, exc, fallback, region=region)
        return _unavailable(part, default)
    succeeded(region=region)
    return result


def call(
    part: str,
    fn: Callable[[redis.Redis], T],
    *,
    default: Any = _RAISE,
    fallback: str = "",
    region: str | None = None,
) -> T:
    """:func:`acall` for synchronous code (``fn(client)`` with :func:`sync_client`)."""
    if not allow(part, region=region):
        return _unavailable(part, default)
    try:
        result = fn(sync_client(region=region))
    except REDIS_ERRORS as exc:
        failed(part, exc, fallback, region=region)
        return _unavailable(part, default)
    succeeded(region=region)
    return result


async def aping() -> bool:
    """Whether Redis answers PING now (a probe; respects the breaker). For health endpoints."""
    return bool(await acall("health", lambda r: r.ping(), default=False))


# --- rate limits (issue 5) --------------------------------------------------------------------


async def rate_limit_fail_open(
    limit: str, fn: Callable[[aioredis.Redis], Awaitable[T]]
) -> T | None:
    """Run a rate-limit check ``fn(client)`` (e.g. a token-bucket Lua script); return its result,
    or None when Redis is unavailable: the caller lets the request through (fail open: a Redis
    outage must not turn into a chat outage). Each such request is counted in
    ``chat_rate_limit_fail_open_total{limit}`` and the outage is logged (once per outage).

    Issue 5's limiter is to call this for its RPM / TPM buckets: ``None`` means "allowed,
    unmetered" (so ``fn`` itself must not return None).
    """
    result = await acall(
        "ratelimit", fn, default=None, fallback="rate limits fail open (requests are not metered)"
    )
    if result is None:
        metrics.RATE_LIMIT_FAIL_OPEN.labels(limit=limit).inc()
    return result
