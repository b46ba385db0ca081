"""Reads of feedback: the answer being rated, a user's ratings, counts per pool and version."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db.models import Count, Q
from django.http import Http404

from accounts.models import User
from conversations.models import Conversation, Turn
from conversations.selectors import held_turns
from core import regions
from feedback.models import Feedback


@regions.routed
def feedback_turn_get(*, conversation: Conversation, turn_id: UUID) -> Turn:
    """Turn ``turn_id`` of ``conversation``, of any role (stored, or held in Redis awaiting
    write-back), so the caller can tell an unknown turn (404) from a message that is not an
    answer (400). Raises Http404 if the conversation has no turn with that id. The caller has
    already checked that the user may see ``conversation``."""
    turn = conversation.turns.filter(turn_id=turn_id).first()
    if turn is not None:
        return turn
    for pending in held_turns(conversation.conversation_id):
        if pending.turn_id == turn_id:
            return pending
    raise Http404("No such answer in this conversation.")


@regions.routed
def feedback_by_answer(*, conversation: Conversation, user: User) -> dict[UUID, Feedback]:
    """``user``'s ratings of ``conversation``'s answers, by answer turn id (one query)."""
    rows = Feedback.objects.filter(conversation=conversation, user_id=user.pk)
    return {row.turn_id: row for row in rows}


@dataclass(frozen=True)
class FeedbackCount:
    """Ratings of one pool's answers at one model version (blank: not recorded)."""

    pool: str
    model_version: str
    up: int
    down: int

    @property
    def total(self) -> int:
        return self.up + self.down

    @property
    def up_share(self) -> float | None:
        """Thumbs up / all ratings, 0..1; None without ratings."""
        return self.up / self.total if self.total else None


def feedback_counts(*, since: datetime | None = None) -> list[FeedbackCount]:
    """Current ratings (one per user and answer: a changed rating counts as its new value)
    counted per (pool, model_version), summed over every region's database, sorted by pool
    then version. ``since``: only ratings given or changed at or after it (None: all)."""
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for db in regions.region_dbs():
        rows = regions.manager(Feedback, db).all()
        if since is not None:
            rows = rows.filter(updated_at__gte=since)
        grouped = (
            rows.order_by()
            .values("pool", "model_version")
            .annotate(
                up=Count("pk", filter=Q(rating=Feedback.Rating.UP)),
                down=Count("pk", filter=Q(rating=Feedback.Rating.DOWN)),
            )
        )
        for row in grouped:
            counts = totals[(row["pool"], row["model_version"])]
            counts[0] += row["up"]
            counts[1] += row["down"]
    return [
        FeedbackCount(pool=pool, model_version=version, up=up, down=down)
        for (pool, version), (up, down) in sorted(totals.items())
    ]


# --- the canary page: latency, errors and ratings per pool and model version ----------------


