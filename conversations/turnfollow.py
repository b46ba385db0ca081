"""Follow an answer written by another server process, live, from its Redis event log
(conversations/turnlog.py): :func:`follow` yields the backlog (one XRANGE), then the new events
from this process's hub (:class:`_FollowHub`: one blocking XREAD per event loop and Redis
server for every answer followed, fanned out to the readers' queues).

conversations/turnstream.py ``follow_remote`` reads an answer generated elsewhere with it.
Redis down (part ``turnlog``, core/redis_guard.py): a followed stream ends (the client may
resume), and the hub retries every second. The hub exists once per Redis server
(core/regions.py ``redis_region``).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from uuid import UUID

from conversations.events import TERMINAL_EVENTS
from conversations.presence import writing
from conversations.turnlog import exists, stream_key
from core import redis_guard
from core.redis_guard import REDIS_ERRORS
from core.regions import redis_region

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
