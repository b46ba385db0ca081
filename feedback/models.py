"""Feedback on answers: thumbs up or down with an optional comment (issue 8).

Rows live in their conversation's region database (``settings.CHAT_REGIONAL_APPS``), beside its
turns. The rated answer is referenced by ``turn_id`` without a database constraint: the turn log
is partitioned by month, so nothing may hold a foreign key to it (see ``Turn``), and an answer
can be rated while it is still held in Redis awaiting write-back. The user lives in ``default``,
so that reference carries no constraint either (DESIGN.md: none across databases).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class Feedback(models.Model):
    """One user's rating of one answer; rating again replaces it (one row per user and answer).

    ``pool`` / ``model_version``: copied from the answer (``Turn.pool``, ``Turn.model_version``)
    when it is rated, so counts per pool and version (canary decisions) need no join with the
    turn log; blank for answers stored before turns recorded them.
    """

    class Rating(models.TextChoices):
        UP = "up", "Thumbs up"
        DOWN = "down", "Thumbs down"

    # A UUID, not a sequence: rows of one table live in several region databases, and an id
    # must name one row wherever it is (admin links, the API).
    feedback_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        "conversations.Conversation",
        on_delete=models.CASCADE,
        related_name="feedback",
        db_index=False,  # the (conversation, user) index below serves conversation lookups
    )
    turn = models.ForeignKey(
        "conversations.Turn",
        on_delete=models.DO_NOTHING,  # turns go only with their conversation (CASCADE above)
        db_constraint=False,
        db_index=False,  # the unique (turn, user) index below serves turn lookups
        related_name="+",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, db_constraint=False, related_name="+"
    )
    rating = models.CharField(max_length=8, choices=Rating.choices)
    comment = models.TextField(blank=True)
    pool = models.CharField(max_length=64, blank=True)
    model_version = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "feedback"
        verbose_name_plural = "feedback"
        ordering = ("-updated_at", "-feedback_id")
        constraints = [
            models.UniqueConstraint(fields=["turn", "user"], name="feedback_one_per_user_turn"),
            models.CheckConstraint(
                condition=models.Q(rating__in=["up", "down"]), name="feedback_rating_up_or_down"
            ),
        ]
        indexes = [
            # Counts per pool and version (feedback.selectors.feedback_counts): index-only.
            models.Index(fields=["pool", "model_version", "rating"], name="feedback_pool_counts"),
            models.Index(fields=["conversation", "user"], name="feedback_conversation_user"),
            models.Index(fields=["updated_at"], name="feedback_updated"),
        ]

    def __str__(self) -> str:
        return f"{self.get_rating_display()} on {self.turn_id}"
