"""Per-turn event logs in Redis Streams, so any server process can resume a turn's stream.

The generating process keeps the events in memory (its own readers never wait on Redis) and
mirrors each one, in order, to the stream ``chat:turn:{answer_id}`` with the explicit entry id
``0-<event id>``; a reader in another process asks for the entries after ``0-<Last-Event-ID>``
(XREAD), so it gets exactly the events after the ones it saw, once, in order (PF-S4). The key
``chat:q:{question_id}`` names the answer being written for a user turn (the UI resumes by
question). Both expire ``settings.CHAT_STREAM_TTL_S`` after the answer ends.

Redis down is a degraded mode, not an outage. Every call goes through core/redis_guard.py
(short timeouts, a circuit breaker, a log line per outage, ``chat_redis_unavailable_total{part}``):

- **mirroring** (part ``turnlog``): answers still stream from the generating process's in-memory
  TurnStream, but a turn that meets a Redis failure stops mirroring for the rest of the turn,
  so it cannot be resumed on another process; :func:`exists` / :func:`answer_for_question` answer
  "unknown" (False / None) and the views turn a resume that needs Redis into a 503 (``/v1``) or
  an ``error`` event (the page) while ``redis_guard.available()`` is false;
- **the generating lock** (part ``lock``) and **cancel** (part ``cancel``): see
  conversations/answer_lock.py and conversations/cancels.py.

New turns mirror again as soon as Redis answers: recovery needs no restart.

**Regions** (issue 20): every key lives on the Redis server of its conversation's region
(``settings.CHAT_REGION_REDIS_URLS``, core/redis_guard.py), found from the ids with no lookup
(core/regions.py ``redis_region``: the conversation id, else the answer id, both minted
with the region's tag). Functions that take only an answer id accept its ``conversation_id``
too and should be given it.

Beside this module, by concept: the cross-process generating lock
(conversations/answer_lock.py, taken through conversations/locks.py), the cancel pub/sub
(conversations/cancels.py), reader and writer presence (conversations/presence.py), and the
live follow of another process's answer (conversations/turnfollow.py).

Deleting a conversation (conversations/deletion.py) publishes the cancel of its generating
answer from synchronous code (conversations/cancels.py ``cancel_publish``), drops its turns' keys
(:func:`turn_logs_drop`), and a writer whose conversation was deleted meanwhile deletes its log
when the answer ends instead of keeping it (conversations/tombstones.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from uuid import UUID

from django.conf import settings

from conversations import tombstones
from conversations.answer_lock import BUSY_REFRESH_S, BUSY_TTL_S, busy_key, conversation_unlock
from core import redis_guard
from core.regions import redis_region

logger = logging.getLogger(__name__)


MIRROR_FALLBACK = "answers stream from this process only and cannot be resumed elsewhere"
_FAILED = object()


def stream_key(answer_id: UUID | str) -> str:
    return f"chat:turn:{answer_id}"


def question_key(question_id: UUID | str) -> str:
    return f"chat:q:{question_id}"


def owner_key(answer_id: UUID | str) -> str:
    return f"chat:a:{answer_id}:conversation"


def turn_logs_drop(turn_ids: Iterable[UUID], *, region: str | None = None) -> None:
    """Delete the Redis keys of turns ``turn_ids`` (answers' event logs and owners, questions'
    answer pointers; ids of either kind, a missing key is no error) on ``region``'s server
    (their conversation's: ``redis_region(conversation_id)``), synchronously, in batches of
    500. Never raises for Redis errors: the keys expire ``settings.CHAT_STREAM_TTL_S`` after
    their answer ended, and none is read without the conversation's row."""
    keys = [k for t in turn_ids for k in (stream_key(t), owner_key(t), question_key(t))]

    def run(client):
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])

    if keys:
        redis_guard.call(
            "turnlog", run, default=None, fallback="the logs expire on their own", region=region
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TurnLogWriter:
    """Mirrors one turn's events to Redis in order, off the token path (a queue + one task)."""

    def __init__(
        self,
        answer_id: UUID,
        question_id: UUID,
        conversation_id: UUID,
        ttl_s: float | None = None,
        linger_s: float | None = None,
        on_mirrored: Callable[[int], None] | None = None,
    ):
        """``ttl_s``: expiry of the turn's keys (default ``settings.CHAT_STREAM_TTL_S``);
        ``linger_s``: if set, they expire this many seconds after the turn ends instead
        (zero-retention turns: conversations/retention.py); ``on_mirrored(event_id)``: called
        after each event is in Redis (the in-process window may then drop it,
        conversations/turnstream.py)."""
        self.answer_id = answer_id
        self.on_mirrored = on_mirrored
        # The last event id known to be in Redis (events are mirrored in order).
        self.mirrored_id = 0
        self.ttl_s = ttl_s
        self.linger_s = linger_s
        self.question_id = question_id
        self.conversation_id = conversation_id
        self.region = redis_region(conversation_id, answer_id)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.healthy = True

    def append(self, event_id: int, event: str, data: dict) -> None:
        """Queue an event for Redis (never blocks the caller)."""
        self._queue.put_nowait((event_id, event, data))

    def close(self) -> None:
        """No more events: flush what is queued, then set the expiry."""
        self._queue.put_nowait(None)

    async def wait_flushed(self, timeout: float = 5) -> None:
        """Wait (bounded) until every queued event reached Redis or was given up."""
        await asyncio.wait([self._task], timeout=timeout)

    async def _mirror(self, fn) -> None:
        """Run ``fn(client)`` while this turn's mirror is healthy; the first failure (or an open
        breaker) ends the mirroring for the rest of the turn: a log with a gap would make a
        resume skip events, so none is better (the turn cannot be resumed elsewhere)."""
        if not self.healthy:
            return
        result = await redis_guard.acall(
            "turnlog", fn, default=_FAILED, fallback=MIRROR_FALLBACK, region=self.region
        )
        if result is _FAILED:
            self._degrade()

    async def _run(self) -> None:
        key = stream_key(self.answer_id)
        ttl = int(self.ttl_s or settings.CHAT_STREAM_TTL_S)

        async def start(client):
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(question_key(self.question_id), str(self.answer_id), ex=ttl)
                pipe.set(owner_key(self.answer_id), str(self.conversation_id), ex=ttl)
                return await pipe.execute()

        if redis_guard.available(region=self.region):
            await self._mirror(start)
        else:
            self._degrade()  # no network call while the breaker is open
        refreshed = asyncio.get_running_loop().time()
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), BUSY_REFRESH_S)
            except TimeoutError:
                item = ()
            now = asyncio.get_running_loop().time()
            if self.healthy and now - refreshed >= BUSY_REFRESH_S:
                refreshed = now
                await self._mirror(lambda r: r.expire(busy_key(self.conversation_id), BUSY_TTL_S))
            if item == ():
                continue
            if item is None:
                break
            if not self.healthy:
                continue
            event_id, event, data = item
            fields = {"e": event, "d": json.dumps(data, ensure_ascii=False)}
            await self._mirror(lambda r, f=fields, i=event_id: r.xadd(key, f, id=f"0-{i}"))
            if event_id == 1:
                await self._mirror(lambda r: r.expire(key, ttl))
            if self.healthy:
                self.mirrored_id = event_id
                if self.on_mirrored is not None:
                    self.on_mirrored(event_id)
        if self.healthy and await tombstones.atombstoned(self.conversation_id):
            # Its conversation was deleted while this answer was written (conversations/
            # deletion.py): the log goes now instead of staying readable for the TTL.
            ended = (key, question_key(self.question_id), owner_key(self.answer_id))
            await self._mirror(lambda r: r.delete(*ended))
        elif self.healthy:
            if self.linger_s is None:
                await self._mirror(lambda r: r.expire(key, ttl))
            else:
                linger = max(int(self.linger_s), 1)
                for ended in (key, question_key(self.question_id), owner_key(self.answer_id)):
                    await self._mirror(lambda r, k=ended: r.expire(k, linger))
        await conversation_unlock(self.conversation_id, self.answer_id)

    def _degrade(self) -> None:
        if self.healthy:
            logger.info("turn %s: not mirrored to Redis (unavailable); not resumable elsewhere",
                        self.answer_id)  # fmt: skip
        self.healthy = False


