"""The circuit breaker of a region's primary (core/db_breaker.py; issue 20 part 4), on an
injectable clock: no servers, no sleeping."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from core import db_breaker
from core import metrics
from core.db_breaker import Breaker, PrimaryDown


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def breaker(clock, failures=3, window_s=30.0, open_s=10.0) -> Breaker:
    return Breaker(failures=failures, window_s=window_s, open_s=open_s, clock=clock)


def test_opens_after_n_failures_within_the_window(clock):
    """Given N = 3, when three connects fail within the window, then it opens on the third and
    not before, and refuses without trying."""
    b = breaker(clock)
    assert b.failed() is False
    clock.now += 5
    assert b.failed() is False
    assert b.allow() is True
    clock.now += 5
    assert b.failed() is True
    assert b.is_open and b.allow() is False


def test_failures_older_than_the_window_do_not_count(clock):
    """Given failures spread wider than the window, then the breaker stays closed."""
    b = breaker(clock, window_s=10)
    b.failed()
    clock.now += 6
    b.failed()
    clock.now += 6  # the first is now 12 s old
    assert b.failed() is False
    assert not b.is_open


def test_a_success_forgets_earlier_failures(clock):
    b = breaker(clock)
    b.failed()
    b.failed()
    b.succeeded()
    assert b.failed() is False


def test_half_open_lets_one_probe_through_after_the_cool_down(clock):
    """Given it opened, then nothing passes during the cool-down, exactly one probe after it,
    and Retry-After counts down to that probe."""
    b = breaker(clock, failures=1, open_s=10)
    b.failed()
    clock.now += 3
    assert b.allow() is False
    assert b.retry_after_s() == 7
    clock.now += 7
    assert b.allow() is True
    assert b.allow() is False  # one probe at a time


def test_a_failed_probe_opens_it_for_another_cool_down(clock):
    b = breaker(clock, failures=1, open_s=10)
    b.failed()
    clock.now += 10
    assert b.allow() is True
    assert b.failed() is True
    clock.now += 9
    assert b.allow() is False
    assert b.retry_after_s() == 1


def test_a_successful_probe_closes_it(clock):
    b = breaker(clock, failures=1, open_s=10)
    b.failed()
    clock.now += 10
    assert b.allow() is True
    b.succeeded()
    assert not b.is_open
    assert b.allow() is True and b.allow() is True


def test_retry_after_is_an_integer_of_at_least_one(clock):
    """PF-R3: every 503 carries an integer Retry-After >= 1."""
    b = breaker(clock, failures=1, open_s=2.5)
    assert b.retry_after_s() == 1
    b.failed()
    clock.now += 0.2
    assert b.retry_after_s() == 3
    clock.now += 5
    assert b.retry_after_s() == 1


class _DeadConnection:
    def ensure_connection(self):
        raise OperationalError("connection refused")


def test_primary_ensure_counts_connect_failures_then_refuses_at_once(monkeypatch, settings):
    """Given a primary whose connects fail and N = 2, then the first two writes try and are
    refused with 503 + Retry-After (the breaker opening on the second, its gauge at 1), and the
    third is refused without connecting."""
    settings.CHAT_REGION_BREAKER_FAILURES = 2
    settings.CHAT_REGION_BREAKER_OPEN_S = 10
    db_breaker.reset()
    attempts = []

    class Dead(_DeadConnection):
        def ensure_connection(self):
            attempts.append(1)
            super().ensure_connection()

    monkeypatch.setattr(db_breaker, "connections", {"region_x": Dead()})
    for _ in range(3):
        with pytest.raises(PrimaryDown) as refused:
            db_breaker.primary_ensure("region_x")
        assert refused.value.status == 503
        assert int(refused.value.headers["Retry-After"]) >= 1
    assert len(attempts) == 2
    assert db_breaker.is_down("region_x")
    assert metrics.value("chat_region_breaker_open", region="region_x") == 1.0
    db_breaker.reset()
