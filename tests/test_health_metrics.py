"""/metrics, /healthz and /readyz (chatsite/health.py)."""

from __future__ import annotations

import asyncio

import pytest
import redis
from django.db import OperationalError
from django.test import AsyncClient
from django.urls import path, resolve

from chatsite import health
from core import redis_guard
from inference.engine import GenerationOptions
from inference.pools import pool_set
from inference.router import Route
from inference.serving import pool_generate

# The routes as chatsite/urls.py is to have them (this module serves as the urlconf below, so
# the views are tested through Django's full request handling and middleware).
urlpatterns = [
    path("metrics", health.metrics_view, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]

pytestmark = pytest.mark.urls(__name__)


@pytest.fixture
def redis_down(tmp_path, monkeypatch):
    """Every Redis client of the product (core/redis_guard.py) points at a socket nobody
    listens on (as tests/test_writeback.py does); the breaker is closed again afterwards."""
    dead = f"unix://{tmp_path}/no-redis.sock"
    clients: dict = {}

    def async_client(**_):  # any region: the same dead server
        loop = asyncio.get_running_loop()
        if loop not in clients:
            clients[loop] = redis.asyncio.Redis.from_url(dead, socket_connect_timeout=1)
        return clients[loop]

    monkeypatch.setattr(redis_guard, "async_client", async_client)
    redis_guard.breaker.reset()
    yield
    redis_guard.breaker.reset()


@pytest.fixture(autouse=True)
def _breaker_closed():
    redis_guard.breaker.reset()
    yield
    redis_guard.breaker.reset()


async def test_metrics_exposes_the_ttft_and_tpot_histograms_by_pool_and_tier(engine_double):
    engine_double.scripts = [["one", 0.01, " two", 0.01, " three"]]
    pool = pool_set().get("frontier")
    route = Route(pool=pool, reason="tier default", priority=pool.priority)
    async for _ in pool_generate(route, [1, 2, 3], GenerationOptions(), "m1", tier="enterprise"):
        pass

    response = await AsyncClient().get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    body = response.content.decode()
    v = pool.version
    assert f'chat_ttft_seconds_bucket{{le="0.8",pool="frontier",tier="enterprise",version="{v}"}}' in body
    assert f'chat_tpot_seconds_count{{pool="frontier",tier="enterprise",version="{v}"}}' in body
    assert f'chat_engine_requests_total{{outcome="ok",pool="frontier",version="{v}"}}' in body
    assert 'chat_tokens_total{kind="completion",pool="frontier",tier="enterprise"}' in body
    for family in (
        "chat_admission_waiting", "chat_prefix_cache_hits_total", "chat_shed_total",
        "chat_rate_limited_total", "chat_redis_unavailable_total",
    ):  # fmt: skip
        assert f"# TYPE {family.removesuffix('_total')}" in body, family


async def test_healthz_is_200_while_the_engine_is_not_ready_and_redis_is_down(
    engine_double, redis_down
):
    engine_double.ready = False

    response = await AsyncClient().get("/healthz")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["ready"] is False
    assert response.json()["redis"] == "degraded"


async def test_healthz_is_200_even_when_reading_the_engine_fails(monkeypatch):
    def broken():
        raise RuntimeError("no engine class")

    monkeypatch.setattr(health, "get_engine", broken)

    response = await AsyncClient().get("/healthz")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"


@pytest.mark.django_db
async def test_readyz_is_200_when_engine_postgres_and_redis_are_up(engine_double):
    response = await AsyncClient().get("/readyz")

    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ready",
        "checks": {"engine": "ok", "postgres": "ok", "redis": "ok", "warm_up": "ok"},
        "nodes": {},  # no pool of several nodes configured
    }


@pytest.mark.django_db
async def test_readyz_is_503_while_the_process_warms_up(engine_double, monkeypatch):
    """A server process is not ready until its classifiers and embedding model have loaded
    (chatsite/warmup.py): loading holds the GIL, and a turn meanwhile could find Redis's breaker
    open and the rate limits with it."""
    from chatsite import warmup

    # Given: a warm-up started and not finished
    started, done = warmup._started.__class__(), warmup._done.__class__()
    started.set()
    monkeypatch.setattr(warmup, "_started", started)
    monkeypatch.setattr(warmup, "_done", done)
    # When / Then: 503 naming it; ready once it is done
    response = await AsyncClient().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["warm_up"]
    assert response.json()["checks"]["warm_up"] == "warming up"
    done.set()
    assert (await AsyncClient().get("/readyz")).status_code == 200


@pytest.mark.django_db
async def test_readyz_is_503_naming_redis_when_redis_is_down(engine_double, redis_down):
    response = await AsyncClient().get("/readyz")

    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis"]
    assert body["checks"]["postgres"] == "ok" and body["checks"]["engine"] == "ok"
    assert "PING" in body["checks"]["redis"]


@pytest.mark.django_db
async def test_readyz_is_503_naming_the_engine_while_it_is_not_ready_and_starts_it(
    engine_double,
):
    engine_double.ready = False

    response = await AsyncClient().get("/readyz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["engine"]
    await asyncio.sleep(0)  # the probe started the engine in the background
    assert engine_double.started == 1
    assert (await AsyncClient().get("/readyz")).status_code == 200


@pytest.mark.django_db
async def test_readyz_is_503_naming_postgres_when_the_database_is_unreachable(
    engine_double, monkeypatch
):
    def refused():
        raise OperationalError("connection refused")

    monkeypatch.setattr(health, "_database_select_1", refused)

    response = await AsyncClient().get("/readyz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["postgres"]
    assert "connection refused" in response.json()["checks"]["postgres"]


async def test_readyz_is_503_not_500_when_every_check_breaks(monkeypatch, redis_down):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(health, "get_engine", broken)
    monkeypatch.setattr(health, "_database_select_1", broken)

    response = await AsyncClient().get("/readyz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["engine", "postgres", "redis"]


@pytest.mark.urls("chatsite.urls")
def test_the_project_routes_the_operations_endpoints_to_these_views():
    """The wiring in chatsite/urls.py (replacing conversations.views.healthz)."""
    assert resolve("/metrics").func is health.metrics_view
    assert resolve("/healthz").func is health.healthz
    assert resolve("/readyz").func is health.readyz
