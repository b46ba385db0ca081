"""Durable write-back (conversations/writeback.py) in the test process: real PostgreSQL and
Redis, the scripted engine, Celery tasks eager unless a test turns that off (then a queued task
stays in the real Redis broker until the test runs it). The worker-kill cases (PF-J1) are in
tests/integration/test_writeback_worker.py."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import time
import uuid

import psycopg
import pytest
import redis
import redis.asyncio
from asgiref.sync import sync_to_async
from celery.signals import task_prerun
from django.conf import settings
from django.db import connection, transaction
from prometheus_client import REGISTRY

from core import redis_guard
from chatsite.celery import app
from conversations import deletion, held, selectors, services, writeback
from conversations.models import Conversation, Turn
from tests.processes import database_url
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import parse_sse, read_stream

pytestmark = pytest.mark.django_db(transaction=True)

BROKER_QUEUE = "celery"  # kombu's Redis transport keeps the default queue in this list


@functools.cache
def plain_redis() -> redis.Redis:
    """A client of the test Redis of its own (strings decoded), for looking at what is there."""
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)


@contextlib.contextmanager
def tasks_recorded():
    """Names of the Celery tasks that start (eagerly or not) while the block runs."""
    started: list[str] = []

    def on_prerun(sender=None, **kwargs):
        started.append(sender.name)

    task_prerun.connect(on_prerun, weak=False)
    try:
        yield started
    finally:
        task_prerun.disconnect(on_prerun)


@contextlib.contextmanager
def tasks_queued_not_run():
    """Tasks go to the real broker (Redis) and no worker takes them; the queue is emptied after."""
    app.conf.task_always_eager = False
    try:
        yield
    finally:
        app.conf.task_always_eager = True
        plain_redis().delete(BROKER_QUEUE)


@contextlib.contextmanager
def conversation_row_locked(conversation_id):
    """Hold the conversation's row lock in another session until the block ends (how tests
    stop a write-back mid-write: it locks the same row; no hooks in product code)."""
    with psycopg.connect(database_url()) as locker:
        locker.execute(
            f"SELECT 1 FROM {Conversation._meta.db_table} WHERE conversation_id = %s FOR UPDATE",
            [conversation_id],
        )
        yield
        locker.rollback()


def sessions_waiting_on_a_lock() -> int:
    """Sessions of the test database waiting for a row lock (a SELECT ... FOR UPDATE)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE %s",
            ["%FOR UPDATE%"],
        )
        return cursor.fetchone()[0]


def broker_messages() -> list[dict]:
    return [json.loads(raw) for raw in plain_redis().lrange(BROKER_QUEUE, 0, -1)]


async def one_turn(client, conversation_id: str, content: str = "hi") -> list:
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": content})
    assert response.status_code == 200, response.content
    return parse_sse(await read_stream(response))


def a_held_answer(conversation: Conversation, question: Turn, text: str = "held text") -> dict:
    record = held.answer_record(
        conversation_id=conversation.conversation_id, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=text, status="complete", prompt_tokens=7, completion_tokens=2,
    )  # fmt: skip
    held.hold(record, ttl_s=600, due=True)
    return record


# --- the path of a finished answer --------------------------------------------------------------


async def test_a_finished_answer_is_written_by_the_write_back_task(make_user, engine_double):
    """Given tasks run eagerly (as in every test process), when a turn's stream ends, then the
    answer was written by conversations.turn_write_back (the same code a worker runs) and its
    Redis record is gone."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    with tasks_recorded() as started:
        events = await one_turn(client, conversation_id)
    name, done, _ = events[-1]
    assert name == "done"
    assert started == ["conversations.turn_write_back"]
    assert (await Turn.objects.aget(turn_id=done["turn_id"])).content == "Hello, world."
    assert plain_redis().get(held.record_key(done["turn_id"])) is None


async def test_the_answer_is_held_in_redis_before_done_and_only_its_id_is_queued(make_user, engine_double):
    """Given no worker takes tasks, when the stream sends ``done``, then the whole answer is
    already held in Redis, PostgreSQL does not have it yet, and the broker message carries the
    turn id, not the text."""
    engine_double.scripts = [["secret ", "answer"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    with tasks_queued_not_run():
        events = await one_turn(client, conversation_id)
        turn_id = events[-1][1]["turn_id"]
        record = held.record_get(turn_id)
        messages = broker_messages()
    assert record["content"] == "secret answer" and record["status"] == "complete"
    assert not await Turn.objects.filter(turn_id=turn_id).aexists()
    assert [m["headers"]["task"] for m in messages] == ["conversations.turn_write_back"]
    assert "secret" not in json.dumps(messages)


async def test_reads_see_an_answer_that_is_not_written_yet(make_user, engine_double):
    """Given an answer held in Redis whose write-back has not run, when the history is read
    (GET /v1/conversations/{id}) and the next turn is asked, then both include the answer."""
    engine_double.scripts = [["Paris", "."], ["Yes", "."]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    with tasks_queued_not_run():
        await one_turn(client, conversation_id, "capital of france")
        page = (await client.get(f"/v1/conversations/{conversation_id}")).json()
        await one_turn(client, conversation_id, "are you sure")
    assert [(t["role"], t["content"]) for t in page["turns"]] == [
        ("user", "capital of france"), ("assistant", "Paris."),
    ]  # fmt: skip
    first_prompt, second_prompt = engine_double.requests[0][0], engine_double.requests[1][0]
    # The scripted engine encodes 3 ids per message plus one per word: history = 2 messages.
    assert len(second_prompt) == len(first_prompt) + (3 + 1) + (3 + 3)


async def test_the_write_back_task_run_twice_writes_one_row(make_user, engine_double):
    """PF-J1 (idempotency half): a held answer whose task is delivered twice is stored once."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    with tasks_queued_not_run():
        turn_id = (await one_turn(client, conversation_id))[-1][1]["turn_id"]
        record = held.record_get(turn_id)
    await sync_to_async(writeback.turn_write_back.apply)(args=[turn_id])
    await sync_to_async(held.hold)(record, ttl_s=600, due=True)  # as if released too late
    await sync_to_async(writeback.turn_write_back.apply)(args=[turn_id])
    assert await Turn.objects.filter(turn_id=turn_id).acount() == 1
    assert held.record_get(turn_id) is None


