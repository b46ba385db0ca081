"""Celery tasks of the privacy app: thin wrappers.

Beat entry (chatsite/settings/base.py)::

    CELERY_BEAT_SCHEDULE["privacy.account_deletions_finish"] = {
        "task": "privacy.account_deletions_finish", "schedule": float(CHAT_PRIVACY_DELETION_SWEEP_S),
    }
"""

from __future__ import annotations

from celery import shared_task

from privacy import services


@shared_task(name="privacy.account_deletions_finish")
def account_deletions_finish() -> int:
    """Complete account deletions that were asked for and stopped part way (a region's database
    was down, the process died); returns how many were completed. Idempotent: each step of a
    deletion deletes what is still there (privacy.services.account_deletion_run)."""
    return services.account_deletions_finish()
