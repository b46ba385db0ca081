"""Operations endpoints: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz``
(readiness).

- ``/metrics``: this process's metrics (core/metrics.py; feedback/metrics.py adds
  ``chat_feedback_total{pool,model_version,rating}``) in the Prometheus text format,
  from ``prometheus_client.generate_latest``. Each server process serves its own; Prometheus
  scrapes every process and sums.
- ``/healthz``: the process is up and answering. Always 200 (a failing dependency is a matter
  for ``/readyz``, not a reason to restart the process). The body also says how the engine and
  Redis look, for operators: ``{"status": "ok", "ready", "unfinished_requests", "redis"}``,
  ``redis`` = ``"ok"`` | ``"degraded"`` (core/redis_guard.py's degraded mode).
- ``/readyz``: may this process take traffic? 200 ``{"status": "ready", "checks": {...}}`` when
  the engine is ready, PostgreSQL answers ``SELECT 1`` on the default database and Redis answers
  PING; else 503 ``{"status": "unavailable", "checks": {...}, "failing": [...]}`` naming each
  failing part (``engine``, ``postgres``, ``redis``, ``warm_up``: the process's classifiers and
  embedding model still loading, chatsite/warmup.py) with a reason. Each check is bounded by
  ``CHECK_TIMEOUT_S``. Both bodies carry ``nodes``: for each pool of several nodes
  (inference/nodes.py), node URL -> ``"up"`` or ``"down: <reason>"``. A node down does not make
  the process unready (the pool's other nodes serve; a pool with none up fails its requests
  with the engine's error), so a load balancer keeps the gateway.

Both probes start the engine if it is not started yet (in the background; the probe does not
wait), as the old ``conversations.views.healthz`` did: the first probe of a fresh process is
what loads the model. None of these views ever answers 500: a check that raises is reported as
failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from chatsite import warmup
from core import redis_guard
from inference.engine import get_engine
from inference.pools import node_sets

logger = logging.getLogger(__name__)

# Seconds each readiness check may take before it counts as failing (a hung database or Redis
# must not hang the probe: load balancers time out probes after a few seconds).
CHECK_TIMEOUT_S = 2.0


@never_cache
async def metrics_view(request: HttpRequest) -> HttpResponse:
    """This process's metrics in the Prometheus text exposition format, version 0.0.4
    (``text/plain; version=0.0.4``; what ``generate_latest`` writes). Async, so a scrape never
    queues behind ORM work on the sync thread."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_PLAIN_0_0_4)


def _engine_state() -> tuple[bool, int]:
    """(ready, unfinished requests) of the process's engine; starts it in the background when
    it is not ready (the probe does not wait for it)."""
    engine = get_engine()
    engine.check_health()
    if not engine.ready:
        task = asyncio.get_running_loop().create_task(engine.ensure_started())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return bool(engine.ready), engine.num_unfinished_requests()


@never_cache
async def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness: 200 ``{"status": "ok", "ready", "unfinished_requests", "redis"}`` whenever the
    process can answer (see the module docstring)."""
    body: dict[str, object] = {"status": "ok"}
    try:
        body["ready"], body["unfinished_requests"] = _engine_state()
    except Exception:  # noqa: BLE001 - liveness must not fail on the engine's account
        logger.exception("healthz: reading the engine's state failed")
        body["ready"] = False
    try:
        redis_ok = await asyncio.wait_for(redis_guard.aping(), CHECK_TIMEOUT_S)
    except Exception:  # noqa: BLE001
        redis_ok = False
    body["redis"] = "ok" if redis_ok else "degraded"
    return JsonResponse(body, status=200)


def _database_select_1() -> None:
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            if cursor.fetchone() != (1,):
                raise RuntimeError("SELECT 1 returned something else")
    finally:
        connections.close_all()  # this worker thread's connection goes back to the pool


async def _check_engine() -> str | None:
    ready, _ = _engine_state()
    return None if ready else "the model is not loaded yet (starting or restarting)"


async def _check_postgres() -> str | None:
    await sync_to_async(_database_select_1, thread_sensitive=False)()
    return None


async def _check_redis() -> str | None:
    return None if await redis_guard.aping() else "PING failed (Redis unreachable or circuit open)"


async def _check_warm_up() -> str | None:
    # The classifiers and the embedding model still loading (chatsite/warmup.py): turns now
    # could find Redis's breaker opened by the GIL-held load, and rate limits open.
    return "warming up" if warmup.pending() else None


async def _run_check(check) -> str | None:
    """None when the check passes, else a reason (an exception or a timeout is a failure)."""
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
    except asyncio.TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - report it; never a 500
        return f"{type(exc).__name__}: {exc}"[:300]


async def _node_states() -> dict[str, dict[str, str]]:
    """Pool key -> node URL -> state, for each pool of several nodes. Starts each pool's
    background check; nodes never checked yet are checked now (bounded by CHECK_TIMEOUT_S)."""
    try:
        sets = node_sets()
    except Exception as exc:  # noqa: BLE001 - a bad pool file is the system check's to report
        return {"(pools)": {"error": f"{type(exc).__name__}: {exc}"[:300]}}
    unchecked = []
    for node_set in sets.values():
        node_set.watch()
        if any(node.up is None for node in node_set.nodes):
            unchecked.append(node_set.check())
    if unchecked:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*unchecked), CHECK_TIMEOUT_S)
    return {key: node_set.states() for key, node_set in sets.items()}


@never_cache
async def readyz(request: HttpRequest) -> HttpResponse:
    """Readiness: 200 when the engine, PostgreSQL and Redis are all good, else 503 naming each
    failing part; ``nodes`` shows each pool node's state (see the module docstring). The checks
    run concurrently."""
    names = ("engine", "postgres", "redis", "warm_up")
    *results, nodes = await asyncio.gather(
        _run_check(_check_engine), _run_check(_check_postgres), _run_check(_check_redis),
        _run_check(_check_warm_up), _node_states(),
    )  # fmt: skip
    checks = {name: ("ok" if reason is None else reason) for name, reason in zip(names, results)}
    failing = [name for name, reason in zip(names, results) if reason is not None]
    if failing:
        return JsonResponse(
            {"status": "unavailable", "checks": checks, "failing": failing, "nodes": nodes}, status=503
        )
    return JsonResponse({"status": "ready", "checks": checks, "nodes": nodes}, status=200)