def test_two_deliveries_running_at_once_write_one_row(make_user):
    """PF-J1 (a redelivery while the first run is still waiting): given two runs of one
    write-back both blocked on the conversation's lock, when it is released, then both succeed
    and the turn is stored once."""
    conversation = services.conversation_create(owner=make_user())
    record = a_held_answer(conversation, services.turn_append_user(conversation=conversation, content="q"))
    outcomes: list = []

    def deliver():
        try:
            outcomes.append(writeback.answer_write_back(turn_id=uuid.UUID(record["turn_id"])))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            outcomes.append(exc)
        finally:
            connection.close()

    runs = [threading.Thread(target=deliver) for _ in range(2)]
    with conversation_row_locked(conversation.pk):
        for run in runs:
            run.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_on_a_lock() < 2:
            assert time.monotonic() < deadline, "both runs should wait on the lock"
            time.sleep(0.05)
    for run in runs:
        run.join(30)
    assert [type(o) for o in outcomes] == [Turn, Turn], outcomes
    assert Turn.objects.filter(turn_id=record["turn_id"]).count() == 1


def test_a_held_record_carries_every_field_of_its_turn():
    """The record is derived from Turn's fields (conversations/turndata.py): every field comes
    back as it went in, and a record held before a field existed still reads (its default)."""
    from datetime import UTC, datetime  # noqa: PLC0415
    from decimal import Decimal  # noqa: PLC0415

    turn = Turn(
        conversation_id=uuid.uuid4(), role=Turn.Role.ASSISTANT, content="answer", token_count=9,
        prompt_tokens=40, status=Turn.Status.CANCELLED, moderation_verdict={"flagged": False},
        reply_to_id=uuid.uuid4(), replaces_id=uuid.uuid4(), context_trimmed=2, pool="mini",
        model_version="v1", cached_tokens=16, cost_usd=Decimal("0.00001234"),
        training_eligible=False, created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    )  # fmt: skip
    fields = [f.attname for f in Turn._meta.concrete_fields]

    record = json.loads(json.dumps(held.turn_record(turn, zero_retention=True)))
    back = held.record_turn(record)
    older = {k: v for k, v in record.items() if k not in ("training_eligible", "cached_tokens")}

    assert record["zero_retention"] is True
    assert [getattr(back, name) for name in fields] == [getattr(turn, name) for name in fields]
    old = held.record_turn(older)
    assert (old.training_eligible, old.cached_tokens, old.content) == (True, None, "answer")


def test_a_late_write_keeps_the_turns_place(make_user):
    """Given an answer held at time T and a next user turn appended after T, when the
    write-back lands later, then the answer is stored with created_at T, before the next turn."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="q1")
    record = a_held_answer(conversation, question)
    services.turn_append_user(conversation=conversation, content="q2")
    writeback.answer_write_back(turn_id=uuid.UUID(record["turn_id"]))
    contents = [t.content for t in selectors.turn_list(conversation=conversation)]
    assert contents == ["q1", "held text", "q2"]
    stored = Turn.objects.get(turn_id=record["turn_id"])
    assert stored.created_at.isoformat() == record["created_at"]


def test_a_task_queued_in_a_rolled_back_transaction_never_runs(make_user):
    """PF-J2: the write-back is queued with transaction.on_commit, so a transaction that rolls
    back queues nothing (eager here: a task queued at once would run inside the block)."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="q")
    record = a_held_answer(conversation, question)
    with tasks_recorded() as started, contextlib.suppress(RuntimeError), transaction.atomic():
        writeback.write_back_queue(turn_id=uuid.UUID(record["turn_id"]))
        raise RuntimeError("roll back")
    assert started == []
    assert held.record_get(record["turn_id"]) is not None  # still held, for the sweeper

    with tasks_recorded() as started, transaction.atomic():
        writeback.write_back_queue(turn_id=uuid.UUID(record["turn_id"]))
        assert started == []  # not before the commit either
    assert started == ["conversations.turn_write_back"]


