"""``Idempotency-Key`` for ``POST /v1/conversations/{id}/turns``.

A client that retries a POST (a timeout, a double click) with the same key gets the same
turn's stream back: no second user turn, no second engine request. The record lives in Redis
under ``chat:idem:{user_id}:{sha256(key)}`` for ``settings.CHAT_IDEMPOTENCY_TTL_S`` (default
24 h, as Stripe keeps keys), holding a hash of the request so a key reused for a *different*
request is refused (422) instead of silently answering the wrong thing. If Redis is down the
header is ignored (logged): requests still work, retries are not de-duplicated.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from redis.exceptions import RedisError

from api.errors import ApiError
from conversations.turnlog import redis_client

logger = logging.getLogger(__name__)

MAX_KEY_LENGTH = 255
PENDING = "pending"


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


async def claim(user_id: int, key: str, fingerprint: str) -> Replay | None:
    """Claim ``key`` for a new request (returns None: go ahead, then :func:`record`), or return
    the earlier request's turn to replay. Waits up to 10 s for a concurrent twin to record.
    Raises ApiError 422 if the key was used for a different request, 409 if the twin never
    recorded a turn."""
    redis_key = _redis_key(user_id, key)
    ttl = int(settings.CHAT_IDEMPOTENCY_TTL_S)
    client = redis_client()
    try:
        claimed = await client.set(
            redis_key, json.dumps({"state": PENDING, "fp": fingerprint}), nx=True, ex=ttl
        )
        if claimed:
            return None
        for _ in range(100):
            raw = await client.get(redis_key)
            if raw is None:  # the twin failed and released it
                if await client.set(redis_key, json.dumps({"state": PENDING, "fp": fingerprint}), nx=True, ex=ttl):
                    return None
                continue
            record = json.loads(raw)
            if record["fp"] != fingerprint:
                raise ApiError(
                    422, "idempotency_key_reused",
                    "This Idempotency-Key was already used for a different request.",
                )  # fmt: skip
            if record["state"] != PENDING:
                return Replay(UUID(record["conversation_id"]), UUID(record["answer_id"]))
            await asyncio.sleep(0.1)
    except (RedisError, OSError) as exc:
        logger.warning("Redis unavailable (%s): Idempotency-Key ignored", exc)
        return None
    raise ApiError(409, "conflict", "A request with this Idempotency-Key is still being processed.")


async def record(user_id: int, key: str, fingerprint: str, conversation_id: UUID, answer_id: UUID) -> None:
    """Remember which turn answered the request made with ``key``."""
    value = {"state": "done", "fp": fingerprint, "conversation_id": str(conversation_id), "answer_id": str(answer_id)}
    try:
        await redis_client().set(
            _redis_key(user_id, key), json.dumps(value), ex=int(settings.CHAT_IDEMPOTENCY_TTL_S)
        )
    except (RedisError, OSError) as exc:
        logger.warning("Redis unavailable (%s): Idempotency-Key not recorded", exc)


async def release(user_id: int, key: str) -> None:
    """Forget a claim whose request failed (so a retry is processed afresh)."""
    try:
        await redis_client().delete(_redis_key(user_id, key))
    except (RedisError, OSError):
        pass
