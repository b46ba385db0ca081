"""Serving one routed request: admission slot, engine priority, and the serving metrics.

:func:`pool_generate` is how the gateway runs a request once the router has picked its pool
(inference/router.py ``route`` / ``shed``): it waits for a slot in the admission queue of the
pool's engine (inference/admission.py), runs the engine at the route's priority, and records
TTFT / TPOT histograms, token counters and prefix-cache counters (core/metrics.py) by pool
and tier. :func:`pool_waiting` is the queue depth that load shedding reads.

Priorities (vLLM: lower runs first) and reserved slots:

=====================================  ================  ============  ===================
request                                engine priority   reserved_ok   admission order key
=====================================  ================  ============  ===================
paid / enterprise user turn            route.priority    yes           (priority, arrival)
free user turn                         route.priority    no            (priority, arrival)
background job (summary, memory)       CHAT_BACKGROUND   no            (priority, arrival)
                                       _PRIORITY
any, ``CHAT_SCHEDULING = "fcfs"``      0 (background     (no reserved  arrival
                                       jobs keep theirs) slots)
=====================================  ================  ============  ===================

A request is a background job when its ``options.priority`` already equals
``settings.CHAT_BACKGROUND_PRIORITY`` (api/completions.py sets it for the service credential).

A remote engine (``engine.queues_remotely``: an engine process of this project, or ``vllm
serve``) is not admitted here: a gateway keeps no capped queue of its own in front of it, the
request goes out at once with its priority and tier (``GenerationOptions.tier``), and the
engine node's own queue orders it; :func:`pool_waiting` then reads that node's queue depth
(``vllm:num_requests_waiting``), so every gateway in front of it sheds on one number
(DESIGN.md, "Production topology").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from django.conf import settings

from core import metrics
from inference.admission import Admission, admission_for
from inference.engine import Delta, EngineUnavailable, GenerationOptions
from inference.pools import Pool, pool_engine

if TYPE_CHECKING:
    from inference.router import Route

logger = logging.getLogger(__name__)

# Tiers whose user turns may take the reserved slots (inference/admission.py).
RESERVED_TIERS = frozenset({"paid", "enterprise"})


def is_background(options: GenerationOptions) -> bool:
    """Whether ``options`` are a background job's (priority == CHAT_BACKGROUND_PRIORITY)."""
    return options.priority == settings.CHAT_BACKGROUND_PRIORITY


def engine_priority(route: Route, options: GenerationOptions) -> int:
    """The vLLM priority a request runs at (lower first): a background job keeps
    ``CHAT_BACKGROUND_PRIORITY``; in ``"fcfs"`` mode every user turn runs at 0; otherwise the
    route's priority (the pool's, or later when shedding queues it last)."""
    if is_background(options):
        return options.priority
    if Admission.mode() == "fcfs":
        return 0
    return route.priority


def may_use_reserved(tier: str, options: GenerationOptions) -> bool:
    """Paid and enterprise user turns may take the reserved slots; free turns and background
    jobs may not."""
    return tier in RESERVED_TIERS and not is_background(options)


