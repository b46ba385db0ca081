"""Process-level counters for degraded modes, on ``prometheus_client`` (the Prometheus project's
own Python client).

Each server process counts for itself (Prometheus sums processes when it scrapes them). The
counters:

- ``chat_redis_unavailable_total{part}``: Redis calls that failed (connection refused, timeout,
  error reply) or were skipped because the circuit breaker was open (core/redis_guard.py).
  ``part`` names the feature that fell back: ``cache``, ``turnlog``, ``lock``, ``cancel``,
  ``idempotency``, ``ratelimit``, ...
- ``chat_redis_breaker_opened_total``: how often this process switched to degraded mode.
- ``chat_hot_cache_reads_total{result}``: hot-cache reads (conversations/cache.py) by outcome:
  ``hit``, ``miss`` (key absent or evicted), ``stale`` (older than PostgreSQL), ``down`` (Redis
  unavailable: read from PostgreSQL).
- ``chat_rate_limit_fail_open_total{limit}``: requests let through unmetered because the rate
  limiter could not reach Redis (core/redis_guard.py ``rate_limit_fail_open``).
- ``chat_idempotency_local_total``: Idempotency-Key records kept in this process only, because
  Redis was unavailable (api/idempotency.py).
- ``chat_stream_events_unbounded_total``: turn-stream events kept in this process's memory
  beyond ``CHAT_STREAM_MEMORY_EVENTS`` because the turn's Redis log could not take them
  (conversations/turnstream.py: no reader may lose an event, so the window stops shrinking).

Region primaries (issue 20; core/db_breaker.py):

- ``chat_region_breaker_open{region}`` (gauge): 1 while the breaker of the region's primary is
  open (writes there refused with 503, new conversations created in the failover region).
- ``chat_region_connect_failures_total{region,result}``: ``failed`` connects to the primary,
  and writes ``refused`` at once because the breaker was open.
- ``chat_region_failover_creates_total{region,failover}``: conversations created in
  ``failover`` while ``region``'s primary was down.

Serving (issue 5; recorded by inference/serving.py ``pool_generate`` unless said otherwise):

- ``chat_ttft_seconds{pool,tier}`` (histogram): time to first token, seconds from the call
  (admission queue wait included) to the first delta with text.
- ``chat_tpot_seconds{pool,tier}`` (histogram): time per output token after the first, seconds:
  (last token time - first token time) / (completion tokens - 1); answers of < 2 tokens skip it.
- ``chat_tokens_total{pool,tier,kind}``: tokens by ``kind``: ``prompt`` (all prompt tokens),
  ``cached`` (the prompt tokens served from the prefix cache), ``completion``.
- ``chat_prefix_cache_queries_total{pool}`` / ``chat_prefix_cache_hits_total{pool}``: prompt
  tokens looked up in the engine's prefix cache / found there (tokens, like vLLM's own
  ``prefix_cache_queries`` / ``hits``); hits / queries is the hit rate.
- ``chat_admission_waiting{engine}`` / ``chat_admission_running{engine}`` (gauges): requests
  queued for an engine slot / holding one (inference/admission.py).
- ``chat_admission_limit{engine}`` (gauge): the running cap now (the adaptive one while
  ``CHAT_ADMISSION_ADAPTIVE`` is on, inference/limiter.py); ``chat_admission_limit_changes_total
  {engine,direction}``: the limiter's decisions, ``direction`` = ``up`` | ``down``;
  ``chat_admission_tpot_sample_seconds{engine}`` (histogram): the TPOT samples it saw (seconds
  per token over a running stream's last few tokens).
- ``vllm:num_requests_waiting{model_name}`` / ``vllm:num_requests_running{model_name}``
  (gauges): the same two numbers for this process's engines under vLLM's own metric names, so
  a gateway reads an engine process of this project and a ``vllm serve`` node alike when it
  sheds (inference/remote.py ``EngineLoad``).
- ``chat_shed_total{tier,action}``: load-shedding decisions, ``action`` = ``shed`` (503 busy),
  ``degrade`` (paid turn served by the mini pool), ``queue_last`` (inference/router.py ``shed``).
- ``chat_rate_limited_total{scope,limit}``: requests refused by a rate limit (429), ``scope`` =
  ``user`` | ``org``, ``limit`` = ``rpm`` | ``tpm`` (inference/ratelimit.py's callers).

Pools of several nodes (issue 20; recorded by inference/nodes.py):

- ``chat_node_up{pool,node}`` (gauge): 1 while the node (its base URL) answers its readiness
  check, 0 once a check or a request to it failed.
- ``chat_node_requests_total{pool,node}``: requests sent to each node (a retried answer counts
  once on each node it ran on).
- ``chat_node_retries_total{pool,phase}``: answers moved to another node because theirs failed,
  ``phase`` = ``before_first_token`` (sent again whole) | ``mid_answer`` (continued with the
  text already streamed, re-prefilled).

Moderation (issue 6; recorded by moderation/base.py ``acheck``):

- ``chat_moderation_checks_total{gate,result}``: checks by ``gate`` (``input`` | ``output``)
  and ``result``: ``clean``, ``flagged``, ``failed`` (the classifier raised or timed out).
- ``chat_moderation_failures_total{gate,reason}``: failed checks, ``reason`` = ``error`` |
  ``timeout`` (PF-M2: the turn is refused unless the organisation fails open).
- ``chat_moderation_flagged_total{gate,category}``: flagged checks by category (one check may
  count under several).
- ``chat_moderation_seconds{gate}`` (histogram): time of one check, seconds, from the call to
  the verdict (worker-thread wait included; failed checks too).

``value(name, **labels)`` reads one (tests, the health endpoint).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

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
STREAM_EVENTS_UNBOUNDED = Counter(
    "chat_stream_events_unbounded",
    "Turn-stream events held in memory past CHAT_STREAM_MEMORY_EVENTS because the turn's Redis "
    "log was unavailable.",
)

# --- serving (issue 5) ---------------------------------------------------------------------------
# Buckets around the targets: paid TTFT p99 <= 0.8 s (the design brief), TPOT ~55 ms measured
# for one stream here (DESIGN.md), and the long tail of a saturated CPU engine.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)

# ``version``: the pool's model version that served the request, so a canary (CHAT_CANARIES,
# another version of the same pool) is compared with the stable version it would replace
# (issue 19 part 6; the admin's "Canary" page shows the same from the stored turns).
TTFT = Histogram(
    "chat_ttft_seconds",
    "Time to first token (seconds from the request, admission wait included), by pool, model "
    "version and tier.",
    ["pool", "version", "tier"],
    buckets=TTFT_BUCKETS,
)
TPOT = Histogram(
    "chat_tpot_seconds",
    "Time per output token after the first (seconds), by pool, model version and tier.",
    ["pool", "version", "tier"],
    buckets=TPOT_BUCKETS,
)
ENGINE_REQUESTS = Counter(
    "chat_engine_requests",
    "Engine requests by pool, model version and outcome (ok: the engine finished it; "
    "cancelled: the caller stopped it; error: the engine failed it).",
    ["pool", "version", "outcome"],
)
TOKENS = Counter(
    "chat_tokens",
    "Tokens by pool, tier and kind (prompt; cached: prompt tokens from the prefix cache; "
    "completion).",
    ["pool", "tier", "kind"],
)
PREFIX_CACHE_QUERIES = Counter(
    "chat_prefix_cache_queries",
    "Prompt tokens looked up in the engine's prefix cache, by pool.",
    ["pool"],
)
PREFIX_CACHE_HITS = Counter(
    "chat_prefix_cache_hits",
    "Prompt tokens found in the engine's prefix cache (KV blocks reused), by pool.",
    ["pool"],
)
ADMISSION_WAITING = Gauge(
    "chat_admission_waiting",
    "Requests waiting in the gateway's admission queue for an engine slot, by engine.",
    ["engine"],
)
ADMISSION_RUNNING = Gauge(
    "chat_admission_running",
    "Requests holding an engine slot (admitted to the engine), by engine.",
    ["engine"],
)
ADMISSION_LIMIT = Gauge(
    "chat_admission_limit",
    "How many requests may hold an engine slot now (the adaptive cap, or the slots), by engine.",
    ["engine"],
)
ADMISSION_LIMIT_CHANGES = Counter(
    "chat_admission_limit_changes",
    "Changes of the adaptive admission cap by engine and direction (up, down).",
    ["engine", "direction"],
)
ADMISSION_TPOT = Histogram(
    "chat_admission_tpot_sample_seconds",
    "TPOT samples of running streams the admission limiter saw (seconds per token), by engine.",
    ["engine"],
    buckets=TPOT_BUCKETS,
)
# vLLM's names (vllm/v1/metrics/loggers.py), so gateways shed on either kind of engine node.
ENGINE_WAITING = Gauge(
    "vllm:num_requests_waiting",
    "Requests waiting for an engine slot (this process's admission queue).",
    ["model_name"],
)
ENGINE_RUNNING = Gauge(
    "vllm:num_requests_running",
    "Requests holding an engine slot.",
    ["model_name"],
)
SHED = Counter(
    "chat_shed",
    "Load-shedding decisions by tier and action (shed, degrade, queue_last).",
    ["tier", "action"],
)
RATE_LIMITED = Counter(
    "chat_rate_limited",
    "Requests refused by a rate limit (429), by scope (user, org) and limit (rpm, tpm).",
    ["scope", "limit"],
)

# --- pools of several nodes (issue 20) -----------------------------------------------------------
NODE_UP = Gauge(
    "chat_node_up",
    "1 while a node of a pool answers its readiness check, 0 once a check or a request failed.",
    ["pool", "node"],
)
NODE_REQUESTS = Counter(
    "chat_node_requests",
    "Requests sent to each node of a pool of several nodes.",
    ["pool", "node"],
)
NODE_RETRIES = Counter(
    "chat_node_retries",
    "Answers moved to another node of their pool after theirs failed, by phase "
    "(before_first_token, mid_answer).",
    ["pool", "phase"],
)

# --- moderation (issue 6) ------------------------------------------------------------------------
# The input gate's budget is 50 ms p99 for a 4,000-character message (issue 6); the timeout
# default is 0.25 s (settings.CHAT_MODERATION_TIMEOUT_S).
MODERATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0)
MODERATION_CHECKS = Counter(
    "chat_moderation_checks",
    "Moderation checks by gate (input, output) and result (clean, flagged, failed).",
    ["gate", "result"],
)
MODERATION_FAILURES = Counter(
    "chat_moderation_failures",
    "Moderation checks that raised, timed out or found no free worker, by gate and reason (error, timeout, queue).",
    ["gate", "reason"],
)
MODERATION_FLAGGED = Counter(
    "chat_moderation_flagged",
    "Flagged moderation checks by gate and category.",
    ["gate", "category"],
)
MODERATION_WITHDRAWN_TOKENS = Counter(
    "chat_moderation_withdrawn_tokens",
    "Tokens of answers the output gate withdrew, by pool and kind (prompt, completion): the "
    "operator's cost, not charged to the user (issue 28).",
    ["pool", "kind"],
)
MODERATION_WITHDRAWN_COST = Counter(
    "chat_moderation_withdrawn_cost_usd",
    "Cost (USD, the pool's prices) of answers the output gate withdrew, by pool: borne by the "
    "operator, not charged to the user (issue 28).",
    ["pool"],
)
MODERATION_SECONDS = Histogram(
    "chat_moderation_seconds",
    "Time of one moderation check (seconds), by gate.",
    ["gate"],
    buckets=MODERATION_BUCKETS,
)


# Region primaries (issue 20 part 4; core/db_breaker.py). ``region`` is the region the
# primary serves (the default region for ``default``).
REGION_BREAKER_OPEN = Gauge(
    "chat_region_breaker_open",
    "1 while this process's circuit breaker for the region's primary database is open.",
    ["region"],
)
REGION_CONNECT_FAILURES = Counter(
    "chat_region_connect_failures",
    "Failed connects to a region's primary, and writes refused at once while its breaker was open.",
    ["region", "result"],
)
REGION_FAILOVER_CREATES = Counter(
    "chat_region_failover_creates",
    "Conversations created in the failover region because the home region's primary was down.",
    ["region", "failover"],
)


def value(name: str, **labels: str) -> float:
    """The current value of a metric sample in this process, 0.0 if never set.

    ``name`` is the sample name (a counter's ends in ``_total``, e.g.
    ``chat_redis_unavailable_total``); ``labels`` select one labelled child.
    """
    found = REGISTRY.get_sample_value(name, labels or None)
    return float(found or 0.0)
