"""The usage ledger: one row per answered turn (or /v1 completion) with its tokens and cost.

A row that names a conversation lives in that conversation's region's database (issue 20 part 1:
its turn and conversation ids stay in the region); a row without one (a ``/v1/chat/completions``
call that stores no turn) in ``default``. Readers (usage/selectors.py, privacy) visit every
ledger database (:func:`usage.selectors.ledger_dbs`) and add up. A conversation's deletion (or
retention purge) must not erase what was charged, so ``turn_id`` and ``conversation_id`` are plain
UUIDs, not foreign keys, and users and organisations are referenced without a database
constraint (they live in ``default``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class UsageRecord(models.Model):
    """What one turn used and cost. Written once per turn (``usage.services.usage_record``,
    PF-R5), never updated: a ledger.

    - ``prompt_tokens``: the whole prompt the engine prefilled, *including* ``cached_tokens``
      (the part served from the prefix cache, charged at the cheaper cached-input price).
    - ``completion_tokens``: tokens generated, also for a cancelled or failed turn (what was
      actually generated, not zero).
    - ``cost_usd``: what the user (and organisation) is charged: from the pool's prices per 1M
      tokens at the time of the turn (``inference.pools.Pool.cost``), rounded half-up to 8
      decimal places; 0 for an answer the output gate withdrew (status ``blocked``), whose cost
      is ``operator_cost_usd`` instead (issue 28: a withdrawn answer is not billed).
    """

    class Status(models.TextChoices):
        # The same values as conversations.models.Turn.Status.
        COMPLETE = "complete", "Complete"
        CANCELLED = "cancelled", "Cancelled"
        FAILED = "failed", "Failed"
        # Withdrawn by the output moderation gate: not charged to the user (cost_usd 0); what it
        # cost is operator_cost_usd (issue 28).
        BLOCKED = "blocked", "Blocked"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
        db_constraint=False,
    )
    org = models.ForeignKey(
        "accounts.Organisation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
        db_constraint=False,
    )
    turn_id = models.UUIDField(null=True, blank=True)
    conversation_id = models.UUIDField(null=True, blank=True)
    pool = models.CharField(max_length=64)
    model_version = models.CharField(max_length=100)
    tier = models.CharField(max_length=16)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    # What the operator bore instead of the user: the cost of an answer the output gate withdrew.
    operator_cost_usd = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = [
            # usage.selectors: a user's days, an organisation's members, newest first.
            models.Index(fields=["user", "created_at"], name="usage_user_created"),
            models.Index(fields=["org", "created_at"], name="usage_org_created"),
        ]
        constraints = [
            # Usage is counted once per turn (PF-R5): a retried write-back cannot charge twice.
            models.UniqueConstraint(
                fields=["turn_id"],
                condition=models.Q(turn_id__isnull=False),
                name="usage_one_record_per_turn",
            ),
            models.CheckConstraint(
                condition=models.Q(cached_tokens__lte=models.F("prompt_tokens")),
                name="usage_cached_within_prompt",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pool}@{self.model_version}: {self.tokens} tokens, ${self.cost_usd}"

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens (cached tokens are part of the prompt)."""
        return self.prompt_tokens + self.completion_tokens
