"""Writes for usage: the one record per turn of what it used and cost."""

from __future__ import annotations

import hashlib
import hmac
import logging
from decimal import Decimal
from typing import TYPE_CHECKING
from uuid import UUID

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction

from core import metrics, regions
from usage.models import UsageRecord

if TYPE_CHECKING:  # inference.pools imports settings-heavy code; only its types are needed here
    from accounts.models import Organisation, User
    from inference.pools import Pool

logger = logging.getLogger(__name__)


def _pk(value) -> int | None:
    """A model instance's pk, an int as is, None as is."""
    if value is None or isinstance(value, int):
        return value
    return value.pk


@transaction.atomic
def zero_retention_key(turn_id: UUID) -> UUID:
    """The ledger's key for a zero-retention turn: the first 16 bytes of
    HMAC-SHA256(``settings.SECRET_KEY``, the turn id's bytes) as a UUID. The same turn always
    gives the same key (a retried settle is not charged twice, PF-R5), and the turn id cannot
    be read back from it without the secret."""
    digest = hmac.new(settings.SECRET_KEY.encode(), UUID(str(turn_id)).bytes, hashlib.sha256)
    return UUID(bytes=digest.digest()[:16])


def usage_record(
    *,
    user: User | int | None,
    org: Organisation | int | None,
    turn_id: UUID | None,
    conversation_id: UUID | None,
    route_pool: Pool,
    tier: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    status: str,
    zero_retention: bool = False,
) -> UsageRecord:
    """Store what one turn used and cost, once (PF-R5).

    - ``user`` / ``org``: who is charged: instances or primary keys (None: nobody, e.g. the
      service credential; no organisation).
    - ``turn_id`` / ``conversation_id``: the answering turn and its conversation (UUIDs, no
      foreign key: they live in a regional database); None for a /v1 completion that stores no
      turn.
    - ``route_pool``: the pool that answered (``Route.pool`` after shedding: a degraded paid
      turn is charged at ``mini``'s prices); its ``name`` and ``version`` are stored.
    - ``tier``: the user's tier at the time of the turn.
    - ``prompt_tokens``: the whole prompt prefilled, including ``cached_tokens`` (served from
      the prefix cache); ``completion_tokens``: tokens actually generated, also when the turn was
      cancelled or failed part way.
    - ``status``: ``UsageRecord.Status`` value ("complete", "cancelled", "failed", "blocked").
    - ``zero_retention``: the turn is a zero-retention conversation's (kept nowhere at rest,
      issue 4; "leaves nothing at rest anywhere after the TTL", issue 20). The row is still
      written (what was used is charged), but its ``turn_id`` is :func:`zero_retention_key` of
      the turn's id, an opaque key that keeps the once-per-turn rule and names no turn.

    A withdrawn answer (``status`` "blocked": the output gate stopped it) is not charged: its
    row has ``cost_usd`` 0 and the cost in ``operator_cost_usd``, and its tokens and cost are
    counted in ``chat_moderation_withdrawn_tokens_total`` / ``..._cost_usd_total`` (issue 28).

    Cost (USD) is ``route_pool.charge(...)`` (inference/pools.py, the one cost function:
    uncached prompt tokens at the input price, cached at the cached-input price, completion at
    the output price, prices per 1M tokens, rounded half-up to 8 decimal places).

    Idempotent on ``turn_id``: a second call for a turn already recorded (a retried write-back)
    returns the first record unchanged and charges nothing more. Returns the record. Stored in
    ``conversation_id``'s region's database (its ids stay in the region), else in ``default``.
    Raises ValueError for a negative token count, an unknown status, or more cached than prompt
    tokens (the serving layer clamps what an engine reports before anything is tallied).
    """
    for name, value in (
        ("prompt_tokens", prompt_tokens),
        ("cached_tokens", cached_tokens),
        ("completion_tokens", completion_tokens),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"usage_record: {name} must be a non-negative integer, got {value!r}")
    if status not in UsageRecord.Status.values:
        raise ValueError(
            f"usage_record: status must be one of {UsageRecord.Status.values}, got {status!r}"
        )
    cost = route_pool.charge(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
    )
    # A withdrawn answer is the operator's cost, not the user's (issue 28).
    withdrawn = status == UsageRecord.Status.BLOCKED
    fields = {
        "user_id": _pk(user),
        "org_id": _pk(org),
        "conversation_id": conversation_id,
        "pool": route_pool.name,
        "model_version": route_pool.version,
        "tier": tier,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
        "cost_usd": Decimal(0) if withdrawn else cost,
        "operator_cost_usd": cost if withdrawn else Decimal(0),
        "status": status,
    }
    db = (
        regions.db_for_conversation_id(conversation_id)
        if conversation_id is not None
        else DEFAULT_DB_ALIAS
    )
    ledger = UsageRecord.objects.using(db)
    if turn_id is not None and zero_retention:
        turn_id = zero_retention_key(turn_id)
    if turn_id is None:
        record, created = ledger.create(turn_id=None, **fields), True
    else:
        record, created = ledger.get_or_create(turn_id=turn_id, defaults=fields)
    if not created:
        logger.info("usage_record: turn %s was already recorded; not charged again", turn_id)
    elif withdrawn:
        transaction.on_commit(lambda: _withdrawn_counted(route_pool.name, prompt_tokens, completion_tokens, cost),
                              using=db)
    return record


def _withdrawn_counted(pool: str, prompt_tokens: int, completion_tokens: int, cost: Decimal) -> None:
    """Count a withdrawn answer's tokens and cost as the operator's (core/metrics.py)."""
    metrics.MODERATION_WITHDRAWN_TOKENS.labels(pool=pool, kind="prompt").inc(prompt_tokens)
    metrics.MODERATION_WITHDRAWN_TOKENS.labels(pool=pool, kind="completion").inc(completion_tokens)
    metrics.MODERATION_WITHDRAWN_COST.labels(pool=pool).inc(float(cost))
