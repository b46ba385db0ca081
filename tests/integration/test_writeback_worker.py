"""Durable write-back and retention with real processes: Celery workers (SIGKILLed mid-task),
a daphne gateway, PostgreSQL's own view of its sessions (pg_stat_activity).

No test hooks in product code: a write-back is held "mid-task" by locking its conversation's
row from the test (SELECT ... FOR UPDATE on another connection), which the task's
``services.turn_append_assistant`` must lock too.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from datetime import timedelta

import httpx
import psutil
import pytest
from django.db import connection, transaction
from django.utils import timezone

from accounts.services import api_key_create
from chatsite.celery import app
from conversations import held, retention, services, writeback
from conversations.models import Conversation, Turn
from tests.processes import celery_worker_process, server_process
from tests.test_writeback import conversation_row_locked, plain_redis, sessions_waiting_on_a_lock

pytestmark = pytest.mark.django_db(transaction=True)

VISIBILITY_S = 3  # the worker that picks up a dead worker's message: redelivery after this


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval_s)


@pytest.fixture
def queued_to_real_workers():
    """Tasks go through the real broker to real workers (not eager) for the test."""
    app.conf.task_always_eager = False
    try:
        yield
    finally:
        app.conf.task_always_eager = True
        client = plain_redis()
        client.delete("celery", "unacked", "unacked_index", "unacked_mutex")


def held_answer(make_user, text: str = "the answer") -> dict:
    """A conversation with a question and its finished answer held in Redis (not yet written)."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="q")
    record = held.answer_record(
        conversation_id=conversation.conversation_id, turn_id=uuid.uuid4(),
        reply_to_id=question.turn_id, content=text, status="complete",
        prompt_tokens=5, completion_tokens=2,
    )  # fmt: skip
    held.hold(record, ttl_s=600, due=True)
    return record


def stored_count(turn_id: str) -> int:
    return Turn.objects.filter(turn_id=turn_id).count()


# --- PF-J1 ---------------------------------------------------------------------------------------