async def answer_for_question(
    question_id: UUID, *, conversation_id: UUID | None = None
) -> UUID | None:
    """The answer id being (or just) written for a user turn (of ``conversation_id``), per
    Redis; None if unknown (also when Redis is unavailable: check ``redis_guard.available()``
    to tell the two apart)."""
    value = await redis_guard.acall(
        "turnlog", lambda r: r.get(question_key(question_id)), default=None,
        fallback=MIRROR_FALLBACK, region=redis_region(conversation_id, question_id),
    )  # fmt: skip
    return UUID(value) if value else None


def answer_for_question_sync(question_id: UUID, *, conversation_id: UUID | None = None) -> UUID | None:
    """:func:`answer_for_question` for synchronous code (a page rendered mid-answer)."""
    value = redis_guard.call(
        "turnlog", lambda r: r.get(question_key(question_id)), default=None,
        fallback=MIRROR_FALLBACK, region=redis_region(conversation_id, question_id),
    )  # fmt: skip
    return UUID(_text(value)) if value else None


async def belongs_to(answer_id: UUID, conversation_id: UUID) -> bool:
    """Whether Redis records ``answer_id`` as a turn of ``conversation_id`` (callers have
    already checked that the conversation is the requester's)."""
    value = await redis_guard.acall(
        "turnlog", lambda r: r.get(owner_key(answer_id)), default=None, fallback=MIRROR_FALLBACK,
        region=redis_region(conversation_id, answer_id),
    )  # fmt: skip
    return value == str(conversation_id)


async def exists(answer_id: UUID, *, conversation_id: UUID | None = None) -> bool:
    """Whether Redis holds an event log for ``answer_id`` (False if Redis is unavailable)."""
    found = await redis_guard.acall(
        "turnlog", lambda r: r.exists(stream_key(answer_id)), default=0, fallback=MIRROR_FALLBACK,
        region=redis_region(conversation_id, answer_id),
    )  # fmt: skip
    return bool(found)


async def read_range(
    answer_id: UUID, *, after: int, upto: int, conversation_id: UUID | None = None
) -> list[tuple[int, str, dict]] | None:
    """The events ``after`` < id <= ``upto`` of ``answer_id``'s log, in order, as
    ``(event_id, event, data)``: one XRANGE. For a reader of this process that fell behind the
    in-process window (conversations/turnstream.py). None when Redis is unavailable (counted,
    part ``turnlog``); fewer (or none) when the log expired or was deleted."""
    entries = await redis_guard.acall(
        "turnlog",
        lambda r: r.xrange(stream_key(answer_id), min=f"(0-{after}", max=f"0-{upto}"),
        default=None,
        fallback="a reader behind the in-process window ends (the client may resume)",
        region=redis_region(conversation_id, answer_id),
    )
    if entries is None:
        return None
    return [(int(i.split("-", 1)[1]), f["e"], json.loads(f["d"])) for i, f in entries]
