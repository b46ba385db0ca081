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
- **the generating lock** (part ``lock``): :func:`conversation_lock` fails open, and the
  process-local check (locks.ensure_idle) still serialises turns within a process; a lock
  this process could not release is released the next time it locks that conversation (and
  expires after ``BUSY_TTL_S`` anyway);
- **cancel** (part ``cancel``): a cancel cannot reach another process; the listener keeps
  reconnecting (every second, without a network call while the breaker is open) and picks up
  cancels again once Redis is back.

New turns mirror again as soon as Redis answers: recovery needs no restart.

**Regions** (issue 20): every key lives on the Redis server of its conversation's region
(``settings.CHAT_REGION_REDIS_URLS``, core/redis_guard.py), found from the ids with no lookup
(conversations/regions.py ``redis_region``: the conversation id, else the answer id, both minted
with the region's tag). Functions that take only an answer id accept its ``conversation_id``
too and should be given it; the cancel channel and the follow hub exist once per server.

Deleting a conversation (conversations/deletion.py) publishes the cancel of its generating
answer from synchronous code (:func:`cancel_publish`), drops its turns' keys
(:func:`turn_logs_drop`), and a writer whose conversation was deleted meanwhile deletes its log
when the answer ends instead of keeping it (conversations/tombstones.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from uuid import UUID

from django.conf import settings

from conversations import tombstones
from conversations.events import TERMINAL_EVENTS
from conversations.regions import redis_region
from core import redis_guard
from core.redis_guard import REDIS_ERRORS

logger = logging.getLogger(__name__)


_MIRROR_FALLBACK = "answers stream from this process only and cannot be resumed elsewhere"
_LOCK_FALLBACK = "the one-answer-per-conversation check is process-local"
_CANCEL_FALLBACK = "cancels cannot reach other processes"
_FAILED = object()


def stream_key(answer_id: UUID | str) -> str:
    return f"chat:turn:{answer_id}"


def question_key(question_id: UUID | str) -> str:
    return f"chat:q:{question_id}"


def owner_key(answer_id: UUID | str) -> str:
    return f"chat:a:{answer_id}:conversation"


def reader_key(answer_id: UUID | str) -> str:
    return f"chat:a:{answer_id}:remote-reader"


# A reader in another process marks its presence for this long and renews the mark every third
# of it, so the writing process does not abort an answer that is read elsewhere (turnstream's
# disconnect rule); the mark of a reader that left lapses within this many seconds.
READER_TTL_S = 6


def busy_key(conversation_id: UUID | str) -> str:
    return f"chat:conv:{conversation_id}:generating"


CANCEL_CHANNEL = "chat:cancel"
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


async def cancel_elsewhere(
    answer_id: UUID, wait_s: float = 5, *, conversation_id: UUID | None = None
) -> None:
    """Ask whichever process generates ``answer_id`` (of ``conversation_id``) to stop it
    (pub/sub on the region's server), and wait (bounded) until its event log records the end.
    Returns at once if Redis is unavailable (logged)."""
    region = redis_region(conversation_id, answer_id)
    published = await redis_guard.acall(
        "cancel",
        lambda r: r.publish(CANCEL_CHANNEL, str(answer_id)),
        default=None,
        fallback=_CANCEL_FALLBACK,
        region=region,
    )
    if published is None:
        return
    deadline = asyncio.get_running_loop().time() + wait_s
    while asyncio.get_running_loop().time() < deadline:
        last = await redis_guard.acall(
            "cancel", lambda r: r.xrevrange(stream_key(answer_id), count=1), default=None,
            region=region,
        )  # fmt: skip
        if last is None:
            return
        if last and last[0][1].get("e") in TERMINAL_EVENTS:
            return
        await asyncio.sleep(0.05)


def cancel_publish(conversation_ids: Iterable[UUID]) -> list[UUID]:
    """Ask whichever process generates an answer in one of ``conversation_ids`` to stop it, from
    synchronous code (Celery tasks, the retention purge, account deletion): the answer holding
    each conversation's generating lock (:func:`conversation_lock`) is published on
    ``CANCEL_CHANNEL``, which every generating process listens to (:func:`ensure_cancel_listener`).
    Does not wait for the answer to end (:func:`cancel_elsewhere` is the async way that waits).
    Returns the answer ids published; ``[]`` when none holds a lock or Redis is unavailable
    (logged and counted, part ``cancel``: the cancel cannot reach another process then)."""
    by_region: dict[str | None, list[str]] = {}
    for c in conversation_ids:
        by_region.setdefault(redis_region(c), []).append(busy_key(c))

    def run(client, keys) -> list[UUID]:
        holders = [UUID(_text(h)) for h in client.mget(keys) if h]
        if holders:
            with client.pipeline(transaction=False) as pipe:
                for answer_id in holders:
                    pipe.publish(CANCEL_CHANNEL, str(answer_id))
                pipe.execute()
        return holders

    return [
        answer_id
        for region, keys in by_region.items()
        for answer_id in redis_guard.call(
            "cancel",
            lambda client, k=keys: run(client, k),
            default=[],
            fallback=_CANCEL_FALLBACK,
            region=region,
        )
    ]


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


_listeners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ensure_cancel_listener(on_cancel) -> None:
    """Start (once per event loop and Redis server: core/redis_guard.py
    ``regions_with_servers``) a task that calls ``on_cancel(answer_id)`` for every cancel
    another process publishes."""
    loop = asyncio.get_running_loop()
    tasks = _listeners.setdefault(loop, {})
    for region in redis_guard.regions_with_servers():
        task = tasks.get(region)
        if task is None or task.done():
            tasks[region] = loop.create_task(
                _listen(on_cancel, region), name=f"chat-cancel-listener-{region or 'global'}"
            )


async def _listen(on_cancel, region: str | None) -> None:
    # Its own client: a subscribed connection waits for messages indefinitely (no read
    # timeout), and must not hold one of the shared pool's connections.
    client = redis_guard.async_client_for_blocking(None, region=region)
    while True:
        if not redis_guard.allow("cancel", region=region):
            await asyncio.sleep(1)
            continue
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(CANCEL_CHANNEL)
            redis_guard.succeeded(region=region)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    try:
                        on_cancel(UUID(message["data"]))
                    except ValueError:
                        logger.warning("ignored a malformed cancel: %r", message["data"])
        except REDIS_ERRORS as exc:
            redis_guard.failed(
                "cancel", exc, "cancel listener reconnects every second", region=region
            )
            await asyncio.sleep(1)
        finally:
            # Bounded: on cancellation (loop shutdown) closing must not wait on the read
            # the cancelled listen() was in.
            with contextlib.suppress(*REDIS_ERRORS, TimeoutError):
                await asyncio.wait_for(pubsub.aclose(), 1)


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
            "turnlog", fn, default=_FAILED, fallback=_MIRROR_FALLBACK, region=self.region
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
        fallback=_MIRROR_FALLBACK, region=redis_region(conversation_id, question_id),
    )  # fmt: skip
    return UUID(value) if value else None


def answer_for_question_sync(question_id: UUID, *, conversation_id: UUID | None = None) -> UUID | None:
    """:func:`answer_for_question` for synchronous code (a page rendered mid-answer)."""
    value = redis_guard.call(
        "turnlog", lambda r: r.get(question_key(question_id)), default=None,
        fallback=_MIRROR_FALLBACK, region=redis_region(conversation_id, question_id),
    )  # fmt: skip
    return UUID(_text(value)) if value else None


async def belongs_to(answer_id: UUID, conversation_id: UUID) -> bool:
    """Whether Redis records ``answer_id`` as a turn of ``conversation_id`` (callers have
    already checked that the conversation is the requester's)."""
    value = await redis_guard.acall(
        "turnlog", lambda r: r.get(owner_key(answer_id)), default=None, fallback=_MIRROR_FALLBACK,
        region=redis_region(conversation_id, answer_id),
    )  # fmt: skip
    return value == str(conversation_id)


async def exists(answer_id: UUID, *, conversation_id: UUID | None = None) -> bool:
    """Whether Redis holds an event log for ``answer_id`` (False if Redis is unavailable)."""
    found = await redis_guard.acall(
        "turnlog", lambda r: r.exists(stream_key(answer_id)), default=0, fallback=_MIRROR_FALLBACK,
        region=redis_region(conversation_id, answer_id),
    )  # fmt: skip
    return bool(found)


async def reader_present(answer_id: UUID, *, conversation_id: UUID | None = None) -> bool:
    """Whether a reader in some process follows ``answer_id`` from Redis now (its mark is set:
    :func:`reading`). False if Redis is unavailable."""
    found = await redis_guard.acall(
        "turnlog", lambda r: r.exists(reader_key(answer_id)), default=0, fallback=_MIRROR_FALLBACK,
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
                default=None, fallback=_MIRROR_FALLBACK, region=region,
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
            fallback=_MIRROR_FALLBACK,
            region=redis_region(conversation_id, answer_id),
        )
    )


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


