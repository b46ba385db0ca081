"""Durable write-back: a finished answer is held in Redis, then a Celery task writes PostgreSQL.

Issue 4 ("Durable write-back"; PF-J1, PF-J2). When an answer ends (conversations/generate.py
``_finish``), before its ``done`` event is published:

1. :func:`answer_finish` holds the answer's record in Redis: ``chat:pending:{turn_id}`` (JSON,
   the whole turn: conversations/turndata.py), listed in the conversation's index
   ``chat:pending:conv:{conversation_id}`` (so reads can merge it, :func:`held_turns`) and in the
   sweeper's sorted set ``chat:pending:due`` (score: when it was held or last queued, epoch s).
2. :func:`write_back_queue` queues the task ``turn_write_back(turn_id)`` with
   ``transaction.on_commit`` (PF-J2: a task queued inside a transaction that rolls back never
   runs). Only the turn id travels through the broker; the text stays in the record.
3. The task (late acks, reject on worker loss, retried with backoff on database and Redis
   errors) reads the record, calls ``services.answer_store`` (idempotent on the turn
   id) and deletes the record only after that commit (PF-J1: a worker killed anywhere before the
   acknowledgement runs the task again; the answer is written exactly once).
4. The sweeper (beat, every ``settings.CHAT_WRITEBACK_SWEEP_S``) queues the write again for a
   record still held ``settings.CHAT_WRITEBACK_REQUEUE_AFTER_S`` after it was last queued.

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
from decimal import Decimal
from typing import Any
from uuid import UUID

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, InterfaceError, transaction
from django.utils import timezone
from prometheus_client import Counter
from redis.exceptions import RedisError

from core import redis_guard
from conversations import services, tombstones
from core.db import run_in_db_thread
from conversations.models import Conversation, Turn
from conversations.turndata import turn_data, turn_from_data

logger = logging.getLogger(__name__)

DUE_KEY = "chat:pending:due"

SYNC_FALLBACKS = Counter(
    "chat_writeback_sync_fallback",
    "Answers stored by a synchronous insert because Redis could not hold them.",
)
REQUEUED = Counter(
    "chat_writeback_requeued",
    "Held answers the sweeper queued again because their write-back had not landed.",
)


def record_key(turn_id: UUID | str) -> str:
    """Redis key of a held turn's record."""
    return f"chat:pending:{turn_id}"


def conversation_key(conversation_id: UUID | str) -> str:
    """Redis set of the turn ids a conversation has held (not, or not yet, in PostgreSQL)."""
    return f"chat:pending:conv:{conversation_id}"


# --- records -------------------------------------------------------------------------------------


def turn_record(turn: Turn, *, zero_retention: bool = False) -> dict[str, Any]:
    """A turn as a JSON-safe record: every field (conversations/turndata.py ``turn_data``: ids
    as strings, ``created_at`` ISO 8601, ``cost_usd`` as its exact decimal string) and
    ``zero_retention``."""
    return {**turn_data(turn), "zero_retention": zero_retention}


def record_turn(record: dict[str, Any]) -> Turn:
    """The unsaved :class:`Turn` a record describes (for reads that merge held turns)."""
    return turn_from_data(record)


def answer_record(
    *,
    conversation_id: UUID,
    turn_id: UUID,
    reply_to_id: UUID,
    content: str,
    status: str,
    prompt_tokens: int,
    completion_tokens: int,
    zero_retention: bool = False,
    replaces_id: UUID | None = None,
    context_trimmed: int = 0,
    pool: str = "",
    model_version: str = "",
    cached_tokens: int | None = None,
    cost_usd: Decimal | None = None,
    moderation_verdict: dict | None = None,
    finish_reason: str = "",
    continues_id: UUID | None = None,
) -> dict[str, Any]:
    """The record of an answer that finished now (tokens: counts; ``status``: Turn.Status;
    ``replaces_id``: the answer it regenerates; ``context_trimmed``: Turn.context_trimmed;
    ``pool`` / ``model_version`` / ``cached_tokens`` / ``cost_usd``: who answered and what it
    cost; ``moderation_verdict``: the output gate's; ``finish_reason``: why it ended;
    ``continues_id``: the cut-off answer it continues; Turn's fields of those names)."""
    turn = Turn(
        turn_id=turn_id, conversation_id=conversation_id, role=Turn.Role.ASSISTANT,
        content=content, status=status, token_count=completion_tokens,
        prompt_tokens=prompt_tokens, reply_to_id=reply_to_id, created_at=timezone.now(),
        replaces_id=replaces_id, context_trimmed=context_trimmed, pool=pool,
        model_version=model_version, cached_tokens=cached_tokens, cost_usd=cost_usd,
        moderation_verdict=moderation_verdict or {}, finish_reason=finish_reason,
        continues_id=continues_id,
    )  # fmt: skip
    return turn_record(turn, zero_retention=zero_retention)


