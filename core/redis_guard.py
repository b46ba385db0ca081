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
               process-local check (conversations/streaming.py ``ensure_idle``).
``cancel``     a cancel cannot reach another process; the pub/sub listener reconnects by
               itself once Redis is back.
``idempotency`` Idempotency-Key records are kept in this process only (api/idempotency.py).
``writeback``  finished answers are inserted synchronously (conversations/writeback.py).
``ratelimit``  (issue 5) limits fail open: :func:`rate_limit_fail_open`.
``health``     ``/healthz`` reports ``"redis": "degraded"`` (still 200: not unready).
============== =====================================================================

Each failure is logged (once per part per outage, so an outage does not flood the log) and
counted in ``chat_redis_unavailable_total{part}`` (chatsite/metrics.py).

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

from chatsite import metrics

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


breaker = CircuitBreaker()


def allow(part: str) -> bool:
    """Whether ``part`` may call Redis now; if not, the skipped call is counted."""
    if breaker.allow():
        return True
    metrics.REDIS_UNAVAILABLE.labels(part=part).inc()
    return False


def available() -> bool:
    """Whether this process currently considers Redis reachable (breaker closed). Views use it
    to tell "not found" from "cannot know while Redis is down"."""
    return not breaker.is_open


def failed(part: str, exc: BaseException, fallback: str = "") -> None:
    """Report a failed Redis call of ``part``: count it, open the breaker on an outage error,
    and log it (once per part per outage; ``fallback`` says what the part does instead)."""
    metrics.REDIS_UNAVAILABLE.labels(part=part).inc()
    if isinstance(exc, _OUTAGE_ERRORS):
        breaker.record_failure(exc)
        if part in breaker.logged_parts:
            return
        breaker.logged_parts.add(part)
    logger.warning(
        "Redis call for %s failed (%s: %s)%s",
        part, type(exc).__name__, exc, f"; {fallback}" if fallback else "",
    )  # fmt: skip


def succeeded() -> None:
    """Report a successful Redis call (closes the breaker after an outage)."""
    breaker.record_success()


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


# Clients are kept per settings.REDIS_URL (tests point processes at other servers).
_async_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[str, aioredis.Redis]
] = weakref.WeakKeyDictionary()
_sync_clients: dict[str, redis.Redis] = {}
_sync_lock = threading.Lock()


def async_client() -> aioredis.Redis:
    """This event loop's asyncio Redis client (asyncio clients cannot cross loops), strings
    decoded. A blocking pool of ``settings.CHAT_REDIS_POOL_MAX`` connections: a burst of readers
    waits (up to 10 s) for a connection instead of failing when the pool is at its size."""
    from redis.asyncio.retry import Retry  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    clients = _async_clients.setdefault(loop, {})
    client = clients.get(settings.REDIS_URL)
    if client is None:
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL,
            max_connections=settings.CHAT_REDIS_POOL_MAX,
            timeout=10,
            decode_responses=True,
            **_connection_kwargs(Retry),
        )
        client = clients[settings.REDIS_URL] = aioredis.Redis(connection_pool=pool)
    return client


def async_client_for_blocking(read_timeout_s: float) -> aioredis.Redis:
    """A new asyncio client for a long-lived blocking reader (XREAD BLOCK, pub/sub) whose reads
    may legitimately wait ``read_timeout_s`` seconds; connect timeout as for the others."""
    from redis.asyncio.retry import Retry  # noqa: PLC0415

    kwargs = _connection_kwargs(Retry)
    kwargs["socket_timeout"] = read_timeout_s
    return aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True, **kwargs)


def sync_client() -> redis.Redis:
    """The process's synchronous Redis client (thread-safe pool, same short timeouts; replies
    are bytes). For sync code: selectors, services, Celery tasks."""
    from redis.retry import Retry  # noqa: PLC0415

    client = _sync_clients.get(settings.REDIS_URL)
    if client is None:
        with _sync_lock:
            client = _sync_clients.get(settings.REDIS_URL)
            if client is None:
                client = redis.Redis.from_url(
                    settings.REDIS_URL,
                    max_connections=settings.CHAT_REDIS_POOL_MAX,
                    **_connection_kwargs(Retry),
                )
                _sync_clients[settings.REDIS_URL] = client
    return client


# --- guarded calls ----------------------------------------------------------------------------


async def acall(
    part: str,
    fn: Callable[[aioredis.Redis], Awaitable[T]],
    *,
    default: Any = _RAISE,
    fallback: str = "",
) -> T:
    """Run ``await fn(client)`` with this loop's client unless the breaker is open.

    On a Redis failure (or an open breaker) the call is counted and logged (see :func:`failed`)
    and ``default`` is returned; without a ``default`` it raises :class:`RedisUnavailable`.
    """
    if not allow(part):
        return _unavailable(part, default)
    try:
        result = await fn(async_client())
    except REDIS_ERRORS as exc:
        failed(part, exc, fallback)
        return _unavailable(part, default)
    succeeded()
    return result


def call(
    part: str,
    fn: Callable[[redis.Redis], T],
    *,
    default: Any = _RAISE,
    fallback: str = "",
) -> T:
    """:func:`acall` for synchronous code (``fn(client)`` with :func:`sync_client`)."""
    if not allow(part):
        return _unavailable(part, default)
    try:
        result = fn(sync_client())
    except REDIS_ERRORS as exc:
        failed(part, exc, fallback)
        return _unavailable(part, default)
    succeeded()
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