def test_the_sweeper_queues_again_an_answer_whose_task_was_lost(make_user, settings):
    """Given held answers whose task never ran (lost), one held long ago and one just now, when
    the sweeper runs, then only the old one is queued (and written); the new one waits."""
    settings.CHAT_WRITEBACK_REQUEUE_AFTER_S = 120
    plain_redis().delete(held.DUE_KEY)
    conversation = services.conversation_create(owner=make_user())
    old = a_held_answer(conversation, services.turn_append_user(conversation=conversation, content="a"))
    new = a_held_answer(conversation, services.turn_append_user(conversation=conversation, content="b"))
    plain_redis().zadd(held.DUE_KEY, {old["turn_id"]: time.time() - 300})
    queued = writeback.held_answers_requeue()
    assert queued == 1
    assert Turn.objects.filter(turn_id=old["turn_id"]).exists()
    assert not Turn.objects.filter(turn_id=new["turn_id"]).exists()
    assert held.record_get(new["turn_id"]) is not None


def test_a_held_answer_of_a_deleted_conversation_is_dropped(make_user):
    """Given an answer held for a conversation deleted before its write-back, when the task
    runs, then nothing is written, the record is released and the task does not fail."""
    conversation = services.conversation_create(owner=make_user())
    record = a_held_answer(conversation, services.turn_append_user(conversation=conversation, content="q"))
    deletion.conversation_delete(conversation=conversation)
    result = writeback.turn_write_back.apply(args=[record["turn_id"]])
    assert result.successful() and result.result is False
    assert held.record_get(record["turn_id"]) is None
    assert not Turn.objects.filter(turn_id=record["turn_id"]).exists()


# --- Redis down ----------------------------------------------------------------------------------


@pytest.fixture
def redis_down(tmp_path, monkeypatch):
    """Every Redis client of the product (core/redis_guard.py) points at a socket nobody
    listens on; the circuit breaker is closed again afterwards."""
    dead = f"unix://{tmp_path}/no-redis.sock"
    sync_dead = redis.Redis.from_url(dead, socket_connect_timeout=1)
    async_dead: dict = {}

    def async_client(**_):  # any region: the same dead server
        loop = asyncio.get_running_loop()
        if loop not in async_dead:
            async_dead[loop] = redis.asyncio.Redis.from_url(dead, socket_connect_timeout=1, decode_responses=True)
        return async_dead[loop]

    monkeypatch.setattr(redis_guard, "sync_client", lambda **_: sync_dead)
    monkeypatch.setattr(redis_guard, "async_client", async_client)
    redis_guard.breaker.reset()
    yield dead
    redis_guard.breaker.reset()


async def test_with_redis_down_the_answer_is_inserted_synchronously(make_user, engine_double, redis_down):
    """Issue 4, degraded mode: when Redis cannot hold the answer, it is inserted at once (and
    counted), before ``done``; nothing is queued."""
    fallbacks = REGISTRY.get_sample_value("chat_writeback_sync_fallback_total") or 0
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    with tasks_recorded() as started:
        events = await one_turn(client, conversation_id)
    name, done, _ = events[-1]
    assert name == "done"
    assert (await Turn.objects.aget(turn_id=done["turn_id"])).content == "Hello, world."
    assert started == []
    assert REGISTRY.get_sample_value("chat_writeback_sync_fallback_total") == fallbacks + 1


def test_reads_fall_back_to_postgresql_when_redis_is_down(make_user, redis_down):
    """With Redis down, history reads answer from PostgreSQL (no held turns, no error)."""
    conversation = services.conversation_create(owner=make_user())
    services.turn_append_user(conversation=conversation, content="still here")
    assert [t.content for t in selectors.turn_list(conversation=conversation)] == ["still here"]



async def test_a_held_answer_whose_event_log_expired_still_resumes_as_done(make_user, engine_double):
    """Given an answer held awaiting write-back, no longer in any process's registry and with its
    Redis event log gone, when a client resumes its stream (GET .../turns/{id}/events), then it
    gets the answer as one `done` event, not a 404."""
    from conversations import turnlog, turnstream

    engine_double.scripts = [["Held", " answer"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    with tasks_queued_not_run():
        turn_id = (await one_turn(client, conversation_id))[-1][1]["turn_id"]
        turnstream._by_answer.clear()
        turnstream._streams.clear()
        raw = redis.Redis.from_url(settings.REDIS_URL)
        raw.delete(turnlog.stream_key(uuid.UUID(turn_id)))
        assert not await Turn.objects.filter(turn_id=turn_id).aexists()
        response = await client.get(f"/v1/conversations/{conversation_id}/turns/{turn_id}/events")
        assert response.status_code == 200, response.content
        events = parse_sse(await read_stream(response))
    assert events[-1][0] == "done" and events[-1][1]["turn_id"] == turn_id
