"""The cross-process "generating" lock of a conversation: one answer at a time per
conversation across server processes (PF-P1), in Redis (``chat:conv:{id}:generating``, SET NX).

conversations/locks.py is the entry point: ``conversation_claim`` checks this process first,
then takes this lock; the answer's event log writer (conversations/turnlog.py TurnLogWriter)
refreshes it every ``BUSY_REFRESH_S`` while the answer is written and releases it when the
answer ends. The cancel of another process's answer (conversations/cancels.py) finds the answer
to stop through it, and conversations/presence.py ``writing`` reads it.

Redis down (part ``lock``, core/redis_guard.py): :func:`conversation_lock` fails open, and the
process-local check (locks.ensure_idle) still serialises turns within a process; a lock this
process could not release is released the next time it locks that conversation (and expires
after ``BUSY_TTL_S`` anyway). The key lives on the Redis server of the conversation's region
(core/regions.py ``redis_region``).
"""

from __future__ import annotations

from uuid import UUID

from core import redis_guard
from core.regions import redis_region

_LOCK_FALLBACK = "the one-answer-per-conversation check is process-local"


def busy_key(conversation_id: UUID | str) -> str:
    return f"chat:conv:{conversation_id}:generating"


# The "generating" lock of a conversation expires unless its writer refreshes it (every
# BUSY_REFRESH_S), so a crashed process cannot block a conversation for longer than this.
BUSY_TTL_S = 60
BUSY_REFRESH_S = 10

_UNLOCK = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


# Locks this process took but could not release (Redis failed): conversation -> answer id.
_pending_unlocks: dict[UUID, UUID] = {}


async def conversation_lock(conversation_id: UUID, answer_id: UUID) -> bool:
    """Take the conversation's cross-process "generating" lock for ``answer_id`` (SET NX).
    False if another answer holds it. Fails open (True) when Redis is unavailable: the
    process-local check still applies (module docstring)."""
    stale = _pending_unlocks.pop(conversation_id, None)
    if stale is not None:
        await conversation_unlock(conversation_id, stale)
    return bool(
        await redis_guard.acall(
            "lock",
            lambda r: r.set(busy_key(conversation_id), str(answer_id), nx=True, ex=BUSY_TTL_S),
            default=True,
            fallback=_LOCK_FALLBACK,
            region=redis_region(conversation_id),
        )
    )


async def conversation_unlock(conversation_id: UUID, answer_id: UUID) -> None:
    """Release the lock if ``answer_id`` still holds it. If Redis is unavailable, the release
    is retried when this process next locks the conversation (the lock expires anyway)."""
    done = await redis_guard.acall(
        "lock",
        lambda r: r.eval(_UNLOCK, 1, busy_key(conversation_id), str(answer_id)),
        default=None,
        fallback=_LOCK_FALLBACK,
        region=redis_region(conversation_id),
    )
    if done is None:
        _pending_unlocks[conversation_id] = answer_id


async def conversation_holder(conversation_id: UUID) -> UUID | None:
    """The answer generating in this conversation in any process, per Redis (None if none or
    Redis is unavailable)."""
    value = await redis_guard.acall(
        "lock", lambda r: r.get(busy_key(conversation_id)), default=None, fallback=_LOCK_FALLBACK,
        region=redis_region(conversation_id),
    )  # fmt: skip
    return UUID(value) if value else None
