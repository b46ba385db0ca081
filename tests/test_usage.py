"""Usage and cost: the ledger (usage.services: cost arithmetic, once per turn) and the daily
totals (usage.selectors: zero-filled UTC days). Per-member totals, the pages and the admin:
test_usage_pages.py.

Prices are the default pools' (chatsite/settings/engine.py CHAT_POOLS, the design brief's):
mini $0.75 / $0.075 / $4.50 and frontier $5.00 / $0.50 / $30.00 per 1M input / cached input /
output tokens.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest
from django.utils import timezone

from core import dbrouter
from tests.usage_support import pool, record
from usage import selectors, services
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db


UTC = dt.UTC


# --- usage_record: cost arithmetic, once per turn -----------------------------------------


@pytest.mark.parametrize(
    ("pool_name", "expected"),
    [
        # (600 uncached * 0.75 + 400 cached * 0.075 + 200 out * 4.50) / 1M
        ("mini", Decimal("0.00138000")),
        # (600 * 5.00 + 400 * 0.50 + 200 * 30.00) / 1M
        ("frontier", Decimal("0.00920000")),
    ],
)
def test_cost_charges_uncached_cached_and_completion_tokens_at_the_pools_prices(
    make_user, pool_name, expected
):
    """Given a turn of 1,000 prompt tokens (400 from the prefix cache) and 200 completion
    tokens, when it is recorded, then the stored cost prices each kind at the answering pool's
    price per 1M tokens, and the pool, version and token counts are stored."""
    user = make_user(tier="paid")
    turn_id, conversation_id = uuid.uuid4(), uuid.uuid4()
    services.usage_record(
        user=user,
        org=None,
        turn_id=turn_id,
        conversation_id=conversation_id,
        route_pool=pool(pool_name),
        tier="paid",
        prompt_tokens=1000,
        cached_tokens=400,
        completion_tokens=200,
        status="complete",
    )
    row = UsageRecord.objects.get()
    assert row.cost_usd == expected
    assert (row.pool, row.model_version, row.tier) == (pool_name, pool(pool_name).version, "paid")
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (1000, 400, 200)
    assert (row.turn_id, row.conversation_id, row.user_id) == (turn_id, conversation_id, user.pk)


def test_cost_is_rounded_half_up_to_the_ledgers_eight_decimals(make_user):
    """One cached token on mini costs $0.000000075: stored (and returned) as $0.00000008."""
    row = services.usage_record(
        user=make_user(),
        org=None,
        turn_id=None,
        conversation_id=None,
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=1,
        cached_tokens=1,
        completion_tokens=0,
        status="complete",
    )
    assert row.cost_usd == Decimal("0.00000008")
    row.refresh_from_db()
    assert row.cost_usd == Decimal("0.00000008")


def test_usage_is_counted_once_per_turn(make_user):
    """PF-R5: recording the same turn twice (a retried write-back) keeps one record and
    charges once; the second call returns the first record."""
    user = make_user()
    turn_id = uuid.uuid4()
    kwargs = dict(
        user=user,
        org=None,
        turn_id=turn_id,
        conversation_id=uuid.uuid4(),
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=100,
        cached_tokens=0,
        completion_tokens=50,
        status="complete",
    )
    first = services.usage_record(**kwargs)
    second = services.usage_record(**{**kwargs, "completion_tokens": 80})
    assert UsageRecord.objects.count() == 1
    assert second.pk == first.pk and second.completion_tokens == 50
    assert selectors.usage_totals(user=user, days=1).completion_tokens == 50


def test_a_zero_retention_turn_is_charged_once_without_its_id(make_user):
    """Given a zero-retention turn (kept nowhere at rest), its ledger row is written and
    charged once (PF-R5, a retry included) but stores an opaque key, not the turn's id
    (issue 20: nothing of the turn at rest after the TTL)."""
    user = make_user()
    turn_id = uuid.uuid4()
    kwargs = dict(
        user=user, org=None, turn_id=turn_id, conversation_id=uuid.uuid4(), route_pool=pool("mini"),
        tier="free", prompt_tokens=100, cached_tokens=0, completion_tokens=50, status="complete",
        zero_retention=True,
    )  # fmt: skip

    first = services.usage_record(**kwargs)
    second = services.usage_record(**kwargs)

    (row,) = UsageRecord.objects.all()
    assert second.pk == first.pk == row.pk and row.completion_tokens == 50
    assert row.turn_id != turn_id and row.turn_id == services.zero_retention_key(turn_id)
    assert not UsageRecord.objects.filter(turn_id=turn_id).exists()


def test_a_cancelled_turn_is_charged_for_the_tokens_it_generated(make_user):
    """PF-R5: a turn cancelled after 37 tokens is stored as cancelled and charged for its
    prompt and those 37 tokens, not zero."""
    row = services.usage_record(
        user=make_user(),
        org=None,
        turn_id=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=20,
        cached_tokens=0,
        completion_tokens=37,
        status="cancelled",
    )
    row.refresh_from_db()
    assert row.status == "cancelled"
    assert row.completion_tokens == 37
    assert row.cost_usd == Decimal("0.00018150")  # (20 * 0.75 + 37 * 4.50) / 1M


@pytest.mark.parametrize(
    "override",
    [{"prompt_tokens": -1}, {"completion_tokens": -5}, {"cached_tokens": 1.5}, {"status": "done"}],
)
def test_bad_counts_or_status_are_refused(make_user, override):
    kwargs = dict(
        user=make_user(),
        org=None,
        turn_id=None,
        conversation_id=None,
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=1,
        status="complete",
    )
    with pytest.raises(ValueError):
        services.usage_record(**{**kwargs, **override})
    assert not UsageRecord.objects.exists()


def test_the_ledger_refuses_more_cached_than_prompt_tokens(make_user):
    """The serving layer clamps what an engine reports before anything is tallied (issue 17:
    one clamp); the ledger's contract is valid counts, so an impossible one is an error here
    rather than a second, silent clamp (tests/test_tiers.py checks the clamp end to end)."""
    with pytest.raises(ValueError, match="cached"):
        services.usage_record(
            user=make_user(),
            org=None,
            turn_id=None,
            conversation_id=None,
            route_pool=pool("mini"),
            tier="free",
            prompt_tokens=100,
            cached_tokens=120,
            completion_tokens=0,
            status="complete",
        )


def test_the_answering_pool_is_charged_not_the_requested_one(make_user):
    """A paid turn degraded to mini (load shedding) is recorded with mini's name and prices."""
    row = services.usage_record(
        user=make_user(tier="paid"),
        org=None,
        turn_id=None,
        conversation_id=None,
        route_pool=pool("mini"),
        tier="paid",
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=1000,
        status="complete",
    )
    assert (row.pool, row.cost_usd) == ("mini", Decimal("0.00450000"))


