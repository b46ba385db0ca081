"""Reads for usage: a user's daily totals, an organisation's per-member totals, who may see
an organisation's usage, and what a user's tier allows (the settings page).

Days are UTC calendar days (``settings.TIME_ZONE`` is UTC and billing days must not move with
a viewer's clock): "the last N days" is today (UTC) and the N - 1 days before it.

The ledger is in several databases (usage/models.py: a conversation's rows in its region's,
the rest in ``default``): every read here asks each of :func:`ledger_dbs` (their primaries:
billing must see the latest charge) and adds the sums up; none joins the ledger with accounts.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import TYPE_CHECKING, NamedTuple

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, DecimalField, IntegerField, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from accounts.models import Membership, Organisation, User
from core import regions
from usage.models import UsageRecord

if TYPE_CHECKING:
    from inference.pools import Pool

UTC = dt.timezone.utc
MAX_DAYS = 366
ZERO_COST = Decimal("0")


class DailyUsage(NamedTuple):
    """One UTC day of a user's usage. Tokens are counts; ``cost_usd`` is USD."""

    date: dt.date
    prompt_tokens: int
    cached_tokens: int  # part of prompt_tokens
    completion_tokens: int
    cost_usd: Decimal

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


class UsageTotals(NamedTuple):
    """A user's usage over a window: token counts, USD cost and the number of records."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: Decimal
    requests: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class MemberUsage(NamedTuple):
    """One person's usage charged to an organisation over a window.

    ``role`` is their membership role ("owner", "admin", "member"), or "" for someone charged to
    the organisation who is no longer a member; ``username`` is "" for a deleted account."""

    username: str
    role: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: Decimal
    requests: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def usage_window(
    *, days: int, now: dt.datetime | None = None
) -> tuple[dt.date, dt.datetime, dt.datetime]:
    """(first UTC date, start, end) of the last ``days`` UTC days ending today: records with
    ``start <= created_at < end`` (aware datetimes, midnight UTC) are in the window.
    ``now`` defaults to ``timezone.now()``. Raises ValueError unless 1 <= days <= 366."""
    if not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be an integer from 1 to {MAX_DAYS}, got {days!r}")
    today = (now or timezone.now()).astimezone(UTC).date()
    first = today - dt.timedelta(days=days - 1)
    start = dt.datetime.combine(first, dt.time.min, tzinfo=UTC)
    end = dt.datetime.combine(today + dt.timedelta(days=1), dt.time.min, tzinfo=UTC)
    return first, start, end


def _sums() -> dict:
    zero_int = Value(0, output_field=IntegerField())
    zero_cost = Value(ZERO_COST, output_field=DecimalField(max_digits=14, decimal_places=8))
    return {
        "prompt": Coalesce(Sum("prompt_tokens"), zero_int),
        "cached": Coalesce(Sum("cached_tokens"), zero_int),
        "completion": Coalesce(Sum("completion_tokens"), zero_int),
        "cost": Coalesce(Sum("cost_usd"), zero_cost),
        "requests": Count("id"),
    }


def ledger_dbs() -> list[str]:
    """Every primary alias holding ledger rows: ``default``, then each region's database."""
    return list(dict.fromkeys([DEFAULT_DB_ALIAS, *regions.region_dbs()]))


def _added(rows: list[dict]) -> dict:
    """The sums of :func:`_sums` rows from several databases, added up."""
    total = {"prompt": 0, "cached": 0, "completion": 0, "cost": ZERO_COST, "requests": 0}
    for row in rows:
        for key in total:
            total[key] += row[key]
    return total


def _in_window(
    records: QuerySet, *, days: int, now: dt.datetime | None
) -> tuple[QuerySet, dt.date]:
    first, start, end = usage_window(days=days, now=now)
    return records.filter(created_at__gte=start, created_at__lt=end), first


def usage_daily(*, user: User, days: int = 30, now: dt.datetime | None = None) -> list[DailyUsage]:
    """The user's usage per UTC day over the last ``days`` days, oldest first: exactly ``days``
    rows, days without usage as zeros. ``now`` (for tests) defaults to the current time.
    Raises ValueError for ``days`` outside 1..366."""
    grouped: dict[dt.date, list[dict]] = {}
    first = None
    for db in ledger_dbs():
        records, first = _in_window(
            UsageRecord.objects.using(db).filter(user=user), days=days, now=now
        )
        for row in (
            records.annotate(day=TruncDate("created_at", tzinfo=UTC))
            .values("day")
            .annotate(**_sums())
            .order_by("day")
        ):
            grouped.setdefault(row["day"], []).append(row)
    per_day = {day: _added(rows) for day, rows in grouped.items()}
    result = []
    for offset in range(days):
        date = first + dt.timedelta(days=offset)
        row = per_day.get(date)
        if row is None:
            result.append(DailyUsage(date, 0, 0, 0, ZERO_COST))
        else:
            result.append(
                DailyUsage(date, row["prompt"], row["cached"], row["completion"], row["cost"])
            )
    return result


