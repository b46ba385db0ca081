"""The adaptive admission cap (inference/limiter.py): AIMD on per-stream TPOT samples, with an
injected clock (no engine, no event loop)."""

from __future__ import annotations

import pytest

from inference.limiter import DOWN, UP, LimiterConfig, TpotLimiter, quantile

CONFIG = LimiterConfig(target_s=0.080, min_limit=2, backoff=0.5, window_s=1.0, min_samples=3)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def window(limiter: TpotLimiter, clock: Clock, tpot_s: float, *, running: int, waiting: int,
           max_limit: int = 16, config: LimiterConfig = CONFIG):  # fmt: skip
    """Feed one full window of equal samples (3 over 1 s); -> the last observe's result."""
    decision = None
    for step in (0.0, 0.5, 0.5):
        clock.now += step
        decision = limiter.observe(
            tpot_s, running=running, waiting=waiting, max_limit=max_limit, config=config
        )
    clock.now += 0.01
    return decision


def test_slow_streams_cut_the_cap_multiplicatively():
    clock = Clock()
    limiter = TpotLimiter(initial=16, clock=clock)

    decision = window(limiter, clock, 0.150, running=16, waiting=0)

    assert decision is not None and decision.direction == DOWN
    assert (decision.before, decision.after, limiter.limit) == (16, 8, 8)
    assert decision.tpot_s == pytest.approx(0.150)


def test_no_decision_before_the_window_has_passed_and_has_enough_samples():
    clock = Clock()
    limiter = TpotLimiter(initial=16, clock=clock)
    for _ in range(10):  # many samples, no time passing
        assert limiter.observe(0.5, running=16, waiting=0, max_limit=16, config=CONFIG) is None
    clock.now += 5  # time, but this window already has its samples: now it decides
    assert limiter.observe(0.5, running=16, waiting=0, max_limit=16, config=CONFIG) is not None

    fresh = TpotLimiter(initial=16, clock=clock)
    fresh.observe(0.5, running=16, waiting=0, max_limit=16, config=CONFIG)
    clock.now += 5  # time, but only 2 samples
    assert fresh.observe(0.5, running=16, waiting=0, max_limit=16, config=CONFIG) is None
    assert fresh.limit == 16


def test_no_second_cut_while_more_run_than_the_cap():
    """After a cut, running requests finish at their own pace: their samples still measure the
    old batch, so they must not cut again (one decrease per round trip)."""
    clock = Clock()
    limiter = TpotLimiter(initial=16, clock=clock)
    window(limiter, clock, 0.150, running=16, waiting=4)
    assert limiter.limit == 8

    assert window(limiter, clock, 0.150, running=12, waiting=4) is None
    assert limiter.limit == 8
    assert window(limiter, clock, 0.150, running=8, waiting=4).after == 4


def test_the_cap_never_goes_below_the_minimum():
    clock = Clock()
    limiter = TpotLimiter(initial=3, clock=clock)
    assert window(limiter, clock, 1.0, running=3, waiting=0).after == 2
    assert window(limiter, clock, 1.0, running=2, waiting=0) is None
    assert limiter.limit == 2


def test_room_under_the_target_raises_the_cap_by_one_while_requests_wait_behind_it():
    clock = Clock()
    limiter = TpotLimiter(initial=4, clock=clock)

    decision = window(limiter, clock, 0.040, running=4, waiting=3)

    assert decision is not None and decision.direction == UP
    assert (decision.before, decision.after) == (4, 5)
    assert window(limiter, clock, 0.040, running=5, waiting=3).after == 6


def test_room_does_not_raise_a_cap_nobody_waits_behind():
    clock = Clock()
    limiter = TpotLimiter(initial=4, clock=clock)
    assert window(limiter, clock, 0.040, running=4, waiting=0) is None  # nobody queued
    assert window(limiter, clock, 0.040, running=2, waiting=3) is None  # cap not reached
    assert limiter.limit == 4


def test_just_under_the_target_is_not_room():
    """Between RAISE_BELOW x target and the target the cap holds: no saw-tooth at the edge."""
    clock = Clock()
    limiter = TpotLimiter(initial=4, clock=clock)
    assert window(limiter, clock, 0.078, running=4, waiting=3) is None
    assert limiter.limit == 4


def test_the_cap_never_exceeds_the_slots():
    clock = Clock()
    limiter = TpotLimiter(initial=4, clock=clock)
    assert window(limiter, clock, 0.010, running=4, waiting=5, max_limit=4) is None
    assert limiter.limit == 4
    # Slots shrunk under it (a narrower engine): the cap follows at once.
    limiter.observe(0.01, running=0, waiting=0, max_limit=3, config=CONFIG)
    assert limiter.limit == 3


def test_a_few_slow_steps_do_not_decide_alone():
    """The window's 90th percentile decides: one long prefill step among fast ones is not a
    slow batch."""
    clock = Clock()
    limiter = TpotLimiter(initial=8, clock=clock)
    for i in range(20):
        clock.now += 0.06
        limiter.observe(0.5 if i == 7 else 0.03, running=8, waiting=0, max_limit=8, config=CONFIG)
    assert limiter.limit == 8


def test_bad_samples_are_ignored():
    clock = Clock()
    limiter = TpotLimiter(initial=8, clock=clock)
    for bad in (float("nan"), float("inf"), -1.0):
        clock.now += 1
        assert limiter.observe(bad, running=8, waiting=0, max_limit=8, config=CONFIG) is None
    assert limiter.limit == 8


def test_out_of_range_configuration_is_refused():
    with pytest.raises(ValueError, match="backoff"):
        LimiterConfig(backoff=1.0)
    with pytest.raises(ValueError, match="min limit"):
        LimiterConfig(min_limit=0)
    with pytest.raises(ValueError, match="window"):
        LimiterConfig(window_s=0)


def test_the_configuration_comes_from_settings(settings):
    settings.CHAT_ADMISSION_TPOT_TARGET_MS = 50
    settings.CHAT_ADMISSION_MIN_LIMIT = 3
    settings.CHAT_ADMISSION_BACKOFF = 0.7
    settings.CHAT_ADMISSION_WINDOW_S = 2.5
    settings.CHAT_ADMISSION_MIN_SAMPLES = 4

    assert LimiterConfig.from_settings() == LimiterConfig(0.05, 3, 0.7, 2.5, 4)


def test_quantile_interpolates_between_ranks():
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)
    assert quantile([7.0], 0.9) == 7.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_out_of_range_settings_fail_the_system_check(settings):
    from inference.checks import check_admission_limiter  # noqa: PLC0415

    assert check_admission_limiter() == []
    settings.CHAT_ADMISSION_BACKOFF = 1.5

    (error,) = check_admission_limiter()
    assert error.id == "chat.E005" and "CHAT_ADMISSION" in error.msg
