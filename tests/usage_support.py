"""Helpers for the usage tests (tests/test_usage*.py): a pool of the process's pool set, and a
ledger row written through the service, then dated."""

from __future__ import annotations

import datetime as dt
import uuid

from inference.pools import pool_set
from usage import services
from usage.models import UsageRecord

# --- helpers ------------------------------------------------------------------------------


def pool(name: str):
    return pool_set().get(name)


def record(
    user,
    *,
    at: dt.datetime,
    org=None,
    pool_name="mini",
    prompt=0,
    cached=0,
    completion=0,
    status="complete",
) -> UsageRecord:
    """A ledger row written through the service, then dated ``at``."""
    row = services.usage_record(
        user=user,
        org=org,
        turn_id=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        route_pool=pool(pool_name),
        tier=getattr(user, "tier", "free"),
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        status=status,
    )
    UsageRecord.objects.filter(pk=row.pk).update(created_at=at)
    return row
