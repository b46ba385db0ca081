"""Rate limits (inference/ratelimit.py): Redis token buckets per user and per organisation, RPM
and TPM, against the real test Redis (and, for the outage, a redis-server of the test's own).

Every scenario uses fresh buckets (ids unique to the test) and, where refill could decide the
outcome, an injected clock (``now``): a slow machine cannot make these pass or fail by luck.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from core import metrics
from core import redis_guard
from inference import ratelimit
from inference.ratelimit import (
    Decision,
    Limits,
    Reservation,
    RequestTooLarge,
    bucket_key,
    limits_for,
    rate_limit_refund,
    rate_limit_take,
)
from tests.redis_server import RedisServer

T0 = 1_000.0  # an injected clock's start, seconds


@pytest.fixture(autouse=True)
def _breaker_closed():
    """Every test starts and ends with Redis considered reachable."""
    redis_guard.breaker.reset()
    yield
    redis_guard.breaker.reset()


@pytest.fixture
def test_redis(settings):
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def party_ids(test_redis):
    """Fresh user and org ids (never used by another test); their buckets are deleted after."""
    ids = []

    def fresh() -> int:
        ids.append(uuid.uuid4().int % 10**15)
        return ids[-1]

    yield fresh
    for party_id in ids:
        for scope in ("user", "org"):
            test_redis.delete(*(bucket_key(scope, party_id, k) for k in ("rpm", "tpm")))


def take(user_id, user_limits, tokens, *, now=T0, org_id=None, org_limits=None, **kw):
    return rate_limit_take(
        user_id=user_id, org_id=org_id, user_limits=user_limits, org_limits=org_limits,
        tokens=tokens, now=now, **kw,
    )  # fmt: skip


def level(test_redis, key: str) -> float:
    return float(test_redis.hget(key, "tokens"))


# --- refill ---------------------------------------------------------------------------------


async def test_an_empty_bucket_refills_at_its_limit_per_60_seconds(party_ids):
    """Capacity = the limit; refill = limit / 60 per second (RPM 60: one request a second)."""
    user = party_ids()
    limits = Limits(rpm=60, tpm=None)
    for _ in range(60):
        assert (await take(user, limits, 0)).allowed
    assert not (await take(user, limits, 0, now=T0 + 0.9)).allowed
    allowed = await take(user, limits, 0, now=T0 + 1.0)
    assert allowed.allowed
    assert allowed.remaining_requests == 0
    # 30 s later half the bucket is back.
    half = await take(user, limits, 0, now=T0 + 31.0)
    assert half.remaining_requests == 29


async def test_tpm_refills_in_proportion_to_elapsed_time(party_ids):
    user = party_ids()
    limits = Limits(rpm=None, tpm=600)  # 10 tokens a second
    assert (await take(user, limits, 600)).remaining_tokens == 0
    assert not (await take(user, limits, 301, now=T0 + 30)).allowed
    after = await take(user, limits, 300, now=T0 + 30)
    assert after.allowed
    assert after.remaining_tokens == 0


async def test_a_bucket_never_holds_more_than_its_capacity(party_ids):
    user = party_ids()
    limits = Limits(rpm=5, tpm=1000)
    await take(user, limits, 100)
    later = await take(user, limits, 100, now=T0 + 3600)
    assert later.remaining_requests == 4
    assert later.remaining_tokens == 900


async def test_a_clock_that_goes_back_refills_nothing(party_ids):
    """A ``now`` before the stored time (two processes' injected clocks, or clock skew) neither
    refills nor empties the bucket."""
    user = party_ids()
    limits = Limits(rpm=2, tpm=None)
    await take(user, limits, 0, now=T0 + 10)
    await take(user, limits, 0, now=T0 + 10)
    refused = await take(user, limits, 0, now=T0)
    assert not refused.allowed
    assert refused.remaining_requests == 0


# --- RPM ----------------------------------------------------------------------------------


async def test_rpm_allows_exactly_the_limit_at_one_instant(party_ids):
    user = party_ids()
    limits = Limits(rpm=5, tpm=None)
    decisions = [await take(user, limits, 0) for _ in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    assert [d.remaining_requests for d in decisions] == [4, 3, 2, 1, 0, 0, 0]
    assert decisions[5].limited_by == "user rpm"


async def test_twenty_concurrent_takes_with_rpm_10_allow_exactly_10(party_ids):
    """PF-R4 within one process: 20 takes at once on Redis's own clock, exactly 10 pass (the
    check and the take are one atomic step)."""
    user = party_ids()
    limits = Limits(rpm=10, tpm=None)
    decisions = await asyncio.gather(
        *(rate_limit_take(user_id=user, org_id=None, user_limits=limits, org_limits=None,
                          tokens=0) for _ in range(20))
    )  # fmt: skip
    assert sum(d.allowed for d in decisions) == 10
    refused = [d for d in decisions if not d.allowed]
    assert all(d.retry_after_s >= 1 for d in refused)


# --- TPM: reserve and refund --------------------------------------------------------------


async def test_pf_r1_tpm_1000_refuses_the_fourth_300_token_turn(party_ids):
    """PF-R1: TPM 1000, turns of ~300 tokens (100 prompt + max_tokens 200, all used): three
    pass, the fourth is refused. Refunds of what each used change nothing (all was used)."""
    user = party_ids()
    limits = Limits(rpm=None, tpm=1000)
    outcomes = []
    for i in range(4):
        decision = await take(user, limits, 300, now=T0 + i * 0.5)
        outcomes.append(decision.allowed)
        if decision.allowed:
            await rate_limit_refund(decision.reservation, tokens_used=300, now=T0 + i * 0.5)
    assert outcomes == [True, True, True, False]


async def test_pf_r2_a_1900_token_prompt_with_max_tokens_10_twice_is_refused_the_second_time(
    party_ids,
):
    """PF-R2: input counts. TPM 2000; 1,900 prompt + max_tokens 10 twice: the second is
    refused, even after the first refunds the unused part of max_tokens."""
    user = party_ids()
    limits = Limits(rpm=None, tpm=2000)
    first = await take(user, limits, 1910)
    assert first.allowed
    await rate_limit_refund(first.reservation, tokens_used=1900 + 4, now=T0 + 1)
    second = await take(user, limits, 1910, now=T0 + 1)
    assert not second.allowed
    assert second.limited_by == "user tpm"


async def test_remaining_tokens_fall_by_prompt_plus_completion_after_the_refund(
    party_ids, test_redis
):
    """PF-R2: reserve prompt + max_tokens; after the answer the bucket is down by exactly prompt
    + completion tokens."""
    user = party_ids()
    limits = Limits(rpm=None, tpm=2000)
    decision = await take(user, limits, 300 + 200)
    assert decision.remaining_tokens == 1500
    assert decision.reservation == Reservation(keys=(bucket_key("user", user, "tpm"),), tokens=500)
    await rate_limit_refund(decision.reservation, tokens_used=300 + 37, now=T0)
    probe = await take(user, limits, 0, now=T0)
    assert probe.remaining_tokens == 2000 - 337
    assert level(test_redis, bucket_key("user", user, "tpm")) == pytest.approx(1663, abs=1e-6)


async def test_a_refund_never_raises_a_bucket_above_its_capacity(party_ids, test_redis):
    user = party_ids()
    limits = Limits(rpm=None, tpm=1000)
    decision = await take(user, limits, 400)
    # Much later the bucket is full again by refill; the refund must not push it over.
    await rate_limit_refund(decision.reservation, tokens_used=0, now=T0 + 600)
    assert level(test_redis, bucket_key("user", user, "tpm")) == pytest.approx(1000)


async def test_using_more_than_reserved_gives_nothing_back_and_takes_nothing_more(
    party_ids, test_redis
):
    user = party_ids()
    limits = Limits(rpm=None, tpm=1000)
    decision = await take(user, limits, 400)
    await rate_limit_refund(decision.reservation, tokens_used=450, now=T0)
    assert level(test_redis, bucket_key("user", user, "tpm")) == pytest.approx(600)


async def test_a_refund_goes_to_the_user_and_the_org_tpm_buckets(party_ids, test_redis):
    user, org = party_ids(), party_ids()
    decision = await take(
        user, Limits(rpm=10, tpm=1000), 500, org_id=org, org_limits=Limits(rpm=100, tpm=5000)
    )
    assert set(decision.reservation.keys) == {
        bucket_key("user", user, "tpm"),
        bucket_key("org", org, "tpm"),
    }
    await rate_limit_refund(decision.reservation, tokens_used=200, now=T0)
    assert level(test_redis, bucket_key("user", user, "tpm")) == pytest.approx(800)
    assert level(test_redis, bucket_key("org", org, "tpm")) == pytest.approx(4800)
    # RPM is never refunded.
    assert level(test_redis, bucket_key("user", user, "rpm")) == pytest.approx(9)


# --- all or none --------------------------------------------------------------------------


async def test_a_refusal_by_the_org_bucket_takes_nothing_from_the_user_buckets(
    party_ids, test_redis
):
    user, org = party_ids(), party_ids()
    user_limits, org_limits = Limits(rpm=2, tpm=1000), Limits(rpm=100, tpm=500)
    assert (await take(user, user_limits, 400, org_id=org, org_limits=org_limits)).allowed
    refused = await take(user, user_limits, 200, org_id=org, org_limits=org_limits)
    assert not refused.allowed
    assert refused.limited_by == "org tpm"
    assert refused.reservation is None
    assert level(test_redis, bucket_key("user", user, "tpm")) == pytest.approx(600)
    assert level(test_redis, bucket_key("user", user, "rpm")) == pytest.approx(1)
    assert level(test_redis, bucket_key("org", org, "rpm")) == pytest.approx(99)
    # The user's own buckets still hold one request and 600 tokens.
    assert (await take(user, user_limits, 600)).allowed


async def test_a_refusal_by_the_user_bucket_takes_nothing_from_the_org_buckets(
    party_ids, test_redis
):
    user, org = party_ids(), party_ids()
    user_limits, org_limits = Limits(rpm=1, tpm=None), Limits(rpm=100, tpm=5000)
    assert (await take(user, user_limits, 100, org_id=org, org_limits=org_limits)).allowed
    refused = await take(user, user_limits, 100, org_id=org, org_limits=org_limits)
    assert refused.limited_by == "user rpm"
    assert level(test_redis, bucket_key("org", org, "rpm")) == pytest.approx(99)
    assert level(test_redis, bucket_key("org", org, "tpm")) == pytest.approx(4900)


async def test_remaining_counts_are_those_of_the_tightest_bucket(party_ids):
    user, org = party_ids(), party_ids()
    decision = await take(
        user, Limits(rpm=10, tpm=10_000), 100, org_id=org, org_limits=Limits(rpm=3, tpm=20_000)
    )
    assert decision.remaining_requests == 2  # the org's
    assert decision.remaining_tokens == 9_900  # the user's


# --- Retry-After and headers ----------------------------------------------------------------


async def test_retry_after_is_the_whole_seconds_until_enough_refill(party_ids):
    """PF-R3: TPM 600 refills 10 tokens a second; 250 tokens into an empty bucket need 25 s:
    Retry-After 25, refused at 24.9 s, allowed at 25 s."""
    user = party_ids()
    limits = Limits(rpm=None, tpm=600)
    await take(user, limits, 600)
    refused = await take(user, limits, 250)
    assert refused.retry_after_s == 25
    assert refused.headers()["Retry-After"] == "25"
    assert not (await take(user, limits, 250, now=T0 + 24.9)).allowed
    assert (await take(user, limits, 250, now=T0 + 25)).allowed


async def test_retry_after_rounds_up_and_is_at_least_one_second(party_ids):
    user = party_ids()
    limits = Limits(rpm=600, tpm=None)  # 10 requests a second: the next one in 0.1 s
    for _ in range(600):
        await take(user, limits, 0)
    refused = await take(user, limits, 0)
    assert refused.retry_after_s == 1
    other = party_ids()
    await take(other, Limits(rpm=None, tpm=60), 60)
    assert (await take(other, Limits(rpm=None, tpm=60), 3, now=T0 + 0.5)).retry_after_s == 3


async def test_retry_after_is_the_longest_wait_among_the_refusing_buckets(party_ids):
    user, org = party_ids(), party_ids()
    user_limits, org_limits = Limits(rpm=1, tpm=None), Limits(rpm=None, tpm=60)
    await take(user, user_limits, 60, org_id=org, org_limits=org_limits)
    # user rpm: 60 s until one request; org tpm: 30 s until 30 tokens.
    refused = await take(user, user_limits, 30, org_id=org, org_limits=org_limits)
    assert refused.retry_after_s == 60
    assert refused.limited_by == "user rpm"


async def test_headers_omit_an_unlimited_limit(party_ids):
    user = party_ids()
    rpm_only = await take(user, Limits(rpm=3, tpm=None), 100)
    assert rpm_only.headers() == {"X-RateLimit-Remaining-Requests": "2"}
    tpm_only = await take(party_ids(), Limits(rpm=None, tpm=500), 100)
    assert tpm_only.headers() == {"X-RateLimit-Remaining-Tokens": "400"}


async def test_a_refusal_has_retry_after_and_both_remaining_headers(party_ids):
    user = party_ids()
    limits = Limits(rpm=1, tpm=1000)
    await take(user, limits, 100)
    refused = await take(user, limits, 100)
    assert refused.headers() == {
        "X-RateLimit-Remaining-Requests": "0",
        "X-RateLimit-Remaining-Tokens": "900",
        "Retry-After": "60",
    }


async def test_unlimited_touches_no_bucket(party_ids, test_redis):
    user = party_ids()
    decision = await take(user, Limits(rpm=None, tpm=None), 10**9)
    assert decision == ratelimit.ALLOWED_UNMETERED
    assert decision.headers() == {}
    assert not test_redis.exists(bucket_key("user", user, "rpm"), bucket_key("user", user, "tpm"))


async def test_a_bucket_key_expires_two_minutes_after_it_would_be_full(party_ids, test_redis):
    user = party_ids()
    await take(user, Limits(rpm=None, tpm=600), 300)  # 30 s to full again
    ttl_ms = test_redis.pttl(bucket_key("user", user, "tpm"))
    assert 149_000 < ttl_ms <= 150_000


async def test_the_script_is_loaded_again_after_redis_forgot_it(party_ids, test_redis):
    """EVALSHA with NOSCRIPT (a restarted Redis, SCRIPT FLUSH) loads the script and goes on."""
    user = party_ids()
    await take(user, Limits(rpm=2, tpm=None), 0)
    test_redis.script_flush()
    assert (await take(user, Limits(rpm=2, tpm=None), 0)).remaining_requests == 0


# --- requests that can never pass ---------------------------------------------------------


async def test_a_request_larger_than_the_tpm_capacity_is_too_large_and_takes_nothing(
    party_ids, test_redis
):
    user = party_ids()
    with pytest.raises(RequestTooLarge) as raised:
        await take(user, Limits(rpm=10, tpm=2000), 2410, prompt_tokens=1900, max_tokens=510)
    assert raised.value.message == (
        "This request may use up to 2,410 tokens (1,900 in the prompt + max_tokens 510) but "
        "your tier allows 2,000 tokens per minute. Lower max_tokens or shorten the conversation."
    )
    assert (raised.value.scope, raised.value.limit, raised.value.tokens) == ("user", 2000, 2410)
    assert not test_redis.exists(bucket_key("user", user, "rpm"))


async def test_a_request_larger_than_the_org_tpm_names_the_organisation(party_ids):
    user, org = party_ids(), party_ids()
    with pytest.raises(RequestTooLarge, match="your organisation's tier allows 1,000 tokens"):
        await take(user, Limits(rpm=None, tpm=None), 1001, org_id=org,
                   org_limits=Limits(rpm=None, tpm=1000))  # fmt: skip


async def test_a_request_of_exactly_the_capacity_passes_an_idle_bucket(party_ids):
    assert (await take(party_ids(), Limits(rpm=None, tpm=2000), 2000)).allowed


# --- Redis down ---------------------------------------------------------------------------


@pytest.fixture
def own_redis(settings):
    """A redis-server of this test's own, used by the whole process; fast breaker."""
    server = RedisServer()
    server.start()
    settings.REDIS_URL = server.url
    settings.CHAT_REDIS_BREAKER_OPEN_S = 0.2
    try:
        yield server
    finally:
        server.close()


