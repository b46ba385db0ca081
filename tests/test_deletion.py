"""The one deletion service (conversations/deletion.py; issue 17, "One deletion service"): the
page, ``/v1``, the retention purge and account deletion all stop a running answer wherever it
runs and leave nothing a late write-back could bring back. Real PostgreSQL and Redis, the scripted
engine; "another server process" is played by a thread that holds the conversation's generating
lock in Redis and answers the cancel the way a server process does (tests/integration has the
real multi-process cases).

Transactional: the Redis copies go and the cancels are sent once the deletion commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from django.test import Client
from django.utils import timezone

from accounts import services as account_services
from conversations import (
    answer_lock, cache, cancels, deletion, held, retention, services, tombstones, turnlog, turnstream, writeback,
)
from conversations.models import Conversation, Turn
from privacy import services as privacy_services
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import HTMX, parse_sse, post_message, read_stream, signed_in, wait_for
from tests.test_writeback import a_held_answer, plain_redis, redis_down  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Elsewhere:
    """An answer generating in another server process, as Redis shows it."""

    answer_id: uuid.UUID
    cancelled: threading.Event = field(default_factory=threading.Event)  # its cancel arrived
    held: threading.Event = field(default_factory=threading.Event)  # it held its answer after


@contextlib.contextmanager
def generating_elsewhere(conversation: Conversation, question: Turn) -> Iterator[Elsewhere]:
    """Another process writes an answer in ``conversation``: it holds the generating lock and
    has an event log; on its cancel (conversations/cancels.py pub/sub) it does what a server process's turn
    does: holds the cancelled answer for write-back, ends its log with ``done`` and unlocks."""
    remote = Elsewhere(answer_id=uuid.uuid4())
    redis = plain_redis()
    log = turnlog.stream_key(remote.answer_id)
    redis.set(answer_lock.busy_key(conversation.pk), str(remote.answer_id), ex=60)
    redis.xadd(log, {"e": "token", "d": json.dumps({"text": "par"})}, id="0-1")
    pubsub = redis.pubsub()
    pubsub.subscribe(cancels.CANCEL_CHANNEL)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.05)
            if message and message["type"] == "message" and message["data"] == str(remote.answer_id):
                remote.cancelled.set()
                record = held.answer_record(
                    conversation_id=conversation.pk, turn_id=remote.answer_id, reply_to_id=question.turn_id,
                    content="par", status=Turn.Status.CANCELLED, prompt_tokens=3, completion_tokens=1,
                )  # fmt: skip
                held.hold(record, ttl_s=600, due=True)
                redis.xadd(log, {"e": "done", "d": json.dumps({"status": "cancelled"})}, id="0-2")
                redis.delete(answer_lock.busy_key(conversation.pk))
                remote.held.set()
                return

    thread = threading.Thread(target=serve, name="another-server-process", daemon=True)
    thread.start()
    try:
        yield remote
    finally:
        stop.set()
        thread.join(5)
        pubsub.close()
        redis.delete(answer_lock.busy_key(conversation.pk), log)


# --- every entrypoint goes through the one service ------------------------------------------------


def _via_page(conversation: Conversation) -> None:
    client = Client()
    client.force_login(conversation.owner)
    assert client.post(f"/c/{conversation.pk}/delete", headers=HTMX).status_code == 204


def _via_api(conversation: Conversation) -> None:
    key = account_services.api_key_create(user=conversation.owner, name="tests").raw
    response = Client().delete(f"/v1/conversations/{conversation.pk}", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 204


def _via_retention(conversation: Conversation) -> None:
    Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=timezone.now() - timedelta(days=31))
    assert retention.conversations_purge_expired() == 1


def _via_account_deletion(conversation: Conversation) -> None:
    counts = privacy_services.account_delete(user=conversation.owner)
    assert (counts["conversations"], counts["turns"]) == (1, 1)


ENTRYPOINTS: dict[str, Callable[[Conversation], None]] = {
    "page": _via_page,
    "v1": _via_api,
    "retention": _via_retention,
    "account_deletion": _via_account_deletion,
}


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_every_entrypoint_stops_the_answer_elsewhere_and_nothing_comes_back(make_user, entrypoint):
    """Given a free user's conversation with an answer held for write-back, its hot cache entry,
    and an answer being written in another server process, when it is deleted through the page,
    ``/v1``, the retention purge or account deletion, then the other process is told to stop
    (within 2 s), the held answer and the cache entry are gone, and running the write-back task
    for both answers and then the sweeper writes nothing: the conversation stays deleted."""
    plain_redis().delete(held.DUE_KEY)
    conversation = services.conversation_create(owner=make_user(tier="free"))
    question = services.turn_append_user(conversation=conversation, content="hello")
    record = a_held_answer(conversation, question)
    assert cache.history(conversation.pk) is not None  # a read fills the hot cache
    assert plain_redis().exists(cache.cache_key(conversation.pk))

    with generating_elsewhere(conversation, question) as remote:
        ENTRYPOINTS[entrypoint](Conversation.objects.get(pk=conversation.pk))
        assert remote.cancelled.wait(2), "the other process was not told to stop"
        assert remote.held.wait(2)

    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert held.record_get(record["turn_id"]) is None
    assert not plain_redis().exists(cache.cache_key(conversation.pk))
    for turn_id in (record["turn_id"], str(remote.answer_id)):
        assert writeback.turn_write_back.apply(args=[turn_id]).result is False
    assert writeback.held_answers_requeue(now=time.time() + 86400) == 0
    assert held.record_get(remote.answer_id) is None
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Turn.objects.filter(conversation_id=conversation.pk).exists()


# --- late write-backs ---------------------------------------------------------------------------


def test_an_answer_held_after_the_deletion_is_dropped_by_the_sweeper_and_the_task(make_user):
    """Given a conversation deleted while one answer was held (its task not run yet) and another
    answer held just after the deletion (it ended in another process) whose task was lost, when
    the sweeper runs, then it queues nothing and drops the late record; the write-back task run
    explicitly for either answer writes nothing; the conversation stays deleted."""
    plain_redis().delete(held.DUE_KEY)
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="q")
    early = a_held_answer(conversation, question)

    deletion.conversation_delete(conversation=conversation)
    late = a_held_answer(conversation, question, text="ended after the deletion")
    plain_redis().zadd(held.DUE_KEY, {late["turn_id"]: time.time() - 3600})

    assert held.record_get(early["turn_id"]) is None
    assert writeback.held_answers_requeue() == 0
    assert held.record_get(late["turn_id"]) is None
    assert not plain_redis().zscore(held.DUE_KEY, late["turn_id"])
    for record in (early, late):
        assert writeback.turn_write_back.apply(args=[record["turn_id"]]).result is False
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Turn.objects.filter(conversation_id=conversation.pk).exists()


def test_without_its_tombstone_the_row_check_still_refuses_a_late_answer(make_user):
    """Given a deleted conversation whose tombstone Redis lost (a restart, an eviction) and an
    answer held for it afterwards, when its write-back task runs, then nothing is written (the
    conversation's row is gone under the insert's lock) and the record is released."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="q")
    deletion.conversation_delete(conversation=conversation)
    assert plain_redis().delete(tombstones.tombstone_key(conversation.pk)) == 1
    late = a_held_answer(conversation, question)

    result = writeback.turn_write_back.apply(args=[late["turn_id"]])

    assert result.successful() and result.result is False
    assert held.record_get(late["turn_id"]) is None
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Turn.objects.filter(turn_id=late["turn_id"]).exists()