def _queue_hold(pipe, record: dict[str, Any], *, ttl_s: int, due: bool) -> None:
    """Add the commands that hold ``record`` to a (sync or asyncio) pipeline."""
    turn_id, conversation_id = record["turn_id"], record["conversation_id"]
    pipe.set(record_key(turn_id), json.dumps(record, ensure_ascii=False), ex=ttl_s)
    pipe.sadd(conversation_key(conversation_id), turn_id)
    pipe.expire(conversation_key(conversation_id), ttl_s)
    if due:
        pipe.zadd(DUE_KEY, {turn_id: time.time()})


# --- Redis (through core/redis_guard.py: short timeouts, circuit breaker, counted) ----------

PART = "writeback"
_FALLBACK = "finished answers are inserted synchronously"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def hold(record: dict[str, Any], *, ttl_s: int, due: bool) -> None:
    """Hold ``record`` in Redis for ``ttl_s`` seconds (synchronous). ``due``: list it for the
    sweeper (answers awaiting write-back; never zero-retention turns). Raises RedisError
    (``redis_guard.RedisUnavailable``) when Redis is unreachable or known to be down."""

    def run(client):
        with client.pipeline(transaction=True) as pipe:
            _queue_hold(pipe, record, ttl_s=ttl_s, due=due)
            pipe.execute()

    redis_guard.call(PART, run, fallback=_FALLBACK)


async def ahold(record: dict[str, Any], *, ttl_s: int, due: bool) -> None:
    """:func:`hold` for the event loop (the loop's asyncio client)."""

    async def run(client):
        async with client.pipeline(transaction=True) as pipe:
            _queue_hold(pipe, record, ttl_s=ttl_s, due=due)
            await pipe.execute()

    await redis_guard.acall(PART, run, fallback=_FALLBACK)


def record_get(turn_id: UUID | str) -> dict[str, Any] | None:
    """The held record of ``turn_id``, or None (never held, written and released, or expired).
    Raises RedisError when Redis is unreachable (the task retries)."""
    raw = redis_guard.call(PART, lambda client: client.get(record_key(turn_id)))
    return json.loads(raw) if raw else None


def release(*, turn_id: UUID | str, conversation_id: UUID | str) -> None:
    """Forget a held turn: its record, its index entry and its sweeper entry. Raises
    RedisError when Redis is unreachable."""

    def run(client):
        with client.pipeline(transaction=True) as pipe:
            pipe.delete(record_key(turn_id))
            pipe.srem(conversation_key(conversation_id), str(turn_id))
            pipe.zrem(DUE_KEY, str(turn_id))
            pipe.execute()

    redis_guard.call(PART, run)


def held_turns(conversation_id: UUID | str) -> list[Turn]:
    """The conversation's turns held in Redis and not (yet) in PostgreSQL, oldest first, as
    unsaved :class:`Turn` objects: finished answers awaiting write-back, and every turn of a
    zero-retention conversation still within its TTL. Reads merge these (selectors.py) so an
    answer is visible from the moment its ``done`` event is sent. ``[]`` when Redis is down
    (reads then show what PostgreSQL has)."""

    def run(client) -> list:
        ids = sorted(_text(i) for i in client.smembers(conversation_key(conversation_id)))
        if not ids:
            return []
        raws = client.mget([record_key(i) for i in ids])
        gone = [i for i, raw in zip(ids, raws, strict=True) if raw is None]
        if gone:  # released or expired: tidy the index
            client.srem(conversation_key(conversation_id), *gone)
        return [raw for raw in raws if raw is not None]

    raws = redis_guard.call(PART, run, default=[], fallback="reads show what PostgreSQL has")
    turns = [record_turn(json.loads(raw)) for raw in raws]
    turns.sort(key=lambda t: (t.created_at, str(t.turn_id)))
    return turns


def conversation_held_forget(conversation_id: UUID | str) -> None:
    """Drop every turn a (deleted or purged) conversation holds in Redis. Never raises for
    Redis errors: held records expire on their own, and a write-back of a conversation that is
    gone drops its record (:func:`answer_write_back`)."""

    def run(client):
        ids = [_text(i) for i in client.smembers(conversation_key(conversation_id))]
        with client.pipeline(transaction=True) as pipe:
            for turn_id in ids:
                pipe.delete(record_key(turn_id))
                pipe.zrem(DUE_KEY, turn_id)
            pipe.delete(conversation_key(conversation_id))
            pipe.execute()

    redis_guard.call(PART, run, default=None, fallback="held turns expire on their own")


# --- write-back ---------------------------------------------------------------------------------


def write_back_queue(*, turn_id: UUID) -> None:
    """Queue ``turn_write_back(turn_id)`` when the current transaction commits; at once outside
    a transaction. A rolled-back transaction queues nothing (PF-J2)."""
    transaction.on_commit(lambda: turn_write_back.delay(str(turn_id)))


