"""Durable write-back: a finished answer is held in Redis, then a Celery task writes PostgreSQL.

Issue 4 ("Durable write-back"; PF-J1, PF-J2). When an answer ends (conversations/generate.py
``_finish``), before its ``done`` event is published:

1. :func:`answer_finish` holds the answer's record in Redis (the held-answer store,
   conversations/held.py: ``chat:pending:{turn_id}``, the conversation's index that reads merge,
   and the sweeper's due set).
2. :func:`write_back_queue` queues the task ``turn_write_back(turn_id, region)`` with
   ``transaction.on_commit`` (PF-J2: a task queued inside a transaction that rolls back never
   runs). Only the turn id and its conversation's region travel through the broker (the
   global Redis); the text stays in the record, on the region's Redis server (issue 20), where
   the worker reads it.
3. The task (late acks, reject on worker loss, retried with backoff on database and Redis
   errors) reads the record, calls ``services.answer_store`` (idempotent on the turn
   id) and deletes the record only after that commit (PF-J1: a worker killed anywhere before the
   acknowledgement runs the task again; the answer is written exactly once).
4. The sweeper (beat, every ``settings.CHAT_WRITEBACK_SWEEP_S``) queues the write again for a
   record still held ``settings.CHAT_WRITEBACK_REQUEUE_AFTER_S`` after it was last queued, on
   every region's Redis server.

Redis down: :func:`answer_finish` inserts the turn synchronously instead (logged and counted in
``chat_writeback_sync_fallback_total``).

Zero-retention conversations (conversations/retention.py) use the same records with a TTL of
``settings.CHAT_ZDR_TTL_S`` that is never refreshed: they are the only copy of the turn, the
history for the conversation's next turns within that window, and are never queued or written.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from uuid import UUID

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, InterfaceError, transaction
from prometheus_client import Counter
from redis.exceptions import RedisError

from conversations import held, services, tombstones
from conversations.models import Conversation, Turn
from core import redis_guard
from core.regions import redis_region
from core.db import run_in_db_thread

logger = logging.getLogger(__name__)

SYNC_FALLBACKS = Counter(
    "chat_writeback_sync_fallback",
    "Answers stored by a synchronous insert because Redis could not hold them.",
)
REQUEUED = Counter(
    "chat_writeback_requeued",
    "Held answers the sweeper queued again because their write-back had not landed.",
)


# --- write-back ---------------------------------------------------------------------------------


def write_back_queue(*, turn_id: UUID, region: str | None = None) -> None:
    """Queue ``turn_write_back(turn_id, region)`` (``region``: whose Redis server holds the
    record, core/redis_guard.py; None: the global one) when the current transaction commits; at
    once outside a transaction. A rolled-back transaction queues nothing (PF-J2)."""
    transaction.on_commit(lambda: turn_write_back.delay(str(turn_id), region))


def answer_write_back(*, turn_id: UUID, region: str | None = None) -> Turn | None:
    """Write the held answer ``turn_id`` (held on ``region``'s Redis server; None: the region
    its id names, else the global server) to PostgreSQL and release its record after the commit.

    Returns the stored turn, or None if there was nothing to write (no record: written and
    released before, or expired; a zero-retention record; the conversation is gone).
    Idempotent: ``services.answer_store`` stores a turn id at most once, so a task run
    twice (a redelivery after a worker died, PF-J1) writes one row. Raises DatabaseError /
    RedisError for the task to retry.

    A deleted conversation never comes back (conversations/deletion.py): its tombstone drops
    the record without a database query, and without one (lost with Redis) the insert finds the
    conversation's row gone under its lock and drops it too. The row check is the one that
    holds when Redis forgot: the deletion locks the same row, so an insert either commits
    before it (and its turn is deleted with the conversation) or finds no row.
    """
    record = held.record_get(turn_id, region=region)
    if record is None:
        return None
    conversation_id = record["conversation_id"]
    if record.get("zero_retention") or record["role"] != Turn.Role.ASSISTANT:
        return None  # never written to PostgreSQL; the record expires on its own
    if tombstones.tombstoned(conversation_id):
        logger.info(
            "conversation %s was deleted; dropping held answer %s", conversation_id, turn_id
        )
        held.release(turn_id=turn_id, conversation_id=conversation_id)
        return None
    try:
        turn = services.answer_store(answer=held.record_turn(record))
    except Conversation.DoesNotExist:
        logger.info("conversation %s is gone; dropping held answer %s", conversation_id, turn_id)
        held.release(turn_id=turn_id, conversation_id=conversation_id)
        return None
    # The record goes only once the row is committed: until then it is the answer's copy.
    transaction.on_commit(lambda: held.release(turn_id=turn_id, conversation_id=conversation_id))
    return turn


@shared_task(
    name="conversations.turn_write_back",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DatabaseError, InterfaceError, RedisError, OSError),
    retry_backoff=2,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=10,
)
def turn_write_back(turn_id: str, region: str | None = None) -> bool:
    """Celery: write held answer ``turn_id`` (a UUID string) held on ``region``'s Redis server
    (messages queued before regions had servers name none: the turn id's region, else the global
    one). True if a row was written or found; False if nothing was held. Retries on
    database/Redis errors (2 s backoff doubling to 5 min, 10 times; the sweeper queues it again
    after that)."""
    return answer_write_back(turn_id=UUID(turn_id), region=region) is not None


def held_answers_requeue(*, now: float | None = None) -> int:
    """Queue the write-back again for every answer held longer than
    ``settings.CHAT_WRITEBACK_REQUEUE_AFTER_S`` since it was held or last queued (its task was
    lost: a broker outage, a message dropped after max retries). ``now``: epoch seconds.
    Returns how many were queued. Records that vanished leave the due set; records of a
    conversation deleted meanwhile (its tombstone, conversations/tombstones.py) are dropped, not
    queued. Every Redis server is swept (core/redis_guard.py ``regions_with_servers``; a
    region's due set, records and tombstones are on its own). Raises RedisError when a server
    is unreachable, after sweeping the others (the next sweep tries again)."""
    now = time.time() if now is None else now
    cutoff = now - settings.CHAT_WRITEBACK_REQUEUE_AFTER_S

    def take_due(client) -> list[str]:
        due = [held.text_of(t) for t in client.zrangebyscore(held.DUE_KEY, "-inf", cutoff)]
        if not due:
            return []
        raws = client.mget([held.record_key(t) for t in due])
        gone = [t for t, raw in zip(due, raws, strict=True) if raw is None]
        owners = {  # turn id -> its conversation's id, for each record still held
            t: json.loads(raw)["conversation_id"]
            for t, raw in zip(due, raws, strict=True)
            if raw is not None
        }
        tombstoned = [tombstones.tombstone_key(c) for c in owners.values()]
        marks = client.mget(tombstoned) if tombstoned else []
        deleted = [t for t, mark in zip(owners, marks, strict=True) if mark]
        live = [t for t in owners if t not in deleted]
        with client.pipeline(transaction=True) as pipe:
            if gone:
                pipe.zrem(held.DUE_KEY, *gone)
            for turn_id in deleted:  # its conversation is gone: never written
                pipe.delete(held.record_key(turn_id))
                pipe.srem(held.conversation_key(owners[turn_id]), turn_id)
                pipe.zrem(held.DUE_KEY, turn_id)
            if live:  # next look in another REQUEUE_AFTER_S, not at every sweep
                pipe.zadd(held.DUE_KEY, dict.fromkeys(live, now))
            pipe.execute()
        if deleted:
            logger.info("dropped %d held answer(s) of deleted conversations", len(deleted))
        return live

    queued = 0
    failure: RedisError | None = None
    for region in redis_guard.regions_with_servers():
        try:
            due = redis_guard.call(held.PART, take_due, region=region)
        except RedisError as exc:
            failure = exc
            continue
        for turn_id in due:
            turn_write_back.delay(turn_id, region)
        queued += len(due)
    if queued:
        REQUEUED.inc(queued)
        logger.warning("queued the write-back of %d held answer(s) again", queued)
    if failure is not None:
        raise failure
    return queued


@shared_task(name="conversations.turn_write_back_sweep", acks_late=True)
def turn_write_back_sweep() -> int:
    """Celery beat (every ``settings.CHAT_WRITEBACK_SWEEP_S``): :func:`held_answers_requeue`."""
    return held_answers_requeue()


# --- the end of a turn --------------------------------------------------------------------------


_in_thread = run_in_db_thread


async def answer_finish(*, record: dict[str, Any]) -> str:
    """Make a finished answer durable; return how: ``"held"`` (in Redis, write-back queued),
    ``"stored"`` (Redis down: inserted synchronously), ``"transient"`` (zero retention: held
    for ``settings.CHAT_ZDR_TTL_S`` only) or ``"lost"`` (zero retention and Redis down: the
    answer was streamed and is kept nowhere, as the policy allows).

    Call before publishing the ``done`` event: when this returns, the answer survives the loss
    of this process. Raises (DatabaseError, ...) only when neither Redis nor PostgreSQL took it.
    """
    if record["zero_retention"]:
        try:
            await held.ahold(record, ttl_s=settings.CHAT_ZDR_TTL_S, due=False)
        except (RedisError, OSError) as exc:
            logger.warning("zero-retention answer %s not kept (Redis: %s)", record["turn_id"], exc)
            return "lost"
        return "transient"
    try:
        await held.ahold(record, ttl_s=settings.CHAT_WRITEBACK_HOLD_TTL_S, due=True)
    except (RedisError, OSError) as exc:
        SYNC_FALLBACKS.inc()  # the outage itself is logged once by redis_guard
        logger.info("Redis cannot hold answer %s (%s): inserting it now", record["turn_id"], exc)
        await _in_thread(services.answer_store, answer=held.record_turn(record))
        return "stored"
    try:
        await _in_thread(
            write_back_queue,
            turn_id=UUID(record["turn_id"]),
            region=redis_region(record["conversation_id"]),
        )
    except Exception:  # noqa: BLE001 - the record is held; the sweeper queues it later
        logger.exception(
            "could not queue the write-back of %s; the sweeper will", record["turn_id"]
        )
    return "held"