BLOCK_S = 0.5  # the hub's XREAD waits at most this long, so new subscriptions join quickly


class _FollowHub:
    """One blocking XREAD per process for every turn followed from Redis, fanned out to the
    readers' queues. A blocking read holds its connection for the whole wait, so one XREAD per
    reader would need a Redis connection per open stream (redis-py's pool stops at 100)."""

    def __init__(self, region: str | None = None) -> None:
        self.region = region  # the hub reads one server: its region's
        self.subscribers: dict[str, set[asyncio.Queue]] = {}
        self.positions: dict[str, str] = {}
        self.wakeup = asyncio.Event()
        # Its own client: the socket timeout must outlast the blocking read.
        self.client = redis_guard.async_client_for_blocking(BLOCK_S + 5, region=region)
        self.task = asyncio.get_running_loop().create_task(self._run(), name="chat-turnlog-hub")

    def subscribe(self, key: str, queue: asyncio.Queue, after: int) -> None:
        self.subscribers.setdefault(key, set()).add(queue)
        self.positions.setdefault(key, f"0-{after}")
        self.wakeup.set()

    def unsubscribe(self, key: str, queue: asyncio.Queue) -> None:
        queues = self.subscribers.get(key)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self.subscribers[key]
                self.positions.pop(key, None)

    async def _run(self) -> None:
        me = asyncio.current_task()
        while True:
            if me is not None and me.cancelling():
                # A cancellation that lands inside redis-py's blocking read can come back as a
                # connection error or an empty reply; never loop on past it (a loop that is
                # shutting down would wait for this task forever).
                raise asyncio.CancelledError
            if not self.positions:
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            if not redis_guard.allow("turnlog", region=self.region):
                await asyncio.sleep(1)
                continue
            try:
                reply = await self.client.xread(
                    dict(self.positions), block=int(BLOCK_S * 1000), count=500
                )
            except REDIS_ERRORS as exc:
                redis_guard.failed(
                    "turnlog",
                    exc,
                    "resumed streams wait; retrying every second",
                    region=self.region,
                )
                await asyncio.sleep(1)
                continue
            redis_guard.succeeded(region=self.region)
            for key, entries in reply or []:
                for entry_id, fields in entries:
                    if key not in self.positions:
                        break
                    self.positions[key] = entry_id
                    item = (int(entry_id.split("-", 1)[1]), fields["e"], json.loads(fields["d"]))
                    for queue in self.subscribers.get(key, ()):
                        queue.put_nowait(item)