def answer_write_back(*, turn_id: UUID) -> Turn | None:
    """Write the held answer ``turn_id`` to PostgreSQL and release its record after the commit.

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
    record = record_get(turn_id)
    if record is None:
        return None
    conversation_id = record["conversation_id"]
    if record.get("zero_retention") or record["role"] != Turn.Role.ASSISTANT:
        return None  # never written to PostgreSQL; the record expires on its own
    if tombstones.tombstoned(conversation_id):
        logger.info("conversation %s was deleted; dropping held answer %s", conversation_id, turn_id)
        release(turn_id=turn_id, conversation_id=conversation_id)
        return None
    try:
        turn = services.answer_store(answer=record_turn(record))
    except Conversation.DoesNotExist:
        logger.info("conversation %s is gone; dropping held answer %s", conversation_id, turn_id)
        release(turn_id=turn_id, conversation_id=conversation_id)
        return None
    # The record goes only once the row is committed: until then it is the answer's copy.
    transaction.on_commit(lambda: release(turn_id=turn_id, conversation_id=conversation_id))
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
def turn_write_back(turn_id: str) -> bool:
    """Celery: write held answer ``turn_id`` (a UUID string). True if a row was written or
    found; False if nothing was held. Retries on database/Redis errors (2 s backoff doubling to
    5 min, 10 times; the sweeper queues it again after that)."""
    return answer_write_back(turn_id=UUID(turn_id)) is not None


def held_answers_requeue(*, now: float | None = None) -> int:
    """Queue the write-back again for every answer held longer than
    ``settings.CHAT_WRITEBACK_REQUEUE_AFTER_S`` since it was held or last queued (its task was
    lost: a broker outage, a message dropped after max retries). ``now``: epoch seconds.
    Returns how many were queued. Records that vanished leave the due set; records of a
    conversation deleted meanwhile (its tombstone, conversations/tombstones.py) are dropped, not
    queued. Raises RedisError when Redis is unreachable (the next sweep tries again)."""
    now = time.time() if now is None else now
    cutoff = now - settings.CHAT_WRITEBACK_REQUEUE_AFTER_S

    def take_due(client) -> list[str]:
        due = [_text(t) for t in client.zrangebyscore(DUE_KEY, "-inf", cutoff)]
        if not due:
            return []
        held = client.mget([record_key(t) for t in due])
        gone = [t for t, raw in zip(due, held, strict=True) if raw is None]
        owners = {  # turn id -> its conversation's id, for each record still held
            t: json.loads(raw)["conversation_id"]
            for t, raw in zip(due, held, strict=True)
            if raw is not None
        }
        tombstoned = [tombstones.tombstone_key(c) for c in owners.values()]
        marks = client.mget(tombstoned) if tombstoned else []
        deleted = [t for t, mark in zip(owners, marks, strict=True) if mark]
        live = [t for t in owners if t not in deleted]
        with client.pipeline(transaction=True) as pipe:
            if gone:
                pipe.zrem(DUE_KEY, *gone)
            for turn_id in deleted:  # its conversation is gone: never written
                pipe.delete(record_key(turn_id))
                pipe.srem(conversation_key(owners[turn_id]), turn_id)
                pipe.zrem(DUE_KEY, turn_id)
            if live:  # next look in another REQUEUE_AFTER_S, not at every sweep
                pipe.zadd(DUE_KEY, dict.fromkeys(live, now))
            pipe.execute()
        if deleted:
            logger.info("dropped %d held answer(s) of deleted conversations", len(deleted))
        return live

    due = redis_guard.call(PART, take_due)
    for turn_id in due:
        turn_write_back.delay(turn_id)
    if due:
        REQUEUED.inc(len(due))
        logger.warning("queued the write-back of %d held answer(s) again", len(due))
    return len(due)


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
            await ahold(record, ttl_s=settings.CHAT_ZDR_TTL_S, due=False)
        except (RedisError, OSError) as exc:
            logger.warning("zero-retention answer %s not kept (Redis: %s)", record["turn_id"], exc)
            return "lost"
        return "transient"
    try:
        await ahold(record, ttl_s=settings.CHAT_WRITEBACK_HOLD_TTL_S, due=True)
    except (RedisError, OSError) as exc:
        SYNC_FALLBACKS.inc()  # the outage itself is logged once by redis_guard
        logger.info("Redis cannot hold answer %s (%s): inserting it now", record["turn_id"], exc)
        await _in_thread(services.answer_store, answer=record_turn(record))
        return "stored"
    try:
        await _in_thread(write_back_queue, turn_id=UUID(record["turn_id"]))
    except Exception:  # noqa: BLE001 - the record is held; the sweeper queues it later
        logger.exception("could not queue the write-back of %s; the sweeper will", record["turn_id"])
    return "held"
