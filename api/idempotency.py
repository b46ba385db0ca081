"""``Idempotency-Key`` for ``POST /v1/conversations/{id}/turns``.

A client that retries a POST (a timeout, a double click) with the same key gets the same
turn's stream back: no second user turn, no second engine request. The record lives in Redis
under ``chat:idem:{user_id}:{sha256(key)}`` for ``settings.CHAT_IDEMPOTENCY_TTL_S`` (default
24 h, as Stripe keeps keys), holding a hash of the request so a key reused for a *different*
request is refused (422) instead of silently answering the wrong thing.

Redis down (degraded mode, core/redis_guard.py part ``idempotency``): records are kept in
this process instead (at most ``LOCAL_MAX`` keys, same TTL; counted in
``chat_idempotency_local_total``, the outage logged). A retry that reaches the same process is
still de-duplicated (and keys recorded during the outage keep working after it); a retry that
reaches another process while Redis is down is processed anew. Requests never fail because
Redis is down.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings

from core.errors import ApiError
from core import metrics
from core import redis_guard
from core.redis_guard import RedisUnavailable

logger = logging.getLogger(__name__)

MAX_KEY_LENGTH = 255
PENDING = "pending"
PART = "idempotency"
_FALLBACK = "Idempotency-Key records kept in this process only"
LOCAL_MAX = 10_000  # keys kept in-process while Redis is down (oldest dropped first)
_local: OrderedDict[str, tuple[float, dict]] = OrderedDict()  # redis key -> (expires, record)


def _local_get(redis_key: str) -> dict | None:
    item = _local.get(redis_key)
    if item is None:
        return None
    if item[0] < time.monotonic():
        del _local[redis_key]
        return None
    return item[1]


def _local_set(redis_key: str, record: dict) -> None:
    _local[redis_key] = (time.monotonic() + float(settings.CHAT_IDEMPOTENCY_TTL_S), record)
    _local.move_to_end(redis_key)
    while len(_local) > LOCAL_MAX:
        _local.popitem(last=False)


@dataclass(frozen=True)
class Replay:
    """A previous request with this key: its conversation and answer turn."""

    conversation_id: UUID
    answer_id: UUID


def _redis_key(user_id: int, key: str) -> str:
    return f"chat:idem:{user_id}:{hashlib.sha256(key.encode()).hexdigest()}"


def request_fingerprint(conversation_id: UUID, body: dict) -> str:
    """A hash of what the request asks for (conversation + JSON body, canonical)."""
    canonical = json.dumps({"c": str(conversation_id), "b": body}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def key_from_header(raw: str | None) -> str | None:
    """The header's key, or None. Raises ApiError 400 for an empty or over-long key."""
    if raw is None:
        return None
    key = raw.strip()
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ApiError(400, "invalid_request", f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} characters.")
    return key


def _decide(record: dict, fingerprint: str) -> Replay | None:
    """The replay a finished record names (None while pending); 422 for another request's key."""
    if record["fp"] != fingerprint:
        raise ApiError(
            422, "idempotency_key_reused",
            "This Idempotency-Key was already used for a different request.",
        )  # fmt: skip
    if record["state"] != PENDING:
        return Replay(UUID(record["conversation_id"]), UUID(record["answer_id"]))
    return None


async def claim(user_id: int, key: str, fingerprint: str) -> Replay | None:
    """Claim ``key`` for a new request (returns None: go ahead, then :func:`record`), or return
    the earlier request's turn to replay. Waits up to 10 s for a concurrent twin to record.
    Raises ApiError 422 if the key was used for a different request, 409 if the twin never
    recorded a turn. Falls back to this process's records while Redis is unavailable."""
    redis_key = _redis_key(user_id, key)
    ttl = int(settings.CHAT_IDEMPOTENCY_TTL_S)
    pending = json.dumps({"state": PENDING, "fp": fingerprint})
    for _ in range(100):
        local = _local_get(redis_key)  # a record made while Redis was down
        if local is not None:
            replay = _decide(local, fingerprint)
            if replay is not None:
                return replay
            await asyncio.sleep(0.1)
            continue
        try:
            claimed = await redis_guard.acall(
                PART, lambda r: r.set(redis_key, pending, nx=True, ex=ttl), fallback=_FALLBACK
            )
            if claimed:
                return None
            raw = await redis_guard.acall(PART, lambda r: r.get(redis_key), fallback=_FALLBACK)
        except RedisUnavailable:
            metrics.IDEMPOTENCY_LOCAL.inc()
            _local_set(redis_key, {"state": PENDING, "fp": fingerprint})
            return None
        if raw is None:  # the twin failed and released it: try to claim again
            continue
        replay = _decide(json.loads(raw), fingerprint)
        if replay is not None:
            return replay
        await asyncio.sleep(0.1)
    raise ApiError(409, "conflict", "A request with this Idempotency-Key is still being processed.")


async def record(user_id: int, key: str, fingerprint: str, conversation_id: UUID, answer_id: UUID) -> None:
    """Remember which turn answered the request made with ``key``."""
    value = {"state": "done", "fp": fingerprint, "conversation_id": str(conversation_id), "answer_id": str(answer_id)}
    redis_key = _redis_key(user_id, key)
    stored = await redis_guard.acall(
        PART,
        lambda r: r.set(redis_key, json.dumps(value), ex=int(settings.CHAT_IDEMPOTENCY_TTL_S)),
        default=None,
        fallback=_FALLBACK,
    )
    if stored is None or redis_key in _local:
        if stored is None:
            metrics.IDEMPOTENCY_LOCAL.inc()
        _local_set(redis_key, value)


async def release(user_id: int, key: str) -> None:
    """Forget a claim whose request failed (so a retry is processed afresh)."""
    redis_key = _redis_key(user_id, key)
    _local.pop(redis_key, None)
    await redis_guard.acall(PART, lambda r: r.delete(redis_key), default=None, fallback=_FALLBACK)