_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hub(region: str | None = None) -> _FollowHub:
    """This event loop's hub for the Redis server of ``region`` (one per loop and server)."""
    loop = asyncio.get_running_loop()
    hubs = _hubs.setdefault(loop, {})
    url = redis_guard.url_for(region)
    hub = hubs.get(url)
    if hub is None or hub.task.done():
        hub = hubs[url] = _FollowHub(region)
    return hub


async def follow(
    answer_id: UUID, after: int = 0, idle_s: float = 15, *, conversation_id: UUID | None = None
) -> AsyncIterator[tuple[int, str, dict] | None]:
    """Yield ``(event_id, event, data)`` after ``after`` from Redis, live, until a terminal
    event (conversations/events.py ``TERMINAL_EVENTS``: ``done``, ``moderation``, ``error``);
    None after ``idle_s`` seconds without one (send a keep-alive). Ends if the log
    vanishes (expired, or never written within 10 s) or Redis fails mid-way.

    The backlog comes from one XRANGE; live events from the process's hub (one XREAD for all
    readers). Subscribing before reading the backlog, and skipping ids already yielded, makes
    every event arrive exactly once and in order.
    """
    key = stream_key(answer_id)
    region = redis_region(conversation_id, answer_id)
    hub = _hub(region)
    queue: asyncio.Queue = asyncio.Queue()
    hub.subscribe(key, queue, after)
    loop = asyncio.get_running_loop()
    patience_until = loop.time() + 10  # the writer may not have written event 1 yet
    try:
        last = after
        backlog = await redis_guard.acall(
            "turnlog", lambda r: r.xrange(key, min=f"(0-{after}", max="+"), default=None,
            fallback="a resumed stream ends (the client may retry)", region=region,
        )  # fmt: skip
        if backlog is None:
            return
        for entry_id, fields in backlog:
            last = int(entry_id.split("-", 1)[1])
            yield last, fields["e"], json.loads(fields["d"])
            if fields["e"] in TERMINAL_EVENTS:
                return
        while True:
            try:
                event_id, event, data = await asyncio.wait_for(queue.get(), idle_s)
            except TimeoutError:
                if (
                    loop.time() > patience_until
                    and not await exists(answer_id, conversation_id=conversation_id)
                    and not await writing(answer_id, conversation_id=conversation_id)
                ):
                    return
                yield None
                continue
            if event_id <= last:
                continue
            last = event_id
            yield event_id, event, data
            if event in TERMINAL_EVENTS:
                return
    finally:
        hub.unsubscribe(key, queue)