async def pool_generate(
    route: Route,
    prompt_token_ids: list[int],
    options: GenerationOptions,
    request_id: str,
    *,
    tier: str,
) -> AsyncIterator[Delta]:
    """Stream :class:`Delta` values for one request on ``route.pool``'s engine.

    ``prompt_token_ids``: the assembled prompt (token ids); ``options``: sampling settings, whose
    ``priority`` is replaced by :func:`engine_priority`; ``request_id``: the engine request id
    (a turn id); ``tier``: the user's tier (``free`` | ``paid`` | ``enterprise``, or another
    label such as ``service`` for background jobs), used for reserved slots and metric labels.

    Starts the engine if needed, then waits for an admission slot (unbounded: callers shed
    before calling, router.shed on :func:`pool_waiting`), then yields the engine's deltas as
    they come. Consume it inside the task that owns the request (or wrap it in
    ``contextlib.aclosing``) so an early exit closes it at once. Closing the iterator or
    cancelling the task aborts the request in the engine (the engine's ``generate`` does) and
    frees the slot; a task cancelled while it waits for a slot leaves the queue.

    Metrics, labelled ``pool`` = ``route.pool.name``, ``version`` = its model version and
    ``tier``:

    - ``chat_ttft_seconds``: call -> first delta with text (queue wait and prefill included);
    - ``chat_tpot_seconds``: (last token time - first token time) / (completion tokens - 1),
      for answers of >= 2 tokens;
    - ``chat_tokens_total{kind}``: prompt, cached, completion tokens, once per request from its
      last delta (also for cancelled or failed requests: what the engine got through, PF-R5;
      nothing for a request that produced no delta at all);
    - ``chat_prefix_cache_queries_total`` / ``_hits_total``: prompt tokens / cached tokens;
    - ``chat_engine_requests_total{pool, version, outcome}``: ok, cancelled or error, once per
      request that got a slot.

    While it streams from a local engine, every ``settings.CHAT_ADMISSION_SAMPLE_TOKENS``
    completion tokens it gives the engine's admission queue one TPOT sample (seconds per token
    since the previous sample, from the first token on: queue wait and prefill excluded), so
    the adaptive cap (inference/limiter.py) reacts while long answers still run.

    Raises EngineUnavailable (from the engine) when the engine cannot start or dies.
    """
    started = time.perf_counter()
    pool: Pool = route.pool
    engine = pool_engine(pool)
    if not engine.ready:
        await engine.ensure_started()
    priority = engine_priority(route, options)
    run_options = replace(options, priority=priority, tier=options.tier or tier)
    first_at: float | None = None
    last_at: float | None = None
    last: Delta | None = None
    admission = None if getattr(engine, "queues_remotely", False) else admission_for(engine)
    slot = (
        contextlib.nullcontext()  # the engine node queues it (module docstring)
        if admission is None
        else admission.slot(
            priority=priority, reserved_ok=may_use_reserved(tier, options), tag=request_id
        )
    )
    every = max(1, int(settings.CHAT_ADMISSION_SAMPLE_TOKENS))
    mark_at, mark_tokens = 0.0, 0  # the last TPOT sample's time and completion tokens
    async with slot:
        outcome = "cancelled"  # until the engine finishes it (closed or cancelled early)
        try:
            async for delta in engine.generate(prompt_token_ids, run_options, request_id):
                if delta.cached_tokens > delta.prompt_tokens:
                    delta = _clamped(delta, request_id)
                if delta.text:
                    last_at = time.perf_counter()
                    if first_at is None:
                        first_at = last_at
                        mark_at, mark_tokens = last_at, delta.completion_tokens
                        metrics.TTFT.labels(pool=pool.name, version=pool.version, tier=tier).observe(
                            first_at - started
                        )
                    elif admission is not None and delta.completion_tokens - mark_tokens >= every:
                        tokens = delta.completion_tokens - mark_tokens
                        admission.observe_tpot((last_at - mark_at) / tokens)
                        mark_at, mark_tokens = last_at, delta.completion_tokens
                last = delta
                yield delta
            outcome = "ok"
        except EngineUnavailable:
            outcome = "error"
            raise
        finally:
            if last is not None:
                _record_usage(pool.name, tier, last)
            if first_at is not None and last is not None and last.completion_tokens >= 2:
                tpot = (last_at - first_at) / (last.completion_tokens - 1)
                metrics.TPOT.labels(pool=pool.name, version=pool.version, tier=tier).observe(tpot)
            metrics.ENGINE_REQUESTS.labels(pool=pool.name, version=pool.version, outcome=outcome).inc()


def _clamped(delta: Delta, request_id: str) -> Delta:
    """``delta`` with its cached tokens cut to its prompt tokens: the one place an engine's
    report of more cached than prompt tokens is corrected (every tally, cost and metric above
    this module sees valid counts)."""
    logger.warning(
        "request %s: the engine reports %d cached of %d prompt tokens; counting %d",
        request_id, delta.cached_tokens, delta.prompt_tokens, delta.prompt_tokens,
    )  # fmt: skip
    return replace(delta, cached_tokens=delta.prompt_tokens)


def _record_usage(pool: str, tier: str, last: Delta) -> None:
    """Token and prefix-cache counters for one request, once, from its last delta (the deltas
    carry running totals, already clamped)."""
    prompt = last.prompt_tokens
    cached = last.cached_tokens
    completion = last.completion_tokens
    metrics.TOKENS.labels(pool=pool, tier=tier, kind="prompt").inc(prompt)
    metrics.TOKENS.labels(pool=pool, tier=tier, kind="cached").inc(cached)
    metrics.TOKENS.labels(pool=pool, tier=tier, kind="completion").inc(completion)
    metrics.PREFIX_CACHE_QUERIES.labels(pool=pool).inc(prompt)
    metrics.PREFIX_CACHE_HITS.labels(pool=pool).inc(cached)


async def pool_waiting(pool: Pool) -> int:
    """Requests waiting now for a slot of ``pool``'s engine (all pools and tiers sharing it):
    the queue depth router.shed compares with its thresholds. A local engine: its admission
    queue here; a remote one: the node's ``vllm:num_requests_waiting`` (``engine.load()``,
    read at most every ``settings.CHAT_ENGINE_LOAD_TTL_S``), so N gateways shed as one."""
    engine = pool_engine(pool)
    if getattr(engine, "queues_remotely", False):
        return (await engine.load()).waiting
    return admission_for(engine).waiting()


def pool_expected_wait_s(pool: Pool) -> float:
    """Seconds a request for ``pool``'s engine arriving now would wait for a slot, estimated by
    its admission queue (inference/admission.py ``expected_wait_s``); 0.0 for a remote engine
    (its node's queue is not timed from here: gateways shed on its depth, :func:`pool_waiting`)."""
    engine = pool_engine(pool)
    if getattr(engine, "queues_remotely", False):
        return 0.0
    return admission_for(engine).expected_wait_s()