async def test_with_redis_down_limits_fail_open_and_are_counted(own_redis):
    limits = Limits(rpm=1, tpm=1000)
    assert (await take(1, limits, 10)).allowed
    assert not (await take(1, limits, 10)).allowed  # metered while Redis is up
    own_redis.stop()
    before = metrics.value("chat_rate_limit_fail_open_total", limit="rpm+tpm")
    decisions = [await take(1, limits, 10) for _ in range(3)]
    assert all(d == ratelimit.ALLOWED_UNMETERED for d in decisions)
    assert metrics.value("chat_rate_limit_fail_open_total", limit="rpm+tpm") == before + 3
    # A refund with Redis down is dropped quietly.
    await rate_limit_refund(Reservation(keys=(bucket_key("user", 1, "tpm"),), tokens=10),
                            tokens_used=0)  # fmt: skip
    # Redis back (empty): the breaker lets a probe through and limits apply again.
    own_redis.start()
    await asyncio.sleep(0.3)
    assert (await take(1, limits, 10)).allowed
    assert not (await take(1, limits, 10)).allowed


# --- settings -----------------------------------------------------------------------------


def test_limits_come_from_the_tier_settings(settings):
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 20, "tpm": 40_000}, "paid": None}
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": 2000}}
    assert limits_for(tier="free", org_tier=None) == (Limits(rpm=20, tpm=40_000), None)
    assert limits_for(tier="paid", org_tier="enterprise") == (
        Limits(rpm=None, tpm=None),
        Limits(rpm=2000, tpm=None),
    )
    assert limits_for(tier="unknown", org_tier="free") == (
        Limits(rpm=None, tpm=None),
        Limits(rpm=None, tpm=None),
    )


def test_no_limit_tables_means_unlimited(settings):
    settings.CHAT_RATE_LIMITS_BY_TIER = None
    del settings.CHAT_ORG_RATE_LIMITS_BY_TIER
    assert limits_for(tier="free", org_tier="free") == (
        Limits(rpm=None, tpm=None),
        Limits(rpm=None, tpm=None),
    )


@pytest.mark.parametrize("bad", [0, -5, "60", 1.5, True])
def test_a_limit_that_is_not_a_positive_integer_is_a_configuration_error(settings, bad):
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": bad}}
    with pytest.raises(ImproperlyConfigured, match=r"CHAT_RATE_LIMITS_BY_TIER\['free'\]\['rpm'\]"):
        limits_for(tier="free", org_tier=None)


def test_decision_headers_of_an_allowed_request_have_no_retry_after():
    decision = Decision(
        allowed=True, retry_after_s=0, remaining_requests=3, remaining_tokens=10,
        limited_by=None, reservation=None,
    )  # fmt: skip
    assert "Retry-After" not in decision.headers()
