"""Who is at an answer right now, across server processes, per Redis: a reader following it
from its event log elsewhere (:func:`reading` marks it, :func:`reader_present` asks), and the
process writing it (:func:`writing`, from the conversation's generating lock,
conversations/answer_lock.py).

conversations/turnstream.py uses them for its disconnect rule (an answer read in another
process is not abandoned) and to tell a resumable answer from a finished one. False when Redis
is unavailable (part ``turnlog``, core/redis_guard.py). The keys live on the Redis server of
the conversation's region (core/regions.py ``redis_region``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from uuid import UUID

from conversations.answer_lock import busy_key
from conversations.turnlog import MIRROR_FALLBACK, owner_key
from core import redis_guard
from core.regions import redis_region


def reader_key(answer_id: UUID | str) -> str:
    return f"chat:a:{answer_id}:remote-reader"


# A reader in another process marks its presence for this long and renews the mark every third
# of it, so the writing process does not abort an answer that is read elsewhere (turnstream's
# disconnect rule); the mark of a reader that left lapses within this many seconds.
READER_TTL_S = 6


async def reader_present(answer_id: UUID, *, conversation_id: UUID | None = None) -> bool:
    """Whether a reader in some process follows ``answer_id`` from Redis now (its mark is set:
    :func:`reading`). False if Redis is unavailable."""
    found = await redis_guard.acall(
        "turnlog", lambda r: r.exists(reader_key(answer_id)), default=0, fallback=MIRROR_FALLBACK,
        region=redis_region(conversation_id, answer_id),
    )  # fmt: skip
    return bool(found)


@contextlib.asynccontextmanager
async def reading(answer_id: UUID, *, conversation_id: UUID | None = None) -> AsyncIterator[None]:
    """Mark, for the block's duration, that a reader here follows ``answer_id`` from Redis
    (renewed every ``READER_TTL_S / 3`` s; it lapses ``READER_TTL_S`` s after the block)."""
    region = redis_region(conversation_id, answer_id)

    async def mark() -> None:
        while True:
            await redis_guard.acall(
                "turnlog", lambda r: r.set(reader_key(answer_id), "1", ex=READER_TTL_S),
                default=None, fallback=MIRROR_FALLBACK, region=region,
            )  # fmt: skip
            await asyncio.sleep(READER_TTL_S / 3)

    task = asyncio.get_running_loop().create_task(mark(), name=f"chat-reader-{answer_id}")
    try:
        yield
    finally:
        task.cancel()


async def writing(answer_id: UUID, *, conversation_id: UUID | None = None) -> bool:
    """Whether some process is writing ``answer_id`` now: its conversation's "generating" lock
    (refreshed every ``BUSY_REFRESH_S`` by the writer, gone ``BUSY_TTL_S`` after it dies) names
    it. True also before its first event, while the answer waits for an engine slot, when its
    log does not exist yet (False if Redis is unavailable)."""

    async def read(client):
        conversation_id = await client.get(owner_key(answer_id))
        return conversation_id is not None and await client.get(busy_key(conversation_id)) == str(
            answer_id
        )

    return bool(
        await redis_guard.acall(
            "turnlog",
            read,
            default=False,
            fallback=MIRROR_FALLBACK,
            region=redis_region(conversation_id, answer_id),
        )
    )
