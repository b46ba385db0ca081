"""Celery tasks of long-term memory (memory/extraction.py, memory/blocks.py): thin wrappers.

Nothing below imports this module (no import cycle): the beat sweep hands
:func:`memory_extract`'s ``delay`` to memory.extraction.memory_sweep, and a change of a user's
facts reaches :func:`queue_block_rebuild` through the ``memory_facts_changed`` signal, which
memory/apps.py connects by importing this module.

Beat entry (chatsite/settings/base.py)::

    CELERY_BEAT_SCHEDULE["memory.memory_sweep"] = {
        "task": "memory.memory_sweep", "schedule": float(CHAT_MEMORY_SWEEP_S),
    }
"""

from __future__ import annotations

import logging
from uuid import UUID

from celery import shared_task
from django.db import DatabaseError, InterfaceError
from django.dispatch import receiver

from inference.service_client import ServiceCallError
from memory import blocks, extraction
from memory.signals import memory_block_rebuilt, memory_facts_changed

logger = logging.getLogger(__name__)


@shared_task(
    name="memory.memory_extract",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DatabaseError, InterfaceError),
    retry_backoff=5,
    max_retries=3,
)
def memory_extract(conversation_id: str) -> dict:
    """Celery: :func:`memory.extraction.conversation_memory_extract` for ``conversation_id`` (a
    UUID string); returns ``{"status", "stored"}``. Safe to deliver more than once, one after
    the other or at the same time: one idle period's facts are stored once (the marker's
    compare-and-set). Queued by :func:`memory_sweep`, never by a turn."""
    return extraction.conversation_memory_extract(conversation_id=UUID(conversation_id)).as_dict()


@shared_task(name="memory.memory_sweep", acks_late=True)
def memory_sweep() -> int:
    """Celery beat, every ``CHAT_MEMORY_SWEEP_S``: :func:`memory.extraction.memory_sweep` now,
    queueing :func:`memory_extract`; returns how many extractions it queued."""
    return len(extraction.memory_sweep(queue=memory_extract.delay))


@shared_task(
    name="memory.memory_block_rebuild",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DatabaseError, InterfaceError),
    retry_backoff=5,
    max_retries=3,
)
def memory_block_rebuild(user_id: str) -> dict:
    """Celery: :func:`memory.blocks.memory_block_rebuild` for user ``user_id`` (a primary key
    as a string), then, when it rebuilt, sends ``memory.signals.memory_block_rebuilt``
    (conversations/prefix_warm.py warms the prefix cache); returns ``{"status": "gone" | "current" | "rebuilt", "warmed_tokens"}``. Queued after commit by
    every change of the user's facts (memory.blocks.memory_block_touch, through
    :func:`queue_block_rebuild`); safe to deliver more
    than once or late (a rebuild of a current block does nothing). A failed warm-up is logged:
    the block is stored, and only the prefix cache misses it."""
    rebuilt = blocks.memory_block_rebuild(user_id=int(user_id))
    if rebuilt is None:
        return {"status": "gone", "warmed_tokens": 0}
    if not rebuilt[1]:
        return {"status": "current", "warmed_tokens": 0}
    try:
        responses = memory_block_rebuilt.send(sender=None, user_id=int(user_id))
        warmed = sum(tokens for _, tokens in responses if isinstance(tokens, int))
    except ServiceCallError as exc:
        logger.warning("memory block warm-up for user %s failed: %s", user_id, exc)
        warmed = 0
    return {"status": "rebuilt", "warmed_tokens": warmed}


@receiver(memory_facts_changed, dispatch_uid="memory.queue_block_rebuild")
def queue_block_rebuild(sender, *, user_id, **kwargs) -> None:
    """Queue :func:`memory_block_rebuild` for ``user_id`` once a change of their facts committed
    (``memory.signals.memory_facts_changed``; connected by memory/apps.py in every process)."""
    memory_block_rebuild.delay(str(user_id))