def test_the_ledger_is_migrated_into_region_databases_and_read_from_every_one(settings):
    """Ledger rows of a conversation live in its region's database (issue 20 part 1): the usage
    tables are migrated there, and readers visit default and every region's database.
    tests/test_region_databases.py checks where rows land on two real servers."""
    settings.CHAT_REGION_DATABASES = {"us-east": "region_us-east", "eu-west": "default"}
    router = dbrouter.PrimaryReplicaRouter()

    assert router.allow_migrate("region_us-east", "usage") is True
    assert router.allow_migrate("default", "usage") is True
    assert selectors.ledger_dbs() == ["default", "region_us-east"]


# --- usage_daily / usage_totals: zero-filled UTC days ---------------------------------------


NOW = dt.datetime(2026, 3, 10, 15, 30, tzinfo=UTC)


def test_days_without_usage_are_zero_filled_oldest_first(make_user):
    """Given usage two days ago and today, the 7-day series has 7 days, oldest first, with the
    usage on its days and zeros on the other five."""
    user = make_user()
    record(user, at=NOW - dt.timedelta(days=2), prompt=100, completion=10)
    record(user, at=NOW, prompt=5, cached=2, completion=1)
    record(user, at=NOW - dt.timedelta(minutes=5), prompt=5, completion=1)

    days = selectors.usage_daily(user=user, days=7, now=NOW)

    assert [d.date for d in days] == [dt.date(2026, 3, 4) + dt.timedelta(days=i) for i in range(7)]
    by_date = {d.date: d for d in days}
    assert by_date[dt.date(2026, 3, 8)][1:4] == (100, 0, 10)
    assert by_date[dt.date(2026, 3, 10)][1:4] == (10, 2, 2)
    assert by_date[dt.date(2026, 3, 10)].cost_usd == Decimal("0.00001515")  # 8*.75+2*.075+2*4.5
    idle = [d.tokens for d in days if d.date not in (dt.date(2026, 3, 8), dt.date(2026, 3, 10))]
    assert idle == [0] * 5


