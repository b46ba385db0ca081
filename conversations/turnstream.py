"""Generation runs as its own task per turn; HTTP responses only read its events.

DESIGN.md's disconnect rule needs the generating task to outlive any one HTTP response, so each
answer is a :class:`TurnStream`: a task that drives the engine (conversations/generate.py) and
appends numbered events (conversations/events.py) to a list, and any number of readers that
replay the list from a given event id and then follow it live, here or (through its Redis mirror,
conversations/turnlog.py) in another server process, resuming with ``Last-Event-ID``.

**Memory per turn is bounded.** The process keeps the last ``settings.CHAT_STREAM_MEMORY_EVENTS``
events of a turn (its window); an event leaves the window only once the Redis mirror holds it. A
reader further behind (a stalled client whose socket buffer is full, a resume from an early
Last-Event-ID) reads the older events from the turn's Redis log (turnlog ``read_range``), one
window at a time, and then continues from memory: every event once, in order (PF-S4). While
Redis is down (the mirror failed for this turn) nothing could serve dropped events, so the list
is kept whole and each event held past the window is counted
(``chat_stream_events_unbounded_total``, core/metrics.py).

Readers are counted. When the last one leaves before the answer is finished, the generation is
aborted after ``settings.CHAT_STREAM_DISCONNECT_GRACE_S`` seconds (0: at once) unless a reader
comes back; a generation nobody attaches to within ``CHAT_STREAM_ATTACH_TIMEOUT_S`` is aborted
too. A reader in another process (following the Redis log) counts: its mark in Redis
(conversations/presence.py ``reading``) keeps the answer going. An explicit stop aborts at once.

The registry of this process's streams (by question, answer and conversation) lives here too,
and :func:`answer_sse` is the one answer to "where is this answer now" (live here, live in
another process, stored, or unknowable while Redis is down).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.conf import settings

from core import metrics
from conversations import answer_lock, cancels, presence, turnfollow, turnlog
from conversations.events import stored_answer_sse
from conversations.models import Turn
from core import redis_guard
from core.regions import redis_region
from core.sse import sse_comment, sse_event

if TYPE_CHECKING:
    from conversations.turnplan import TurnPlan
    from moderation.verdicts import Verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    """One SSE event of a turn stream; ``event_id`` counts from 1 within the stream."""

    event_id: int
    event: str
    data: dict[str, Any]


@dataclass
class TurnStream:
    """The in-flight answer to one user turn."""

    conversation_id: UUID
    question_id: UUID
    answer_id: UUID = field(default_factory=uuid.uuid4)
    # Zero-retention conversation (conversations/retention.py): short-lived Redis copies only.
    zero_retention: bool = False
    # The answer this one regenerates (conversations/versions.py), and how many earlier
    # exchanges its prompt left out or took from the summary (Turn.context_trimmed).
    replaces_id: UUID | None = None
    context_trimmed: int = 0
    # Continue (conversations/submit.py answer_continue): the cut-off answer this one continues
    # and its text, which the engine continues from and the stored answer starts with.
    continues_id: UUID | None = None
    prefix: str = ""
    # How this answer was admitted (pool, caller, prompt, rate-limit reservation):
    # conversations/turnplan.py TurnPlan.
    plan: TurnPlan | None = None
    # Set by the output gate when it flags the answer (moderation/gate.py): the generation is
    # aborted and the answer stored as blocked, without its text.
    blocked_verdict: Verdict | None = None
    # The window: the newest events, oldest first (module docstring); ``trimmed`` older ones
    # left it (they are in Redis).
    events: deque[StreamEvent] = field(default_factory=deque)
    trimmed: int = 0
    finished: bool = False
    status: str | None = None
    task: asyncio.Task | None = None
    readers: int = 0
    stop_requested: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _abandon_handle: asyncio.TimerHandle | None = None
    _abandon_check: asyncio.Task | None = None
    log: turnlog.TurnLogWriter | None = None

    def __post_init__(self) -> None:
        # Mirror to Redis so another process can resume this stream (conversations/turnlog.py).
        zdr = (
            (settings.CHAT_ZDR_TTL_S, settings.CHAT_ZDR_STREAM_LINGER_S)
            if self.zero_retention
            else ()
        )
        self.log = turnlog.TurnLogWriter(
            self.answer_id, self.question_id, self.conversation_id, *zdr, on_mirrored=self._trim
        )

    @property
    def last_id(self) -> int:
        """The id of the newest event (0 before the first)."""
        return self.trimmed + len(self.events)

    def publish(self, event: str, data: dict[str, Any]) -> None:
        """Append an event, wake every reader, and queue it for the Redis mirror."""
        event_id = self.last_id + 1
        self.events.append(StreamEvent(event_id, event, data))
        self.log.append(event_id, event, data)
        if not self.log.healthy and len(self.events) > _window():
            metrics.STREAM_EVENTS_UNBOUNDED.inc()  # kept whole: Redis cannot serve it
        self._trim()
        self._changed.set()
        self._changed = asyncio.Event()

    def _trim(self, _mirrored_id: int = 0) -> None:
        """Drop the oldest events past the window that Redis holds (never while the mirror is
        broken: nothing else could serve them)."""
        if not self.log.healthy:
            return
        window, mirrored = _window(), self.log.mirrored_id
        while len(self.events) > window and self.events[0].event_id <= mirrored:
            self.events.popleft()
            self.trimmed += 1

    def close(self) -> None:
        """Mark the stream finished: readers drain what is left and end."""
        self.log.close()
        self.finished = True
        self._changed.set()
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()

    async def follow(
        self, after: int = 0, idle_s: float | None = None
    ) -> AsyncIterator[StreamEvent | None]:
        """Yield events with id > ``after``, then live ones, until the stream is finished.

        If ``idle_s`` seconds pass without a new event, yields None (the caller sends a
        keep-alive). Counts as a reader while iterating; when the last reader goes before the
        answer is finished, the disconnect rule (module docstring) decides when to abort.
        """
        self._attach()
        try:
            last = max(after, 0)
            while True:
                changed = self._changed
                if last < self.trimmed:  # behind the window: the older events are in Redis
                    older = await self._read_behind(last)
                    if older is None:
                        return
                    for item in older:
                        yield item
                        last = item.event_id
                    continue
                while self.trimmed <= last < self.last_id:
                    # Indexed afresh each time: the window may move while a reader waits.
                    yield self.events[last - self.trimmed]
                    last += 1
                if last < self.trimmed:
                    continue
                if self.finished:
                    return
                try:
                    await asyncio.wait_for(changed.wait(), idle_s)
                except TimeoutError:
                    yield None
        finally:
            self._detach()

    async def _read_behind(self, last: int) -> list[StreamEvent] | None:
        """The events after ``last`` that left the window, at most one window's worth, from
        the turn's Redis log; None (the reader ends, logged) if Redis cannot give them
        contiguously: skipping one would break exactly-once (the client may resume)."""
        upto = min(self.trimmed, last + _window())
        older = await turnlog.read_range(
            self.answer_id, after=last, upto=upto, conversation_id=self.conversation_id
        )
        ids = [event_id for event_id, _, _ in older or ()]
        if ids != list(range(last + 1, upto + 1)):
            logger.warning("turn %s: events %d..%d left memory and Redis cannot give them; "
                           "the reader ends", self.answer_id, last + 1, upto)  # fmt: skip
            return None
        return [StreamEvent(*item) for item in older]

    def _attach(self) -> None:
        self.readers += 1
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()
            self._abandon_handle = None

    def _detach(self) -> None:
        self.readers -= 1
        if self.readers == 0 and not self.finished:
            self._schedule_abandon(settings.CHAT_STREAM_DISCONNECT_GRACE_S)

    def _schedule_abandon(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()
        if delay_s <= 0:
            self._abandon_handle = None
            self._abandon()
        else:
            self._abandon_handle = loop.call_later(delay_s, self._abandon)

    def _abandon(self) -> None:
        if self.readers == 0 and not self.finished:
            self._abandon_check = asyncio.get_running_loop().create_task(
                self._abandon_unless_read_elsewhere()
            )

    async def _abandon_unless_read_elsewhere(self) -> None:
        """No reader here: abort, unless a reader in another process follows the answer from
        Redis (a gateway behind a load balancer may serve the events request); then look again
        when its mark would have lapsed."""
        followed = await presence.reader_present(
            self.answer_id, conversation_id=self.conversation_id
        )
        if self.readers or self.finished:
            return
        if followed:
            self._schedule_abandon(presence.READER_TTL_S)
            return
        logger.info("no reader for turn %s: aborting generation", self.answer_id)
        self.stop()

    def stop(self) -> None:
        """Abort the generation now (explicit stop, or abandoned). A no-op once finished or
        already stopping."""
        if self.stop_requested:
            return
        self.stop_requested = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def wait(self) -> None:
        """Wait until the answer is stored and the stream closed."""
        if self.task is not None:
            await asyncio.shield(self.task)


def _window() -> int:
    """Events of one turn kept in memory: ``settings.CHAT_STREAM_MEMORY_EVENTS`` (at least 1)."""
    return max(1, settings.CHAT_STREAM_MEMORY_EVENTS)


async def follow_sse(stream: TurnStream, after: int = 0) -> AsyncIterator[bytes]:
    """A turn stream as SSE bytes: a comment at once (the response starts before the first
    token), every event with its ``id:``, and a keep-alive comment after
    ``settings.CHAT_SSE_KEEPALIVE_S`` seconds without one."""
    yield sse_comment("stream")
    # aclosing: when the client goes, the reader detaches now, not whenever GC finalises it.
    async with aclosing(stream.follow(after=after, idle_s=settings.CHAT_SSE_KEEPALIVE_S)) as events:
        async for event in events:
            if event is None:
                yield sse_comment("keep-alive")
            else:
                yield sse_event(event.event, event.data, event.event_id)


async def follow_remote_sse(
    answer_id: UUID, after: int = 0, *, conversation_id: UUID | None = None
) -> AsyncIterator[bytes]:
    """Like :func:`follow_sse`, for a turn (of ``conversation_id``: its region's Redis)
    generated by another process: read from its Redis event log (conversations/turnlog.py), live
    (conversations/turnfollow.py)."""
    yield sse_comment("stream")
    async with (
        presence.reading(answer_id, conversation_id=conversation_id),
        aclosing(
            turnfollow.follow(
                answer_id,
                after=after,
                idle_s=settings.CHAT_SSE_KEEPALIVE_S,
                conversation_id=conversation_id,
            )
        ) as events,
    ):
        async for item in events:
            if item is None:
                yield sse_comment("keep-alive")
            else:
                event_id, event, data = item
                yield sse_event(event, data, event_id)


_streams: dict[UUID, TurnStream] = {}  # question (user turn) id -> stream
_by_answer: dict[UUID, TurnStream] = {}  # answer (assistant turn) id -> stream
_busy: dict[UUID, TurnStream] = {}  # conversation id -> its in-flight stream


def stream_for_question(question_id: UUID) -> TurnStream | None:
    """The in-flight (or just finished, still held) stream answering ``question_id``."""
    return _streams.get(question_id)


def stream_for_answer(answer_id: UUID) -> TurnStream | None:
    """The stream writing assistant turn ``answer_id``, while it is held."""
    return _by_answer.get(answer_id)


def stream_for_conversation(conversation_id: UUID) -> TurnStream | None:
    """The conversation's unfinished stream, if one is generating."""
    stream = _busy.get(conversation_id)
    return stream if stream is not None and not stream.finished else None


def stream_register(stream: TurnStream) -> None:
    """Hold ``stream`` in the registry (by question, answer and conversation) while it runs."""
    _streams[stream.question_id] = stream
    _by_answer[stream.answer_id] = stream
    _busy[stream.conversation_id] = stream


def stream_release(stream: TurnStream) -> None:
    """The conversation is free again (its answer is stored); the finished stream stays
    findable by question and answer for ``settings.CHAT_STREAM_RETAIN_S`` seconds, so a reader
    that connects late still gets the end."""
    if _busy.get(stream.conversation_id) is stream:
        del _busy[stream.conversation_id]
    loop = asyncio.get_running_loop()
    loop.call_later(settings.CHAT_STREAM_RETAIN_S, _streams.pop, stream.question_id, None)
    loop.call_later(settings.CHAT_STREAM_RETAIN_S, _by_answer.pop, stream.answer_id, None)


async def stop_anywhere(*, conversation_id: UUID, answer_id: UUID | None = None) -> None:
    """Stop the conversation's generating answer (``answer_id`` if given), whichever server
    process runs it, and return once it is stored as cancelled (bounded wait)."""
    stream = stream_for_answer(answer_id) if answer_id else stream_for_conversation(conversation_id)
    if stream is not None and stream.conversation_id == conversation_id:
        stream.stop()
        await stream.wait()
        return
    holder = await answer_lock.conversation_holder(conversation_id)
    if holder is not None and (answer_id is None or holder == answer_id):
        await cancels.cancel_elsewhere(holder, conversation_id=conversation_id)


def _stop_local(answer_id: UUID) -> None:
    stream = stream_for_answer(answer_id)
    if stream is not None:
        stream.stop()


class LiveStateUnavailable(Exception):
    """Redis is unavailable and the answer is not stored: it may be generating in another server
    process, whose events only Redis carries, so nobody here can tell (core/redis_guard.py)."""


async def answer_sse(
    *,
    conversation_id: UUID,
    answer_id: UUID | None,
    stored: Callable[[], Awaitable[Turn | None]],
    after: int = 0,
    stored_first: bool = False,
) -> AsyncIterator[bytes] | None:
    """The SSE body of answer ``answer_id`` of conversation ``conversation_id`` wherever it is
    now: generating in this process (:func:`follow_sse`), in another one (its Redis event log,
    :func:`follow_remote_sse`), or stored or held (``stored()``: the answer, or None;
    conversations/events.py ``stored_answer_sse``: its terminal event only).
    ``after``: the client's Last-Event-ID; while the event log lasts
    (``settings.CHAT_STREAM_TTL_S`` after the end) it is replayed from there, exactly once and in
    order (PF-S4); ``stored_first``: a stored answer is sent as its terminal event even while its
    log lasts (the page, which renders the whole answer from it). Returns None when nothing
    knows of the answer (``answer_id`` None: look only at ``stored``). Raises LiveStateUnavailable when Redis is down and it is not stored."""
    if stored_first and (answer := await stored()) is not None:
        return stored_answer_sse(answer)
    if answer_id is not None:
        stream = stream_for_answer(answer_id)
        if stream is not None and stream.conversation_id == conversation_id:
            return follow_sse(stream, after=after)
        if await turnlog.belongs_to(answer_id, conversation_id) and (
            await turnlog.exists(answer_id, conversation_id=conversation_id)
            or await presence.writing(answer_id, conversation_id=conversation_id)
        ):  # a log, or a writer whose answer still waits for an engine slot (no event yet)
            return follow_remote_sse(answer_id, after=after, conversation_id=conversation_id)
    if not stored_first and (answer := await stored()) is not None:
        return stored_answer_sse(answer)
    if not redis_guard.available(region=redis_region(conversation_id)):
        raise LiveStateUnavailable
    return None