def usage_totals(*, user: User, days: int = 30, now: dt.datetime | None = None) -> UsageTotals:
    """The user's usage summed over the same window as :func:`usage_daily`.
    Raises ValueError for ``days`` outside 1..366."""
    row = _added(
        [
            _in_window(UsageRecord.objects.using(db).filter(user=user), days=days, now=now)[
                0
            ].aggregate(**_sums())
            for db in ledger_dbs()
        ]
    )
    return UsageTotals(
        row["prompt"], row["cached"], row["completion"], row["cost"], row["requests"]
    )


def usage_by_member(
    *, org: Organisation, days: int = 30, now: dt.datetime | None = None
) -> list[MemberUsage]:
    """Usage charged to ``org`` (``UsageRecord.org``) over the last ``days`` UTC days, one row
    per person: every current member (zeros when they used nothing), then anyone else charged
    to the organisation in the window (former members, deleted accounts). Sorted by cost, then
    tokens (highest first), then username. Raises ValueError for ``days`` outside 1..366."""
    grouped: dict[int | None, list[dict]] = {}
    for db in ledger_dbs():
        records, _ = _in_window(UsageRecord.objects.using(db).filter(org=org), days=days, now=now)
        for row in records.values("user_id").annotate(**_sums()).order_by():
            grouped.setdefault(row["user_id"], []).append(row)
    per_user = {user_id: _added(rows) for user_id, rows in grouped.items()}
    names = dict(
        User.objects.filter(pk__in=[u for u in per_user if u is not None]).values_list(
            "pk", "username"
        )
    )
    rows = []
    memberships = Membership.objects.filter(organisation=org).select_related("user")
    for membership in memberships:
        row = per_user.pop(membership.user_id, None)
        rows.append(_member_row(membership.user.username, membership.role, row))
    for user_id, row in per_user.items():  # charged to the org, no longer a member
        rows.append(_member_row(names.get(user_id, ""), "", row))
    rows.sort(key=lambda r: (-r.cost_usd, -r.tokens, r.username))
    return rows


def _member_row(username: str, role: str, row: dict | None) -> MemberUsage:
    if row is None:
        return MemberUsage(username, role, 0, 0, 0, ZERO_COST, 0)
    return MemberUsage(
        username,
        role,
        row["prompt"],
        row["cached"],
        row["completion"],
        row["cost"],
        row["requests"],
    )


def orgs_administered(*, user: User) -> list[Organisation]:
    """The organisations ``user`` owns or administers (links to their usage pages), by name."""
    return list(
        Organisation.objects.filter(
            membership__user=user,
            membership__role__in=(Membership.Role.OWNER, Membership.Role.ADMIN),
        ).order_by("name")
    )


def pools_for_user(*, user: User) -> list[Pool]:
    """The pools (default versions) ``user`` may choose: their tier's, plus any a feature flag
    opens (``inference.pools.PoolSet.for_tier``, ``settings.CHAT_FLAG_POOLS``)."""
    from inference.pools import pool_set  # noqa: PLC0415 - pools validate settings on first use

    return pool_set().for_tier(user.tier, user.feature_flags or ())


class RateLimit(NamedTuple):
    """Requests per minute and tokens per minute (None: unlimited), and whose limit it is."""

    scope: str  # "you" or an organisation's name
    rpm: int | None
    tpm: int | None


def rate_limits_for_user(*, user: User) -> list[RateLimit]:
    """The user's own limits (``settings.CHAT_RATE_LIMITS_BY_TIER`` by their tier), then each
    of their organisations' shared limits (``settings.CHAT_ORG_RATE_LIMITS_BY_TIER`` by the
    organisation's tier, or the organisation's own RPM / TPM where set: workspaces/), by
    organisation name. A tier missing from a setting: unlimited."""
    own = settings.CHAT_RATE_LIMITS_BY_TIER.get(user.tier) or {}
    limits = [RateLimit("you", own.get("rpm"), own.get("tpm"))]
    org_limits = getattr(settings, "CHAT_ORG_RATE_LIMITS_BY_TIER", {})
    for org in Organisation.objects.filter(membership__user=user).order_by("name"):
        shared = org_limits.get(org.tier) or {}
        rpm = org.rate_limit_rpm if org.rate_limit_rpm is not None else shared.get("rpm")
        tpm = org.rate_limit_tpm if org.rate_limit_tpm is not None else shared.get("tpm")
        limits.append(RateLimit(org.name, rpm, tpm))
    return limits
