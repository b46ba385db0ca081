"""Process-level counters for degraded modes, on ``prometheus_client`` (the Prometheus project's
own Python client).

Each server process counts for itself (Prometheus sums processes when it scrapes them). The
counters:

- ``chat_redis_unavailable_total{part}``: Redis calls that failed (connection refused, timeout,
  error reply) or were skipped because the circuit breaker was open (chatsite/redis_guard.py).
  ``part`` names the feature that fell back: ``cache``, ``turnlog``, ``lock``, ``cancel``,
  ``idempotency``, ``ratelimit``, ...
- ``chat_redis_breaker_opened_total``: how often this process switched to degraded mode.
- ``chat_hot_cache_reads_total{result}``: hot-cache reads (conversations/cache.py) by outcome:
  ``hit``, ``miss`` (key absent or evicted), ``stale`` (older than PostgreSQL), ``down`` (Redis
  unavailable: read from PostgreSQL).
- ``chat_rate_limit_fail_open_total{limit}``: requests let through unmetered because the rate
  limiter could not reach Redis (chatsite/redis_guard.py ``rate_limit_fail_open``).
- ``chat_idempotency_local_total``: Idempotency-Key records kept in this process only, because
  Redis was unavailable (api/idempotency.py).

``value(name, **labels)`` reads one (tests, the health endpoint).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge

REDIS_UNAVAILABLE = Counter(
    "chat_redis_unavailable",
    "Redis calls that failed or were skipped (circuit open); the feature fell back.",
    ["part"],
)
REDIS_BREAKER_OPENED = Counter(
    "chat_redis_breaker_opened",
    "Times this process found Redis unavailable and entered degraded mode.",
)
REDIS_UP = Gauge(
    "chat_redis_up",
    "1 while this process can reach Redis (circuit closed), 0 in degraded mode.",
)
REDIS_UP.set(1)
HOT_CACHE_READS = Counter(
    "chat_hot_cache_reads",
    "Hot conversation cache reads by result (hit, miss, stale, down).",
    ["result"],
)
RATE_LIMIT_FAIL_OPEN = Counter(
    "chat_rate_limit_fail_open",
    "Requests allowed without a rate-limit check because Redis was unavailable.",
    ["limit"],
)
IDEMPOTENCY_LOCAL = Counter(
    "chat_idempotency_local",
    "Idempotency-Key records kept only in this process because Redis was unavailable.",
)


def value(name: str, **labels: str) -> float:
    """The current value of a metric sample in this process, 0.0 if never set.

    ``name`` is the sample name (a counter's ends in ``_total``, e.g.
    ``chat_redis_unavailable_total``); ``labels`` select one labelled child.
    """
    found = REGISTRY.get_sample_value(name, labels or None)
    return float(found or 0.0)
