"""pool_generate (inference/serving.py): admission, engine priority, serving metrics."""

from __future__ import annotations

import asyncio

import pytest

from core import metrics
from inference.admission import admission_for
from inference.engine import EngineUnavailable, GenerationOptions
from inference.pools import pool_set
from inference.router import Route
from inference.serving import pool_generate, pool_waiting


def route_to(name: str, *, priority: int | None = None) -> Route:
    pool = pool_set().get(name)
    if priority is None:
        priority = pool.priority
    return Route(pool=pool, reason="tier default", priority=priority)


async def drain(route: Route, request_id: str, *, tier: str, options=None, ids=None) -> str:
    parts = []
    async for delta in pool_generate(
        route, ids or [1, 2, 3, 4, 5], options or GenerationOptions(), request_id, tier=tier
    ):
        parts.append(delta.text)
    return "".join(parts)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.fixture
def scheduling(settings):
    settings.CHAT_SCHEDULING = "priority"
    settings.CHAT_MAX_NUM_SEQS = 2
    settings.CHAT_RESERVED_SLOTS = 1
    return settings


class Counts:
    """Metric samples before and after (deltas: tests share one registry)."""

    def __init__(self, *samples: tuple[str, dict]):
        self.samples = samples
        self.before = [metrics.value(name, **labels) for name, labels in samples]

    def deltas(self) -> list[float]:
        return [
            metrics.value(name, **labels) - before
            for (name, labels), before in zip(self.samples, self.before)
        ]


async def test_ttft_and_tpot_are_recorded_by_pool_model_version_and_tier(engine_double, scheduling):
    engine_double.scripts = [["Hel", 0.05, "lo", 0.05, " there"]]
    version = pool_set().get("frontier").version
    labels = {"pool": "frontier", "version": version, "tier": "paid"}
    counts = Counts(
        ("chat_ttft_seconds_count", labels),
        ("chat_tpot_seconds_count", labels),
        ("chat_tpot_seconds_sum", labels),
        ("chat_ttft_seconds_count", {"pool": "mini", "version": pool_set().get("mini").version, "tier": "paid"}),
        ("chat_ttft_seconds_count", {**labels, "version": "another-version"}),
        ("chat_engine_requests_total", {"pool": "frontier", "version": version, "outcome": "ok"}),
    )

    assert await drain(route_to("frontier"), "t1", tier="paid") == "Hello there"

    ttfts, tpots, tpot_sum, other, other_version, ok = counts.deltas()
    assert (ttfts, tpots, other, other_version, ok) == (1, 1, 0, 0, 1)
    # (last - first token time) / (3 tokens - 1): two 50 ms gaps -> ~50 ms per token.
    assert 0.045 <= tpot_sum <= 0.2


async def test_engine_requests_are_counted_by_outcome_and_model_version(engine_double, scheduling):
    """A request the engine finishes counts as ok, one the caller closes early as cancelled,
    one the engine fails as error, each under its pool's model version."""
    import contextlib

    version = pool_set().get("mini").version
    outcomes = ("ok", "cancelled", "error")
    counts = Counts(*[
        ("chat_engine_requests_total", {"pool": "mini", "version": version, "outcome": o}) for o in outcomes
    ])  # fmt: skip
    engine_double.scripts = [
        ["a", "b"],
        ["first", 5.0, "never"],
        ["x", EngineUnavailable("engine died")],
    ]
    assert await drain(route_to("mini"), "o1", tier="free") == "ab"
    async with contextlib.aclosing(
        pool_generate(route_to("mini"), [1, 2], GenerationOptions(), "o2", tier="free")
    ) as deltas:
        async for delta in deltas:
            assert delta.text == "first"
            break  # the caller stops here: closing aborts the request
    with pytest.raises(EngineUnavailable):
        await drain(route_to("mini"), "o3", tier="free")

    assert counts.deltas() == [1, 1, 1]


async def test_ttft_counts_the_admission_wait_and_skips_empty_deltas(engine_double, scheduling):
    """TTFT runs from the call, so time queued for a slot counts; an empty first delta is not
    a first token."""
    engine_double.scripts = [["", 0.05, "late"]]
    labels = {"pool": "mini", "version": pool_set().get("mini").version, "tier": "free"}
    counts = Counts(("chat_ttft_seconds_sum", labels), ("chat_ttft_seconds_count", labels))
    admission = admission_for(engine_double)
    holder = admission.slot(priority=0, reserved_ok=True)
    holder2 = admission.slot(priority=0, reserved_ok=True)
    await holder.__aenter__()
    await holder2.__aenter__()  # both slots taken

    task = asyncio.get_running_loop().create_task(drain(route_to("mini"), "t2", tier="free"))
    await asyncio.sleep(0.1)
    assert admission.waiting() == 1
    await holder.__aexit__(None, None, None)
    await holder2.__aexit__(None, None, None)
    await task

    ttft_sum, ttft_count = counts.deltas()
    assert ttft_count == 1
    assert ttft_sum >= 0.15  # 0.1 s queued + 0.05 s before the first non-empty text


