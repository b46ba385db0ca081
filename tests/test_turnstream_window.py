"""A turn's events in this process's memory are bounded (issue 19 part 5, "Backpressure that
reaches the stream"): conversations/turnstream.py keeps the last ``CHAT_STREAM_MEMORY_EVENTS``
events; readers behind that window read the older ones from the turn's Redis log; while Redis
is down the list is kept whole and counted. Memory is measured in events, not bytes."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prometheus_client import REGISTRY

from conversations import turnstream
from tests.test_writeback import redis_down  # noqa: F401 - the fixture

WINDOW = 8


@pytest.fixture
def window(settings):
    settings.CHAT_STREAM_MEMORY_EVENTS = WINDOW
    return WINDOW


def new_stream() -> turnstream.TurnStream:
    return turnstream.TurnStream(conversation_id=uuid.uuid4(), question_id=uuid.uuid4())


async def publish_tokens(stream: turnstream.TurnStream, first: int, count: int) -> None:
    """Publish ``count`` token events as an engine would: one per delta, the loop turning in
    between (so the Redis mirror keeps up)."""
    for i in range(first, first + count):
        stream.publish("token", {"text": f"t{i} "})
        await asyncio.sleep(0)


async def mirrored(stream: turnstream.TurnStream, event_id: int) -> None:
    async with asyncio.timeout(10):
        while stream.log.mirrored_id < event_id:
            await asyncio.sleep(0.01)


async def finish(stream: turnstream.TurnStream) -> None:
    stream.publish("done", {"status": "complete"})
    stream.close()
    await stream.log.wait_flushed()


async def read_all(events) -> list[tuple[int, str, dict]]:
    return [(e.event_id, e.event, e.data) async for e in events if e is not None]


def expected(last_token: int) -> list[tuple[int, str, dict]]:
    tokens = [(i, "token", {"text": f"t{i} "}) for i in range(1, last_token + 1)]
    return [*tokens, (last_token + 1, "done", {"status": "complete"})]


async def test_memory_held_per_turn_stays_at_the_window(window):
    """However long the answer, the process holds at most the window's events once Redis has
    the rest."""
    stream = new_stream()

    await publish_tokens(stream, 1, 500)
    await mirrored(stream, 500)

    assert len(stream.events) == window
    assert [e.event_id for e in stream.events] == list(range(493, 501))
    await finish(stream)
    assert len(stream.events) == window


async def test_a_slow_reader_behind_the_window_gets_every_event_once_in_order(window):
    """PF-S4 semantics across the window: a reader that stalls after 2 events while 60 more are
    published (the window moved past it) reads the missed ones from Redis, then continues live:
    each event exactly once, in order."""
    stream = new_stream()
    await publish_tokens(stream, 1, 5)
    reader = stream.follow(after=0)
    got = [(e.event_id, e.event, e.data) for e in [await anext(reader), await anext(reader)]]

    await publish_tokens(stream, 6, 60)
    await mirrored(stream, 65)
    assert stream.trimmed > 2  # the reader's next event left memory
    rest = asyncio.ensure_future(read_all(reader))
    await publish_tokens(stream, 66, 20)
    await finish(stream)
    got += await asyncio.wait_for(rest, 10)

    assert got == expected(85)
    assert len(stream.events) <= window


async def test_a_late_resume_from_last_event_id_reads_the_older_events_from_redis(window):
    """A reader that attaches with Last-Event-ID 3 after the window moved to events 43..50 gets
    4..50 and the end, once, in order."""
    stream = new_stream()
    await publish_tokens(stream, 1, 50)
    await mirrored(stream, 50)
    assert stream.trimmed == 42

    resumed = asyncio.ensure_future(read_all(stream.follow(after=3)))
    await finish(stream)

    assert await asyncio.wait_for(resumed, 10) == expected(50)[3:]


async def test_with_redis_down_the_whole_list_is_kept_and_counted(window, redis_down):  # noqa: F811
    """No reader may lose an event: with no Redis log to fall back on, nothing leaves memory,
    and each event held past the window is counted on /metrics; a slow reader still gets
    every event, from memory."""
    before = REGISTRY.get_sample_value("chat_stream_events_unbounded_total") or 0
    stream = new_stream()
    await asyncio.sleep(0.1)  # the mirror meets the dead Redis at its first call
    reader = stream.follow(after=0)

    await publish_tokens(stream, 1, 40)
    await asyncio.sleep(0.1)
    stream.publish("done", {"status": "complete"})
    stream.close()
    got = await asyncio.wait_for(read_all(reader), 10)

    assert not stream.log.healthy
    assert got == expected(40)
    assert len(stream.events) == 41 and stream.trimmed == 0
    counted = REGISTRY.get_sample_value("chat_stream_events_unbounded_total") - before
    assert counted == 41 - window
