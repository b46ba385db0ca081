"""Writes of the moderation app: keeping a withdrawn answer for review, and the reviewer's
"this was fine" (issue 28)."""

from __future__ import annotations

import logging
from uuid import UUID

from django.utils import timezone

from core import regions
from moderation.models import WithdrawnAnswer

logger = logging.getLogger(__name__)

# Longest text kept (characters): an answer is bounded by its token budget anyway.
MAX_KEPT_CHARS = 100_000


def withdrawn_answer_keep(
    *,
    conversation_id: UUID,
    turn_id: UUID,
    owner_id: int,
    org_id: int | None,
    text: str,
    window: str,
    verdict: dict,
    zero_retention: bool,
) -> WithdrawnAnswer | None:
    """Keep the answer ``turn_id`` the output gate withdrew for review: its ``text`` as streamed
    until it was stopped, the ``window`` that fired and the ``verdict`` (``Verdict.as_json``),
    in the conversation's region's database. Returns the row, or None when nothing is kept: a
    ``zero_retention`` conversation (nothing at rest, ever), or a verdict that is no judgement
    of the text (``moderation_unavailable``: the check failed). Idempotent on ``turn_id``.
    Raises DatabaseError when the database fails (callers log it: the answer is delivered)."""
    categories = verdict.get("categories") or []
    if zero_retention or not categories or "moderation_unavailable" in categories:
        return None
    db = regions.db_for_conversation_id(conversation_id)
    review, _ = WithdrawnAnswer.objects.using(db).get_or_create(
        turn_id=turn_id,
        defaults={
            "conversation_id": conversation_id, "owner_id": owner_id, "org_id": org_id,
            "text": text[:MAX_KEPT_CHARS], "window": window[:MAX_KEPT_CHARS], "verdict": verdict,
        },
    )  # fmt: skip
    return review


def withdrawn_answer_mark_fine(*, review: WithdrawnAnswer, reviewer) -> WithdrawnAnswer:
    """Record ``reviewer``'s judgement that the withdrawn answer was fine: a labelled false
    positive of the categories in its verdict (``fine``, ``reviewed_by``, ``reviewed_at``).
    Permission is the caller's (moderation/selectors.py). Returns the row."""
    review.fine = True
    review.reviewed_by_id = reviewer.pk
    review.reviewed_at = timezone.now()
    review.save(update_fields=["fine", "reviewed_by", "reviewed_at"], using=review._state.db)
    logger.info("withdrawn answer %s marked fine by user %s (false positive: %s)",
                review.turn_id, reviewer.pk, ", ".join(review.categories))
    return review