async def test_tokens_and_prefix_cache_hits_are_counted_once_per_request(
    engine_double, scheduling
):
    engine_double.scripts = [["a", "b", "c"]]
    engine_double.cached_tokens = 4
    tokens = {"pool": "mini", "tier": "free"}
    counts = Counts(
        ("chat_tokens_total", {**tokens, "kind": "prompt"}),
        ("chat_tokens_total", {**tokens, "kind": "cached"}),
        ("chat_tokens_total", {**tokens, "kind": "completion"}),
        ("chat_prefix_cache_queries_total", {"pool": "mini"}),
        ("chat_prefix_cache_hits_total", {"pool": "mini"}),
    )

    await drain(route_to("mini"), "t3", tier="free", ids=list(range(10)))

    assert counts.deltas() == [10, 4, 3, 10, 4]


async def test_a_cancelled_request_counts_the_tokens_it_generated(engine_double, scheduling):
    """PF-R5 for the counters: a turn stopped mid-answer counts what the engine produced."""
    engine_double.scripts = [["a", "b", 5.0, "never"]]
    completion = {"pool": "frontier", "tier": "paid", "kind": "completion"}
    counts = Counts(("chat_tokens_total", completion))
    seen = []

    async def consume():
        async for delta in pool_generate(
            route_to("frontier"), [1, 2], GenerationOptions(), "t4", tier="paid"
        ):
            seen.append(delta.text)

    task = asyncio.get_running_loop().create_task(consume())
    while len(seen) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert counts.deltas() == [2]
    assert "t4" in engine_double.aborted
    assert admission_for(engine_double).running() == 0


async def test_the_engine_runs_the_route_priority_and_background_jobs_keep_theirs(
    engine_double, scheduling
):
    background = GenerationOptions(priority=scheduling.CHAT_BACKGROUND_PRIORITY)
    await drain(route_to("mini"), "free", tier="free")
    await drain(route_to("frontier"), "paid", tier="paid")
    await drain(route_to("frontier", priority=5), "queued-last", tier="paid")
    await drain(route_to("frontier"), "job", tier="service", options=background)

    priorities = {request_id: options.priority for _, options, request_id in engine_double.requests}
    assert priorities == {
        "free": 1,
        "paid": 0,
        "queued-last": 5,
        "job": scheduling.CHAT_BACKGROUND_PRIORITY,
    }


async def test_fcfs_mode_runs_every_user_turn_at_one_priority(engine_double, scheduling):
    scheduling.CHAT_SCHEDULING = "fcfs"
    await drain(route_to("mini"), "free", tier="free")
    await drain(route_to("frontier", priority=3), "paid", tier="paid")

    assert [options.priority for _, options, _ in engine_double.requests] == [0, 0]


async def test_free_turns_and_background_jobs_never_take_the_reserved_slot(
    engine_double, scheduling
):
    """2 slots, 1 reserved: with one free turn running, another free turn and a background job
    wait; a paid turn starts at once."""
    engine_double.scripts = [["x", 0.3, "y"]] * 4
    loop = asyncio.get_running_loop()
    background = GenerationOptions(priority=scheduling.CHAT_BACKGROUND_PRIORITY)
    running = loop.create_task(drain(route_to("mini"), "free-1", tier="free"))
    await settle()
    free = loop.create_task(drain(route_to("mini"), "free-2", tier="free"))
    job = loop.create_task(
        drain(route_to("frontier"), "job", tier="paid", options=background)
    )
    await settle()
    paid = loop.create_task(drain(route_to("frontier"), "paid", tier="paid"))
    await settle()

    started = [request_id for _, _, request_id in engine_double.requests]
    assert started == ["free-1", "paid"]
    assert await pool_waiting(route_to("mini").pool) == 2
    assert await pool_waiting(route_to("frontier").pool) == 2  # one engine, one queue
    await asyncio.gather(running, free, job, paid)
    assert await pool_waiting(route_to("mini").pool) == 0


async def test_a_turn_cancelled_while_queued_never_reaches_the_engine(engine_double, scheduling):
    scheduling.CHAT_MAX_NUM_SEQS = 1
    scheduling.CHAT_RESERVED_SLOTS = 0
    engine_double.scripts = [["x", 0.2, "y"], ["z"]]
    loop = asyncio.get_running_loop()
    first = loop.create_task(drain(route_to("frontier"), "first", tier="paid"))
    await settle()
    queued = loop.create_task(drain(route_to("frontier"), "queued", tier="paid"))
    await settle()
    assert await pool_waiting(route_to("frontier").pool) == 1

    queued.cancel()
    await settle()

    assert await pool_waiting(route_to("frontier").pool) == 0
    await first
    assert [request_id for _, _, request_id in engine_double.requests] == ["first"]
    assert admission_for(engine_double).running() == 0


async def test_an_engine_failure_propagates_and_frees_the_slot(engine_double, scheduling):
    engine_double.scripts = [["a", EngineUnavailable("the inference engine died")]]
    with pytest.raises(EngineUnavailable):
        await drain(route_to("frontier"), "dies", tier="paid")
    assert admission_for(engine_double).running() == 0


async def test_an_engine_that_is_not_started_is_started_first(engine_double, scheduling):
    engine_double.ready = False
    await drain(route_to("mini"), "cold", tier="free")
    assert engine_double.started == 1