def test_a_deletion_that_rolls_back_stops_nothing_and_drops_nothing(make_user):
    """The cancel, the tombstone and the dropped copies follow the commit: a deletion rolled
    back leaves the conversation, its held answer and the other process's answer alone."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="q")
    record = a_held_answer(conversation, question)
    with generating_elsewhere(conversation, question) as remote:
        with pytest.raises(RuntimeError), transaction.atomic():
            deletion.conversation_delete(conversation=conversation)
            raise RuntimeError("rolled back")
        assert not remote.cancelled.wait(0.3)
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert held.record_get(record["turn_id"]) is not None
    assert not plain_redis().exists(tombstones.tombstone_key(conversation.pk))


# --- the cross-process cancel ---------------------------------------------------------------------


def test_cancel_publish_tells_the_lock_holders_only(make_user):
    """``cancels.cancel_publish`` (sync) publishes the answer holding each conversation's lock
    on the cancel channel, where a subscriber sees it, and names them; a conversation that
    generates nothing publishes nothing."""
    busy, idle = uuid.uuid4(), uuid.uuid4()
    answer_id = uuid.uuid4()
    plain_redis().set(answer_lock.busy_key(busy), str(answer_id), ex=60)
    pubsub = plain_redis().pubsub()
    pubsub.subscribe(cancels.CANCEL_CHANNEL)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    try:
        assert cancels.cancel_publish([busy, idle]) == [answer_id]
        message = pubsub.get_message(timeout=2)
        assert (message["type"], message["data"]) == ("message", str(answer_id))
        assert cancels.cancel_publish([idle]) == []
        assert pubsub.get_message(timeout=0.3) is None
    finally:
        pubsub.close()
        plain_redis().delete(answer_lock.busy_key(busy))


# --- an answer generating in this process ---------------------------------------------------------


async def test_v1_delete_while_the_answer_is_written_here_stops_the_engine_request(make_user, engine_double):
    """PF-C3's bound for deletion: ``DELETE /v1/conversations/{id}`` while its answer streams in
    this process aborts the engine request before the 204, within 1 s; the reader gets the
    cancelled end; no row, held record or event log of the conversation is left."""
    engine_double.scripts = [["partial", 30.0, "never"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "go"})
    answer_id = response["X-Turn-Id"]
    reader = asyncio.ensure_future(read_stream(response))
    await wait_for(lambda: engine_double.unfinished)

    started = asyncio.get_running_loop().time()
    assert (await client.delete(f"/v1/conversations/{conversation_id}")).status_code == 204
    assert engine_double.requests[0][2] in engine_double.aborted
    assert asyncio.get_running_loop().time() - started < 1.0
    events = parse_sse(await asyncio.wait_for(reader, 5))
    assert events[-1][1]["status"] == "cancelled"
    assert not await Conversation.objects.filter(pk=conversation_id).aexists()
    assert not await Turn.objects.aexists()
    assert held.record_get(answer_id) is None
    assert not plain_redis().exists(turnlog.stream_key(answer_id))


async def test_the_page_delete_while_the_answer_is_written_here_stops_the_engine_request(make_user, engine_double):
    """The chat page's Delete while an answer is being written aborts the engine request before
    it answers (it used to delete the rows and leave the generation running)."""
    engine_double.scripts = [["Once", 30.0, " upon"]]
    client, _ = await signed_in(make_user)
    assert (await post_message(client, "story")).status_code == 200
    await wait_for(lambda: engine_double.unfinished)
    conversation = await Conversation.objects.aget()

    response = await client.post(f"/c/{conversation.pk}/delete", headers=HTMX)

    assert response.status_code == 204 and response["HX-Redirect"] == "/"
    assert engine_double.requests[0][2] in engine_double.aborted
    assert not await Conversation.objects.aexists()
    assert not await Turn.objects.aexists()


async def _streaming_here(make_user, engine_double) -> tuple[Conversation, turnstream.TurnStream]:
    engine_double.scripts = [["partial", 30.0, "never"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "go"})
    stream = turnstream.stream_for_answer(uuid.UUID(response["X-Turn-Id"]))
    await wait_for(lambda: engine_double.unfinished)
    return await Conversation.objects.aget(pk=conversation_id), stream


async def test_a_sync_deletion_from_another_thread_stops_the_answer_written_here(make_user, engine_double):
    """The purge task and account deletion run in threads: their deletion of a conversation
    whose answer streams in this process's event loop aborts the engine request; the cancelled
    answer is never written, and its event log goes when it ends (the writer sees the
    tombstone), not an hour later."""
    conversation, stream = await _streaming_here(make_user, engine_double)

    await sync_to_async(deletion.conversation_delete)(conversation=conversation)
    await wait_for(lambda: engine_double.requests[0][2] in engine_double.aborted)
    await asyncio.wait_for(stream.wait(), 5)

    assert stream.status == Turn.Status.CANCELLED
    assert not await Turn.objects.aexists()
    assert held.record_get(stream.answer_id) is None
    assert not plain_redis().exists(turnlog.stream_key(stream.answer_id))
    assert not plain_redis().exists(turnlog.question_key(stream.question_id))


async def test_with_redis_down_a_sync_deletion_still_stops_the_answer_here(make_user, engine_double, redis_down):
    """Degraded mode: with Redis unreachable (no lock, no pub/sub, no tombstone) a deletion
    still stops this process's stream through its registry, and the answer's fallback insert
    (Redis cannot hold it) finds the row gone: nothing is written."""
    conversation, stream = await _streaming_here(make_user, engine_double)

    await sync_to_async(deletion.conversation_delete)(conversation=conversation)
    await wait_for(lambda: engine_double.requests[0][2] in engine_double.aborted)
    await asyncio.wait_for(stream.wait(), 5)

    assert not await Conversation.objects.aexists()
    assert not await Turn.objects.aexists()