def test_days_are_utc_days_whatever_the_active_time_zone(make_user):
    """A record at 23:59:59 UTC and one at 00:00:00 UTC the next day fall on two UTC days,
    also while a far-off time zone (UTC+14) is active."""
    user = make_user()
    record(user, at=dt.datetime(2026, 3, 8, 23, 59, 59, tzinfo=UTC), completion=1)
    record(user, at=dt.datetime(2026, 3, 9, 0, 0, 0, tzinfo=UTC), completion=2)

    with timezone.override("Pacific/Kiritimati"):
        days = selectors.usage_daily(user=user, days=3, now=NOW)

    assert [(d.date, d.completion_tokens) for d in days] == [
        (dt.date(2026, 3, 8), 1),
        (dt.date(2026, 3, 9), 2),
        (dt.date(2026, 3, 10), 0),
    ]


def test_the_window_starts_at_midnight_utc_of_its_first_day(make_user):
    """days=3 on March 10 covers March 8 00:00 UTC up to March 11 00:00 UTC: a record one
    second earlier, and another user's record, are left out of the days and the totals."""
    user = make_user()
    record(user, at=dt.datetime(2026, 3, 8, tzinfo=UTC), prompt=7)
    record(user, at=dt.datetime(2026, 3, 8, tzinfo=UTC) - dt.timedelta(seconds=1), prompt=1000)
    record(user, at=dt.datetime(2026, 3, 11, tzinfo=UTC), prompt=3000)
    record(make_user(), at=NOW, prompt=500)

    days = selectors.usage_daily(user=user, days=3, now=NOW)
    totals = selectors.usage_totals(user=user, days=3, now=NOW)

    assert [d.prompt_tokens for d in days] == [7, 0, 0]
    assert (totals.prompt_tokens, totals.requests) == (7, 1)


def test_totals_are_the_sum_of_the_days(make_user):
    user = make_user()
    for i, (prompt, completion, pool_name) in enumerate([(100, 20, "mini"), (300, 40, "frontier")]):
        record(
            user,
            at=NOW - dt.timedelta(days=i),
            prompt=prompt,
            completion=completion,
            pool_name=pool_name,
        )
    days = selectors.usage_daily(user=user, days=30, now=NOW)
    totals = selectors.usage_totals(user=user, days=30, now=NOW)
    assert totals.tokens == sum(d.tokens for d in days) == 460
    assert totals.cost_usd == sum(d.cost_usd for d in days) == Decimal("0.00286500")
    assert totals.requests == 2


@pytest.mark.parametrize("days", [0, -1, 367])
def test_window_outside_one_to_366_days_is_refused(make_user, days):
    with pytest.raises(ValueError):
        selectors.usage_daily(user=make_user(), days=days)
