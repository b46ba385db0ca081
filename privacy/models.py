"""Account deletions in progress (privacy/services.py ``account_delete``).

Deleting an account spans several databases (the default one and every region's), which no
single transaction covers, so it runs in steps that can each be repeated. This row says that a
deletion was asked for and not finished: the account is already closed (signed out, keys
revoked, no sign-in) and ``manage.py account_deletions_finish`` completes the rest. It holds
the account's id only, and goes with the account when the last step commits.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AccountDeletion(models.Model):
    """A deletion of account ``user_id`` asked for at ``requested_at`` and not finished yet."""

    user_id = models.BigIntegerField(unique=True)
    requested_at = models.DateTimeField(default=timezone.now)
    # The staff member who asked for it, None: the person themself (or the system).
    requested_by_id = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"deletion of account #{self.user_id} since {self.requested_at:%Y-%m-%d %H:%M}"
