"""The held-answer store: turns kept in Redis before (or instead of) PostgreSQL.

A finished answer's record (JSON, the whole turn: conversations/turndata.py) is held at
``chat:pending:{turn_id}``, listed in its conversation's index ``chat:pending:conv:{id}`` (reads
merge held turns: :func:`held_turns`) and, while it awaits write-back, in the sweeper's sorted
set ``chat:pending:due`` (score: when it was held or last queued, epoch s). Zero-retention turns
are held the same way with a TTL of ``settings.CHAT_ZDR_TTL_S`` and never listed as due.

The write-back worker that moves held answers to PostgreSQL is conversations/writeback.py; this
module only stores, reads and forgets records, so every reader (selectors, deletion, services)
can use it without importing the worker and the services it calls.

Every key lives on the Redis server of the conversation's region (issue 20; core/redis_guard.py,
``core.regions.redis_region``), the due set included: there is one per server, and the
sweeper reads each.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.utils import timezone

from conversations.models import Turn
from conversations.turndata import turn_data, turn_from_data
from core import redis_guard
from core.regions import redis_region

DUE_KEY = "chat:pending:due"


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
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    tool_calls: list[dict] | None = None,
) -> dict[str, Any]:
    """The record of an answer that finished now (tokens: counts; ``status``: Turn.Status;
    ``replaces_id``: the answer it regenerates; ``context_trimmed``: Turn.context_trimmed;
    ``pool`` / ``model_version`` / ``cached_tokens`` / ``cost_usd``: who answered and what it
    cost; ``moderation_verdict``: the output gate's; ``finish_reason``: why it ended;
    ``continues_id``: the cut-off answer it continues; ``ttft_ms`` / ``tpot_ms``: its
    latency, milliseconds; ``tool_calls``: the calls it made; Turn's fields of those names)."""
    turn = Turn(
        turn_id=turn_id, conversation_id=conversation_id, role=Turn.Role.ASSISTANT,
        content=content, status=status, token_count=completion_tokens,
        prompt_tokens=prompt_tokens, reply_to_id=reply_to_id, created_at=timezone.now(),
        replaces_id=replaces_id, context_trimmed=context_trimmed, pool=pool,
        model_version=model_version, cached_tokens=cached_tokens, cost_usd=cost_usd,
        moderation_verdict=moderation_verdict or {}, finish_reason=finish_reason,
        continues_id=continues_id, ttft_ms=ttft_ms, tpot_ms=tpot_ms, tool_calls=tool_calls or [],
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


def text_of(value: str | bytes) -> str:
    """A Redis reply as text (the sync client may return bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def hold(record: dict[str, Any], *, ttl_s: int, due: bool) -> None:
    """Hold ``record`` in Redis for ``ttl_s`` seconds (synchronous). ``due``: list it for the
    sweeper (answers awaiting write-back; never zero-retention turns). Raises RedisError
    (``redis_guard.RedisUnavailable``) when Redis is unreachable or known to be down."""

    def run(client):
        with client.pipeline(transaction=True) as pipe:
            _queue_hold(pipe, record, ttl_s=ttl_s, due=due)
            pipe.execute()

    redis_guard.call(PART, run, fallback=_FALLBACK, region=redis_region(record["conversation_id"]))


async def ahold(record: dict[str, Any], *, ttl_s: int, due: bool) -> None:
    """:func:`hold` for the event loop (the loop's asyncio client)."""

    async def run(client):
        async with client.pipeline(transaction=True) as pipe:
            _queue_hold(pipe, record, ttl_s=ttl_s, due=due)
            await pipe.execute()

    await redis_guard.acall(
        PART, run, fallback=_FALLBACK, region=redis_region(record["conversation_id"])
    )


def record_get(turn_id: UUID | str, *, region: str | None = None) -> dict[str, Any] | None:
    """The held record of ``turn_id`` on ``region``'s server (None: the region the turn id
    names, else the global server), or None (never held, written and released, or expired).
    Raises RedisError when Redis is unreachable (the task retries)."""
    raw = redis_guard.call(
        PART, lambda client: client.get(record_key(turn_id)),
        region=region or redis_region(turn_id),
    )  # fmt: skip
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

    redis_guard.call(PART, run, region=redis_region(conversation_id))


def held_turns(conversation_id: UUID | str) -> list[Turn]:
    """The conversation's turns held in Redis and not (yet) in PostgreSQL, oldest first, as
    unsaved :class:`Turn` objects: finished answers awaiting write-back, and every turn of a
    zero-retention conversation still within its TTL. Reads merge these (selectors.py) so an
    answer is visible from the moment its ``done`` event is sent. ``[]`` when Redis is down
    (reads then show what PostgreSQL has)."""

    def run(client) -> list:
        ids = sorted(text_of(i) for i in client.smembers(conversation_key(conversation_id)))
        if not ids:
            return []
        raws = client.mget([record_key(i) for i in ids])
        gone = [i for i, raw in zip(ids, raws, strict=True) if raw is None]
        if gone:  # released or expired: tidy the index
            client.srem(conversation_key(conversation_id), *gone)
        return [raw for raw in raws if raw is not None]

    raws = redis_guard.call(
        PART, run, default=[], fallback="reads show what PostgreSQL has",
        region=redis_region(conversation_id),
    )  # fmt: skip
    turns = [record_turn(json.loads(raw)) for raw in raws]
    turns.sort(key=lambda t: (t.created_at, str(t.turn_id)))
    return turns


def conversation_held_forget(conversation_id: UUID | str) -> None:
    """Drop every turn a (deleted or purged) conversation holds in Redis. Never raises for
    Redis errors: held records expire on their own, and a write-back of a conversation that is
    gone drops its record (conversations/writeback.py ``answer_write_back``)."""

    def run(client):
        ids = [text_of(i) for i in client.smembers(conversation_key(conversation_id))]
        with client.pipeline(transaction=True) as pipe:
            for turn_id in ids:
                pipe.delete(record_key(turn_id))
                pipe.zrem(DUE_KEY, turn_id)
            pipe.delete(conversation_key(conversation_id))
            pipe.execute()

    redis_guard.call(
        PART, run, default=None, fallback="held turns expire on their own",
        region=redis_region(conversation_id),
    )  # fmt: skip
