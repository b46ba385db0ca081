"""The adaptive admission cap wired to an engine's queue (inference/admission.py with
inference/limiter.py), the free-turn wait bound at the door (router.shed), and their metrics."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import AsyncClient

from core import metrics
from inference.admission import Admission, admission_for
from inference.engine import GenerationOptions
from inference.pools import pool_set
from inference.router import Overloaded, Route, shed
from inference.serving import pool_generate
from tests.api_support import api_client, assert_error, new_conversation, post_json


@pytest.fixture
def adaptive(settings):
    """The limiter on, quick to decide: 4 slots, none reserved, a 20 ms TPOT target, decisions
    every 0.1 s on >= 3 samples, halving on a cut, a sample every 2 tokens."""
    settings.CHAT_SCHEDULING = "priority"
    settings.CHAT_MAX_NUM_SEQS = 4
    settings.CHAT_RESERVED_SLOTS = 0
    settings.CHAT_ADMISSION_ADAPTIVE = True
    settings.CHAT_ADMISSION_TPOT_TARGET_MS = 20
    settings.CHAT_ADMISSION_MIN_LIMIT = 1
    settings.CHAT_ADMISSION_BACKOFF = 0.5
    settings.CHAT_ADMISSION_WINDOW_S = 0.1
    settings.CHAT_ADMISSION_MIN_SAMPLES = 3
    settings.CHAT_ADMISSION_SAMPLE_TOKENS = 2
    return settings


def route_to(name: str) -> Route:
    pool = pool_set().get(name)
    return Route(pool=pool, reason="tier default", priority=pool.priority)


async def drain(route: Route, request_id: str, *, tier: str) -> None:
    async for _ in pool_generate(
        route, [1, 2, 3], GenerationOptions(max_tokens=100), request_id, tier=tier
    ):
        pass


async def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def slow_windows(admission: Admission, tpot_s: float, windows: int = 1) -> None:
    """Feed ``windows`` decision windows of ``tpot_s`` samples: 4 samples 35 ms apart, so the
    4th closes a 0.1 s window."""
    for _ in range(windows):
        for i in range(4):
            admission.observe_tpot(tpot_s)
            if i < 3:
                await asyncio.sleep(0.035)
        await asyncio.sleep(0)


async def test_slow_streams_lower_the_cap_and_queued_paid_turns_go_before_free_ones(
    engine_double, adaptive
):
    """Given 4 slots and 4 streams slower than the TPOT target (40 ms per token vs 20 ms), the
    cap falls while they run (nobody is preempted: they all finish); turns that arrive meanwhile
    queue behind the cap, and when the slow streams end the paid turn that arrived last is
    granted before the free ones queued ahead of it."""
    engine_double.scripts = [[f"t{i}" if k % 2 else 0.04 for k in range(60)] for i in range(4)]
    admission = admission_for(engine_double)
    label = admission.label
    downs = metrics.value("chat_admission_limit_changes_total", engine=label, direction="down")
    loop = asyncio.get_running_loop()
    slow = [
        loop.create_task(drain(route_to("frontier"), f"slow{i}", tier="paid")) for i in range(4)
    ]
    await wait_until(lambda: admission.limit() < 4)
    assert admission.running() == 4  # the cut preempted nobody

    late = [loop.create_task(drain(route_to("mini"), f"free{i}", tier="free")) for i in range(2)]
    await asyncio.sleep(0.01)
    late.append(loop.create_task(drain(route_to("frontier"), "paid", tier="paid")))
    await asyncio.sleep(0.01)
    assert admission.waiting() == 3
    await asyncio.wait_for(asyncio.gather(*slow, *late), 10)

    assert admission.limit() < 4
    assert metrics.value("chat_admission_limit", engine=label) == admission.limit()
    assert (
        metrics.value("chat_admission_limit_changes_total", engine=label, direction="down") > downs
    )
    order = [g.tag for g in admission.grants if g.tag in ("free0", "free1", "paid")]
    assert order == ["paid", "free0", "free1"]
    assert (admission.running(), admission.waiting()) == (0, 0)


async def test_a_cut_cap_keeps_waiters_out_and_room_raises_it_and_admits_them_at_once(adaptive):
    admission = Admission(label="t-adaptive-up")
    held = [admission.slot(priority=0, reserved_ok=True) for _ in range(4)]
    for slot in held:
        await slot.__aenter__()
    await slow_windows(admission, 0.1)  # 4 running, all slow: 4 -> 2
    assert admission.limit() == 2
    for slot in held[:3]:
        await slot.__aexit__(None, None, None)  # 1 running now, under the cap
    waiter = asyncio.get_running_loop().create_task(_hold_briefly(admission))
    waiter2 = asyncio.get_running_loop().create_task(_hold_briefly(admission))
    await asyncio.sleep(0.01)
    assert (admission.running(), admission.waiting()) == (2, 1)  # the cap, not the slots, holds it

    await slow_windows(admission, 0.002)  # fast, cap reached, someone waits: 2 -> 3
    await asyncio.sleep(0)

    assert admission.limit() == 3
    assert admission.waiting() == 0  # admitted the moment the cap rose
    assert (
        metrics.value("chat_admission_limit_changes_total", engine="t-adaptive-up", direction="up")
        == 1
    )
    await held[3].__aexit__(None, None, None)
    await asyncio.gather(waiter, waiter2)


async def _hold_briefly(admission: Admission) -> None:
    async with admission.slot(priority=0, reserved_ok=True):
        await asyncio.sleep(0.3)


async def test_with_the_limiter_off_the_cap_is_the_slots(adaptive):
    admission = Admission(label="t-adaptive-off")
    held = [admission.slot(priority=0, reserved_ok=True) for _ in range(4)]
    for slot in held:
        await slot.__aenter__()
    await slow_windows(admission, 0.1)
    assert admission.limit() == 2

    adaptive.CHAT_ADMISSION_ADAPTIVE = False
    assert admission.limit() == 4  # read at each decision: off means the slots at once
    await slow_windows(admission, 0.1, windows=2)
    adaptive.CHAT_ADMISSION_ADAPTIVE = True
    assert admission.limit() == 2  # samples seen while off moved nothing
    for slot in held:
        await slot.__aexit__(None, None, None)


async def test_the_operator_ceiling_bounds_the_adaptive_cap(adaptive):
    admission = Admission(label="t-adaptive-ceiling")
    admission.set_limit(3)
    held = [admission.slot(priority=0, reserved_ok=True) for _ in range(3)]
    for slot in held:
        await slot.__aenter__()
    waiter = asyncio.get_running_loop().create_task(_hold_briefly(admission))
    await slow_windows(admission, 0.001, windows=2)  # room, but the ceiling is 3
    assert admission.limit() == 3 and admission.waiting() == 1
    for slot in held:
        await slot.__aexit__(None, None, None)
    await waiter


async def test_a_bad_limiter_setting_leaves_the_cap_and_the_stream_alone(adaptive, caplog):
    admission = Admission(label="t-adaptive-bad")
    adaptive.CHAT_ADMISSION_BACKOFF = 2.0
    await slow_windows(admission, 0.1)  # no exception reaches the stream that reported
    assert admission.limit() == 4
    assert "not adjusted" in caplog.text


async def test_the_cap_and_the_limiters_decisions_are_on_metrics(adaptive):
    admission = Admission(label="t-adaptive-metrics")
    held = [admission.slot(priority=0, reserved_ok=True) for _ in range(4)]
    for slot in held:
        await slot.__aenter__()
    await slow_windows(admission, 0.1)

    body = (await AsyncClient().get("/metrics")).content.decode()

    assert 'chat_admission_limit{engine="t-adaptive-metrics"} 2.0' in body
    assert (
        'chat_admission_limit_changes_total{direction="down",engine="t-adaptive-metrics"} 1.0'
        in body
    )
    assert 'chat_admission_tpot_sample_seconds_count{engine="t-adaptive-metrics"} 4.0' in body
    for slot in held:
        await slot.__aexit__(None, None, None)


# --- a free turn is not left waiting past the bound ------------------------------------------


async def test_the_expected_wait_is_the_place_in_the_queue_times_the_mean_hold_over_the_cap(
    adaptive,
):
    adaptive.CHAT_ADMISSION_ADAPTIVE = False
    adaptive.CHAT_MAX_NUM_SEQS = 2
    admission = Admission(label="t-expected-wait")
    assert admission.expected_wait_s() == 0.0  # no request has finished: no evidence
    began = time.monotonic()
    async with admission.slot(priority=0, reserved_ok=True):
        await asyncio.sleep(0.2)
    held_at_most = time.monotonic() - began
    assert admission.expected_wait_s() == 0.0  # a slot is free

    held = [admission.slot(priority=0, reserved_ok=True) for _ in range(2)]
    for slot in held:
        await slot.__aenter__()
    first = admission.expected_wait_s()
    assert 0.2 / 2 <= first <= held_at_most / 2  # first in line: one hold time over 2 slots
    waiter = asyncio.get_running_loop().create_task(_hold_briefly(admission))
    await asyncio.sleep(0)
    assert admission.expected_wait_s() == pytest.approx(2 * first)  # second in line
    for slot in held:
        await slot.__aexit__(None, None, None)
    await waiter


def test_a_free_turn_that_would_wait_past_the_bound_is_shed_and_a_paid_one_is_not(settings):
    settings.CHAT_SHED_FREE_WAITING = 100
    settings.CHAT_SHED_FREE_WAIT_S = 2.0
    settings.CHAT_SHED_RETRY_AFTER_S = 5
    pools = pool_set()
    free, paid = route_to("mini"), route_to("frontier")

    assert shed(free, tier="free", waiting=1, pools=pools, expected_wait_s=1.9) == free
    with pytest.raises(Overloaded) as caught:
        shed(free, tier="free", waiting=1, pools=pools, expected_wait_s=2.1)
    assert caught.value.retry_after_s == 5
    assert shed(paid, tier="paid", waiting=1, pools=pools, expected_wait_s=60) == paid
    settings.CHAT_SHED_FREE_WAIT_S = 0  # off
    assert shed(free, tier="free", waiting=1, pools=pools, expected_wait_s=60) == free


@pytest.mark.django_db(transaction=True)
async def test_a_free_turn_facing_a_long_wait_gets_503_busy_before_streaming(
    make_user, engine_double, adaptive
):
    """The wait bound is judged at the door, so the refusal is a real 503 with Retry-After
    (PF-R3), not a 200 stream that ends in an error."""
    adaptive.CHAT_ADMISSION_ADAPTIVE = False
    adaptive.CHAT_MAX_NUM_SEQS = 1
    adaptive.CHAT_SHED_FREE_WAIT_S = 0.1
    adaptive.CHAT_SHED_RETRY_AFTER_S = 3
    admission = admission_for(engine_double)
    async with admission.slot(priority=0, reserved_ok=True):
        await asyncio.sleep(0.3)  # the mean hold: 0.3 s
    client, _ = await api_client(make_user, tier="free")
    conversation_id = await new_conversation(client)
    async with admission.slot(priority=0, reserved_ok=True):  # the one slot held: ~0.3 s wait
        response = await post_json(
            client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"}
        )
    assert_error(response, 503, "busy")
    assert response["Retry-After"] == "3"
    assert engine_double.requests == []
