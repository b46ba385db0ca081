"""Reads of feedback: the answer being rated, a user's ratings, counts per pool and version."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db.models import Count, Q
from django.http import Http404

from accounts.models import User
from conversations import held, regions
from conversations.models import Conversation, Turn
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
    for pending in held.held_turns(conversation.conversation_id):
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