def test_pf_j1_worker_killed_mid_write_writes_the_turn_exactly_once(make_user, tmp_path, queued_to_real_workers):
    """PF-J1: given a write-back task blocked mid-write (on the conversation's row lock), when
    the whole worker is SIGKILLed and a new worker starts, then the message is redelivered
    (late ack; after the visibility timeout) and the turn is written exactly once, and its
    Redis record released."""
    record = held_answer(make_user)
    short = {"CHAT_CELERY_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S), "CHAT_CELERY_RESTORE_INTERVAL_S": "1"}
    with conversation_row_locked(record["conversation_id"]):
        with celery_worker_process(tmp_path, short) as first:
            writeback.write_back_queue(turn_id=uuid.UUID(record["turn_id"]))
            wait_until(sessions_waiting_on_a_lock, 60, "the task to block on the row lock")
            first.kill()
        assert stored_count(record["turn_id"]) == 0
    time.sleep(VISIBILITY_S)  # the killed worker's delivery is now past the visibility timeout
    with celery_worker_process(tmp_path, short) as second:
        wait_until(lambda: stored_count(record["turn_id"]), 60, "the redelivered write-back")
        wait_until(lambda: held.record_get(record["turn_id"]) is None, 10, "the record's release")
        time.sleep(1)  # a duplicate delivery would land now
        log = second.log()
    assert stored_count(record["turn_id"]) == 1
    assert Turn.objects.get(turn_id=record["turn_id"]).content == "the answer"
    assert "conversations.turn_write_back" in log and "succeeded" in log


def test_pf_j1_pool_child_killed_is_requeued_at_once(make_user, tmp_path, queued_to_real_workers):
    """PF-J1 (reject on worker lost): given a write-back blocked mid-write, when only the
    worker's pool child is SIGKILLed, then the worker requeues the message at once (no
    visibility timeout: it stays 600 s here) and its new child writes the turn exactly once."""
    record = held_answer(make_user)
    with celery_worker_process(tmp_path) as worker:
        with conversation_row_locked(record["conversation_id"]):
            writeback.write_back_queue(turn_id=uuid.UUID(record["turn_id"]))
            wait_until(sessions_waiting_on_a_lock, 60, "the task to block on the row lock")
            (child,) = psutil.Process(worker.proc.pid).children()
            child.kill()
            # The requeued task runs in a new child and blocks on the same lock again.
            wait_until(
                lambda: sessions_waiting_on_a_lock() and not child.is_running(), 60,
                "the requeued task to block again",
            )
        wait_until(lambda: stored_count(record["turn_id"]), 60, "the requeued write-back")
        time.sleep(1)
        log = worker.log()
    assert stored_count(record["turn_id"]) == 1
    assert "WorkerLostError" in log or "signal 9" in log


# --- PF-J2 ---------------------------------------------------------------------------------------


def test_pf_j2_a_task_queued_in_a_rolled_back_transaction_never_reaches_the_worker(make_user, tmp_path, queued_to_real_workers):
    """PF-J2: given a real worker, when a write-back is queued inside a transaction that rolls
    back and then another is queued and committed, then the worker writes only the second (one
    worker, FIFO queue: had the first been sent, it would have run first)."""
    rolled_back, committed = held_answer(make_user, "rolled back"), held_answer(make_user, "committed")
    with celery_worker_process(tmp_path) as worker:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            writeback.write_back_queue(turn_id=uuid.UUID(rolled_back["turn_id"]))
            raise RuntimeError("roll back")
        with transaction.atomic():
            writeback.write_back_queue(turn_id=uuid.UUID(committed["turn_id"]))
        wait_until(lambda: stored_count(committed["turn_id"]), 60, "the committed write-back")
        log = worker.log()
    assert stored_count(rolled_back["turn_id"]) == 0
    assert held.record_get(rolled_back["turn_id"]) is not None  # still held
    assert log.count("conversations.turn_write_back") >= 1
    assert rolled_back["turn_id"] not in log


# --- retention -----------------------------------------------------------------------------------


def test_the_retention_task_purges_on_a_real_worker(make_user, tmp_path, queued_to_real_workers):
    """The daily purge as beat sends it: through the broker to a real worker, which deletes a
    free conversation idle for 31 days and keeps one idle for 1 day."""
    owner = make_user(tier="free")
    old, recent = (services.conversation_create(owner=owner) for _ in range(2))
    Conversation.objects.filter(pk=old.pk).update(last_turn_at=timezone.now() - timedelta(days=31))
    Conversation.objects.filter(pk=recent.pk).update(last_turn_at=timezone.now() - timedelta(days=1))
    with celery_worker_process(tmp_path):
        retention.conversations_purge_expired_task.delay()
        wait_until(lambda: not Conversation.objects.filter(pk=old.pk).exists(), 60, "the purge")
    assert Conversation.objects.filter(pk=recent.pk).exists()


# --- PF-P2 ---------------------------------------------------------------------------------------


def idle_in_transaction() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, query FROM pg_stat_activity "
            "WHERE datname = current_database() AND state LIKE 'idle in transaction%%' "
            "AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()


def test_pf_p2_disconnect_while_the_partial_turn_is_written_leaves_no_idle_transaction(make_user):
    """PF-P2: given a real gateway (daphne subprocess, disconnect grace 0) whose answer is
    paused after two tokens, when the client drops the connection, the partial answer is
    written while the test holds the conversation's row lock (the write waits mid-transaction),
    and the lock is then released, then 5 s later PostgreSQL has no session "idle in
    transaction", and the partial answer is stored once, as cancelled."""
    key = api_key_create(user=make_user("pf-p2"), name="p2").raw
    headers = {"Authorization": f"Bearer {key}"}
    env = {
        "CHAT_ENGINE_CLASS": "tests.fakes.ScriptedEngine",
        "CHAT_SCRIPTED_ENGINE_SCRIPT": json.dumps(["a", "b", 60, "c"]),
        "CHAT_STREAM_DISCONNECT_GRACE_S": "0",
    }
    with server_process(env, "/v1/openapi.json") as url:
        conversation_id = httpx.post(f"{url}/v1/conversations", json={}, headers=headers).json()["conversation_id"]
        with contextlib.ExitStack() as lock, httpx.stream(
            "POST", f"{url}/v1/conversations/{conversation_id}/turns",
            json={"role": "user", "content": "go"}, headers=headers, timeout=30,
        ) as response:  # fmt: skip
            answer_id = response.headers["X-Turn-Id"]
            tokens, locked = 0, False
            for line in response.iter_lines():
                tokens += line.startswith("event: token")
                if tokens == 1 and not locked:  # the user turn is in: lock before the end
                    lock.enter_context(conversation_row_locked(conversation_id))
                    locked = True
                if tokens == 2 and line.startswith("data: "):
                    break
            response.close()  # drop the connection mid-answer
            wait_until(sessions_waiting_on_a_lock, 30, "the partial answer's write to wait on the lock")
        wait_until(lambda: stored_count(answer_id), 30, "the partial answer")
        time.sleep(5)
        leftover = idle_in_transaction()
    assert leftover == []
    answer = Turn.objects.get(turn_id=answer_id)
    assert (answer.status, answer.content) == ("cancelled", "ab")
