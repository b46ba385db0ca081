"""Retention: conversations are purged after their owner's (or organisation's) period (the
zero-retention decision, which keeps a conversation's turns out of PostgreSQL altogether, is
``selectors.conversation_zero_retention``).

Issue 4 ("Retention"). Periods, in days after a conversation's last turn:

- a conversation of an organisation: ``Organisation.retention_days``, or when that is unset the
  organisation's tier's value in ``settings.CHAT_RETENTION_DAYS_BY_TIER``;
- any other conversation: its owner's tier's value there.

``None`` means kept. A temporary chat (``Conversation.temporary``, issue 18) goes sooner:
``settings.CHAT_ZDR_TTL_S`` seconds after its last turn (:func:`temporary_chats_purge_expired`,
beat every ``CHAT_TEMPORARY_PURGE_S``), when its page has not already deleted it
(views.conversation_discard, the ``pagehide`` beacon). The daily beat task
``conversations.conversations_purge_expired`` deletes
what is past its period (:func:`conversations_purge_expired`).

Accounts and organisations live in the global (default) database and conversations in their
region's, so nothing here joins across the two: owners and organisations are read first, then
their conversations are deleted by id lists in batches.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from accounts.models import Organisation, User
from conversations import deletion
from conversations.models import Conversation
from conversations.selectors import retention_days_for_tier
from core import regions

logger = logging.getLogger(__name__)

BATCH = 1000  # ids per DELETE ... WHERE owner_id/org_id IN (...)


def organisation_retention_days(organisation: Organisation) -> int | None:
    """An organisation's period in days: its own ``retention_days``, else its tier's."""
    if organisation.retention_days is not None:
        return organisation.retention_days
    return retention_days_for_tier(organisation.tier)


def _batches(ids: Iterable, size: int = BATCH) -> Iterator[list]:
    batch: list = []
    for item in ids:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _purge(conversations, *, owner_ids=None, org_ids=None, cutoff: datetime) -> int:
    """Delete the conversations in ``conversations`` (a queryset on one database) of these owners
    or organisations whose last turn is before ``cutoff``, through the deletion service (their
    turns and every copy; an answer still written in one is stopped); returns how many. The
    rows are locked there, so a turn appended meanwhile (it locks the row too) waits and finds
    it gone, and a conversation that got a turn while the purge waited is kept: none is deleted
    after it stopped being expired."""
    query = conversations.filter(last_turn_at__lt=cutoff)
    if owner_ids is not None:
        query = query.filter(org__isnull=True, owner_id__in=owner_ids)
    if org_ids is not None:
        query = query.filter(org_id__in=org_ids)
    return len(deletion.conversations_delete(conversations=query).conversation_ids)


def conversations_purge_expired(*, now: datetime | None = None) -> int:
    """Delete every conversation (and its turns) whose last turn is older than its retention
    period (module docstring) at ``now`` (default: the current time; tests pass a moved clock),
    in every region's database, and its copies in Redis (hot cache, held turns).
    Returns the number of conversations deleted. Safe to run at any time and more than once.
    """
    now = now or timezone.now()
    # Organisations' conversations, grouped by period so each period is one batch of deletes.
    org_ids_by_days: dict[int, list[int]] = defaultdict(list)
    for organisation in Organisation.objects.only("pk", "tier", "retention_days"):
        days = organisation_retention_days(organisation)
        if days is not None:
            org_ids_by_days[days].append(organisation.pk)
    purged = 0
    for alias in regions.region_dbs():
        conversations = Conversation.objects.using(alias)
        for days, org_ids in org_ids_by_days.items():
            for batch in _batches(org_ids):
                purged += _purge(conversations, org_ids=batch, cutoff=now - timedelta(days=days))
        # Everyone else's, by the owner's tier.
        for tier, days in settings.CHAT_RETENTION_DAYS_BY_TIER.items():
            if days is None:
                continue
            owners = User.objects.filter(tier=tier).values_list("pk", flat=True).iterator(BATCH)
            for batch in _batches(owners):
                purged += _purge(conversations, owner_ids=batch, cutoff=now - timedelta(days=days))
    if purged:
        logger.info("retention: purged %d conversation(s)", purged)
    return purged


def temporary_chats_purge_expired(*, now: datetime | None = None) -> int:
    """Delete every temporary chat whose last turn (or, with none, its creation: the
    ``last_turn_at`` default) is more than ``settings.CHAT_ZDR_TTL_S`` seconds before ``now``
    (default: the current time), in every region's database, through the deletion service.
    By then its turns' only copies in Redis have expired too, so this removes the empty row
    that is left. Returns how many were deleted; safe to run at any time and more than once."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.CHAT_ZDR_TTL_S)
    purged = 0
    for alias in regions.region_dbs():
        query = Conversation.objects.using(alias).filter(temporary=True, last_turn_at__lt=cutoff)
        purged += len(deletion.conversations_delete(conversations=query).conversation_ids)
    if purged:
        logger.info("retention: deleted %d temporary chat(s)", purged)
    return purged


@shared_task(name="conversations.temporary_chats_purge_expired", acks_late=True)
def temporary_chats_purge_expired_task() -> int:
    """Celery beat, every ``CHAT_TEMPORARY_PURGE_S``: :func:`temporary_chats_purge_expired`."""
    return temporary_chats_purge_expired()


@shared_task(name="conversations.conversations_purge_expired", acks_late=True)
def conversations_purge_expired_task() -> int:
    """Celery beat, daily: :func:`conversations_purge_expired` now; returns the count."""
    return conversations_purge_expired()