def histogram_quantile(q: float, bounds: tuple[float, ...], cumulative: list[int]) -> float | None:
    """The ``q``-quantile (0..1) of values counted in cumulative buckets, as Prometheus's
    ``histogram_quantile`` estimates it: ``cumulative[i]`` values are <= ``bounds[i]`` (bounds
    ascending, the first bucket's lower edge 0); the quantile is interpolated linearly inside
    the bucket its rank falls in. ``cumulative`` may end with one more count (all values, the
    +Inf bucket): a rank beyond the last bound gives that bound, as Prometheus does. None
    without values. Raises ValueError for ``q`` outside 0..1."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile q must be in 0..1, got {q!r}")
    total = cumulative[-1] if cumulative else 0
    if not total:
        return None
    rank = q * total
    below, lower = 0, 0.0
    for bound, count in zip(bounds, cumulative):
        if count >= rank and count > below:
            return lower + (bound - lower) * (rank - below) / (count - below)
        below, lower = count, bound
    return bounds[-1]


@dataclass(frozen=True)
class VersionHealth:
    """One pool at one model version over a window: its answers, how many failed, TTFT and TPOT
    percentiles (milliseconds, estimated from buckets, :func:`histogram_quantile`), and its
    ratings. ``role``: "stable" (the pool's configured version), "canary" (a CHAT_CANARIES
    version of the pool) or "" (neither now)."""

    pool: str
    model_version: str
    role: str
    answers: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    up: int
    down: int

    @property
    def error_rate(self) -> float | None:
        """Failed answers / answers, 0..1; None without answers."""
        return self.failed / self.answers if self.answers else None

    @property
    def up_share(self) -> float | None:
        """Thumbs up / all ratings, 0..1; None without ratings."""
        rated = self.up + self.down
        return self.up / rated if rated else None


def _latency_annotations(field_name: str, bounds_ms: tuple[float, ...]) -> dict:
    """Count(...) annotations: values of ``field_name`` <= each bound, and all values."""
    out = {
        f"{field_name}__le{i}": Count("pk", filter=Q(**{f"{field_name}__lte": bound}))
        for i, bound in enumerate(bounds_ms)
    }
    out[f"{field_name}__all"] = Count(field_name)
    return out


def version_health(*, since: datetime | None = None) -> list[VersionHealth]:
    """Per (pool, model_version), every region's database summed: assistant turns written at or
    after ``since`` (None: all), the failed ones, TTFT and TPOT p50/p99 from the turns'
    ``ttft_ms`` / ``tpot_ms``, counted in core/metrics.py's histogram buckets (so regions
    add up, and the figures match the ``/metrics`` histograms'), and the ratings
    (:func:`feedback_counts`, same window on the rating's time). Sorted by pool, then the stable
    version first, then version."""
    from django.conf import settings  # noqa: PLC0415

    from core.metrics import TPOT_BUCKETS, TTFT_BUCKETS  # noqa: PLC0415
    from inference.pools import pool_set  # noqa: PLC0415

    ttft_bounds = tuple(b * 1000 for b in TTFT_BUCKETS)
    tpot_bounds = tuple(b * 1000 for b in TPOT_BUCKETS)
    sums: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for db in regions.region_dbs():
        rows = regions.manager(Turn, db).filter(role=Turn.Role.ASSISTANT)
        if since is not None:
            rows = rows.filter(created_at__gte=since)
        grouped = (
            rows.order_by()
            .values("pool", "model_version")
            .annotate(
                answers=Count("pk"),
                failed=Count("pk", filter=Q(status=Turn.Status.FAILED)),
                **_latency_annotations("ttft_ms", ttft_bounds),
                **_latency_annotations("tpot_ms", tpot_bounds),
            )
        )
        for row in grouped:
            key = (row.pop("pool"), row.pop("model_version"))
            for name, count in row.items():
                sums[key][name] += count
    for count in feedback_counts(since=since):
        key = (count.pool, count.model_version)
        sums[key]["up"] += count.up
        sums[key]["down"] += count.down

    pools = pool_set()
    canaries = {(c.get("pool"), c.get("version")) for c in settings.CHAT_CANARIES}

    def role(pool: str, version: str) -> str:
        configured = pools.get(pool) if pool in pools.names() else None
        if configured is not None and configured.version == version:
            return "stable"
        return "canary" if (pool, version) in canaries else ""

    def quantiles(counts: dict, field_name: str, bounds: tuple[float, ...]) -> tuple:
        cumulative = [counts[f"{field_name}__le{i}"] for i in range(len(bounds))]
        cumulative.append(counts[f"{field_name}__all"])
        return tuple(
            None if (v := histogram_quantile(q, bounds, cumulative)) is None else round(v, 1)
            for q in (0.5, 0.99)
        )

    out = []
    for (pool, version), counts in sums.items():
        ttft50, ttft99 = quantiles(counts, "ttft_ms", ttft_bounds)
        tpot50, tpot99 = quantiles(counts, "tpot_ms", tpot_bounds)
        out.append(VersionHealth(
            pool=pool, model_version=version, role=role(pool, version),
            answers=counts["answers"], failed=counts["failed"],
            ttft_p50_ms=ttft50, ttft_p99_ms=ttft99, tpot_p50_ms=tpot50, tpot_p99_ms=tpot99,
            up=counts["up"], down=counts["down"],
        ))  # fmt: skip
    return sorted(out, key=lambda h: (h.pool, h.role != "stable", h.model_version))
