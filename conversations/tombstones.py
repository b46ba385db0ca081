"""Tombstones of deleted conversations in Redis: ``chat:deleted:{conversation_id}``.

Written by the deletion service (conversations/deletion.py) once a deletion commits, and read
by what may still write for a conversation after it is gone: the write-back task and its
sweeper (conversations/writeback.py) drop held answers of a tombstoned conversation without
asking PostgreSQL, and a turn's event log writer (conversations/turnlog.py) deletes its log
instead of keeping it for ``CHAT_STREAM_TTL_S``.

A tombstone is a shortcut, never the authority: it is lost when Redis is down at the moment of
deletion or restarts without its data. The authority is the conversation row itself, which every
write of a turn locks (``services.turn_append_assistant`` raises Conversation.DoesNotExist when
it is gone), so a missing tombstone costs one database query, never a resurrected conversation.

Each lives ``settings.CHAT_STREAM_TTL_S`` seconds (1 h): an answer that was being generated when
its conversation was deleted ends (cancelled, or at its token budget when the cancel could not
reach it) and holds its last record well within that time. Redis part ``writeback``.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from django.conf import settings

from core import redis_guard
from core.regions import redis_region

PART = "writeback"


def tombstone_key(conversation_id: UUID | str) -> str:
    """Redis key marking ``conversation_id`` as deleted (value ``"1"``)."""
    return f"chat:deleted:{conversation_id}"


def tombstones_write(conversation_ids: Iterable[UUID | str]) -> None:
    """Mark ``conversation_ids`` deleted for ``settings.CHAT_STREAM_TTL_S`` seconds (one
    pipeline). Never raises for Redis errors: without a tombstone the row check still refuses
    every late write (module docstring)."""
    by_region: dict[str | None, list[str]] = {}  # each on its conversation's region's server
    for c in conversation_ids:
        by_region.setdefault(redis_region(c), []).append(tombstone_key(c))
    ttl = max(int(settings.CHAT_STREAM_TTL_S), 1)

    def run(client, keys):
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, "1", ex=ttl)
            pipe.execute()

    for region, keys in by_region.items():
        redis_guard.call(
            PART, lambda client, k=keys: run(client, k), default=None,
            fallback="late writes are refused by the row check", region=region,
        )  # fmt: skip


def tombstoned(conversation_id: UUID | str) -> bool:
    """Whether ``conversation_id`` was deleted within the last hour, per Redis (False when
    unknown, also when Redis is unavailable: the caller then relies on the row check)."""
    found = redis_guard.call(
        PART, lambda client: client.exists(tombstone_key(conversation_id)), default=0,
        region=redis_region(conversation_id),
    )  # fmt: skip
    return bool(found)


async def atombstoned(conversation_id: UUID | str) -> bool:
    """:func:`tombstoned` for the event loop."""
    found = await redis_guard.acall(
        PART, lambda client: client.exists(tombstone_key(conversation_id)), default=0,
        region=redis_region(conversation_id),
    )  # fmt: skip
    return bool(found)
