"""The hot conversation cache: Redis ``conv:{conversation_id}`` (DESIGN.md, issue 4 "Hot cache").

One Redis hash per conversation holds its newest ``settings.CHAT_HOT_CACHE_TURNS`` turns (N,
default 50) and its running summary, and expires ``settings.CHAT_HOT_CACHE_TTL_S`` (24 h) after
it was last read or written:

- **promoted on read**: every read refreshes the TTL (HGETALL + EXPIRE in one round trip);
- **kept in step on write** (write-through): :func:`aturn_cached` when a user turn is stored and
  when an answer finishes, *before* the answer reaches PostgreSQL (the Celery write-back,
  conversations/writeback.py, may land later), so the next turn's prompt and the page see it at
  once; :func:`summary_set` when a running summary is stored. A write-through updates an entry
  only if one exists: entries are created only by reads (below), from PostgreSQL;
- **fall-through**: a missing (evicted, expired) or stale entry is read from PostgreSQL and the
  cache refilled (create-if-absent, so a slow reader never overwrites a newer entry).

Hash fields: ``v`` (entry format, derived from Turn's fields: a deploy that changes them
invalidates old entries), ``owner_id``, ``summary``, ``summary_through``, ``through`` (the entry
holds every turn written up to this moment, newest N of them), ``complete`` ("1": it holds every
turn of the conversation), and one field per turn, ``t:<created_at>|<turn_id>`` -> the turn's
JSON (every concrete field: conversations/turndata.py). Field names sort in the log's
(created_at, turn_id) order.

**Staleness.** While Redis is down, turns are written to PostgreSQL only; a Redis that comes back
with its data (a network partition, a restart from a snapshot) holds entries that missed them.
So an entry is used only if it is provably current: a reader holding the conversation's row
requires ``through >= Conversation.last_turn_at``; the prompt path requires the entry to hold
the question being answered; a write-through of a turn requires ``through >=`` the conversation's
last turn before it, and otherwise deletes the entry. Stale entries are deleted and refilled.
Answers held for write-back are merged into every read by the selectors (conversations/
selectors.py), from the cache or from PostgreSQL alike.

**Permissions.** The entry records its owner, but callers check access first against the
conversation row in PostgreSQL (``selectors.conversation_get_for_user``); the prompt path is
internal.

**Redis down (degraded mode).** Every call goes through core/redis_guard.py (short timeouts,
circuit breaker, ``chat_redis_unavailable_total{part="cache"}``, a log line per outage): reads
come from PostgreSQL (``chat_hot_cache_reads_total{result="down"}``), write-throughs are skipped.
When Redis is back, reads refill the cache again by themselves.

Zero-retention conversations (conversations/retention.py) are never cached: their turns may not
outlive ``settings.CHAT_ZDR_TTL_S``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

from django.conf import settings

from core import metrics
from conversations import partitions
from conversations.models import Conversation, Turn
from conversations.turndata import TURN_FIELDS, turn_dump, turn_load
from core import redis_guard, regions
from core.regions import redis_region

logger = logging.getLogger(__name__)

PART = "cache"
_FALLBACK = "hot cache skipped, history read from PostgreSQL"
TURN_PREFIX = "t:"

# The entry format: the cached turns' fields (conversations/turndata.py). A deploy that adds or
# renames a Turn field (or changes this layout: bump the suffix) makes older entries read as
# misses.
FORMAT = hashlib.sha1(",".join(f.attname for f in TURN_FIELDS).encode()).hexdigest()[:10] + ".1"


def cache_key(conversation_id: UUID | str) -> str:
    """The Redis key of a conversation's entry (DESIGN.md: ``conv:{id}``)."""
    return f"conv:{conversation_id}"


def iso(moment: datetime) -> str:
    """A timestamp as fixed-width ISO 8601 UTC with microseconds, so strings sort as times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


def turn_field(turn: Turn) -> str:
    """The hash field of a turn: ``t:<created_at>|<turn_id>`` (sorts in the log's order)."""
    return f"{TURN_PREFIX}{iso(turn.created_at)}|{turn.turn_id}"


@dataclass(frozen=True)
class History:
    """A conversation's newest turns and running summary, from the cache or from PostgreSQL.

    ``turns``: at most N (``settings.CHAT_HOT_CACHE_TURNS``), oldest first, unsaved Turn
    objects when cached. ``through``: every turn written up to this moment is either in ``turns``
    or older than all of them. ``complete``: ``turns`` is the whole conversation.
    ``source``: "cache" or "postgres". ``org_id``: the conversation's organisation, and
    ``temporary``: whether it is a temporary chat, when read from PostgreSQL (the cache does
    not keep them).
    """

    conversation_id: UUID
    owner_id: int
    summary: str
    summary_through: datetime | None
    through: datetime
    complete: bool
    turns: list[Turn] = field(default_factory=list)
    source: str = "cache"
    org_id: int | None = None
    temporary: bool = False

    def holds(self, turn_id: UUID) -> bool:
        """Whether turn ``turn_id`` is among ``turns``."""
        return any(t.turn_id == turn_id for t in self.turns)

    def covers_after(self, after: datetime | None) -> bool:
        """Whether every turn created after ``after`` (None: every turn) is in ``turns``."""
        if self.complete:
            return True
        return after is not None and bool(self.turns) and self.turns[0].created_at <= after

    def turns_after(self, after: datetime | None) -> list[Turn]:
        """The turns created after ``after`` (None: all held), oldest first."""
        return [t for t in self.turns if after is None or t.created_at > after]

    def newest(self, count: int) -> tuple[list[Turn], bool] | None:
        """The newest ``count`` turns, newest first, and whether older turns exist beyond them;
        None if this history cannot tell (it holds fewer than ``count`` of a longer log)."""
        if not self.complete and len(self.turns) < count:
            return None
        rows = self.turns[::-1][:count]
        return rows, (len(self.turns) > count or not self.complete)


# --- Lua (atomic per entry; no JSON decoding in Redis) ------------------------------------------

# KEYS[1] entry; ARGV[1] ttl; ARGV[2..] field, value pairs. Creates the entry only if absent.
_FILL = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS[1] entry; ARGV: format, after (the conversation's last turn before this one, "" for no
# check), field, turn json, turn id, created_at, max turns, ttl.
# Returns 1 updated, 0 no entry, -1 entry was stale (deleted).
_UPSERT = """
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return 0 end
local meta = redis.call('HMGET', key, 'v', 'through')
if meta[1] ~= ARGV[1] or not meta[2] or (ARGV[2] ~= '' and meta[2] < ARGV[2]) then
  redis.call('DEL', key)
  return -1
end
local suffix = '|' .. ARGV[5]
local turns = {}
for _, f in ipairs(redis.call('HKEYS', key)) do
  if string.sub(f, 1, 2) == 't:' then
    if string.sub(f, -string.len(suffix)) == suffix then
      redis.call('HDEL', key, f)
    else
      table.insert(turns, f)
    end
  end
end
redis.call('HSET', key, ARGV[3], ARGV[4])
table.insert(turns, ARGV[3])
local max = tonumber(ARGV[7])
if #turns > max then
  table.sort(turns)
  for i = 1, #turns - max do redis.call('HDEL', key, turns[i]) end
  redis.call('HSET', key, 'complete', '0')
end
if meta[2] < ARGV[6] then redis.call('HSET', key, 'through', ARGV[6]) end
redis.call('EXPIRE', key, ARGV[8])
return 1
"""

# KEYS[1] entry; ARGV: format, summary, summary_through, ttl. Returns 1 updated, 0 no entry.
_SUMMARY = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'summary', ARGV[2], 'summary_through', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


def _ttl() -> int:
    return int(settings.CHAT_HOT_CACHE_TTL_S)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry_history(conversation_id: UUID, entry: dict) -> History | None:
    """A History from HGETALL's reply (bytes or str), or None if absent or of another format."""
    if not entry:
        return None
    fields = {_text(k): v for k, v in entry.items()}
    if _text(fields.get("v", b"")) != FORMAT or "through" not in fields:
        return None
    names = sorted(name for name in fields if name.startswith(TURN_PREFIX))
    summary_through = _text(fields.get("summary_through", b""))
    return History(
        conversation_id=conversation_id,
        owner_id=int(_text(fields.get("owner_id", b"0"))),
        summary=_text(fields.get("summary", b"")),
        summary_through=_parse_iso(summary_through) if summary_through else None,
        through=_parse_iso(_text(fields["through"])),
        complete=_text(fields.get("complete", b"0")) == "1",
        turns=[turn_load(fields[name]) for name in names],
        source="cache",
    )


def _entry_fields(history: History) -> list[str]:
    """HSET field/value pairs (flat) for a history."""
    pairs = [
        "v", FORMAT,
        "owner_id", str(history.owner_id),
        "summary", history.summary,
        "summary_through", iso(history.summary_through) if history.summary_through else "",
        "through", iso(history.through),
        "complete", "1" if history.complete else "0",
    ]  # fmt: skip
    for turn in history.turns:
        pairs += [turn_field(turn), turn_dump(turn)]
    return pairs


# --- reads --------------------------------------------------------------------------------------

_DOWN = object()


def _read(conversation_id: UUID):
    key = cache_key(conversation_id)

    def read(client):
        with client.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.expire(key, _ttl())
            entry, _ = pipe.execute()
        return entry

    entry = redis_guard.call(
        PART, read, default=_DOWN, fallback=_FALLBACK, region=redis_region(conversation_id)
    )
    if entry is _DOWN:
        return _DOWN
    try:
        return _entry_history(conversation_id, entry)
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("unreadable hot cache entry of %s (%s): dropped", conversation_id, exc)
        _drop(conversation_id)
        return None


@regions.routed  # the conversation region's database (core/regions.py)
def history_load(conversation_id: UUID) -> History | None:
    """A conversation's History from PostgreSQL (its newest N turns): None if the conversation
    does not exist. Does not touch Redis. ``CHAT_HOT_CACHE_TURNS = 0`` (the cache off): no turn
    is read and the History is marked partial, so every caller reads the turns itself."""
    conversation = (
        Conversation.objects.filter(pk=conversation_id)
        .only(
            "owner_id",
            "org_id",
            "temporary",
            "summary",
            "summary_through",
            "created_at",
            "last_turn_at",
        )
        .first()
    )
    if conversation is None:
        return None
    # The row first, then the turns: ``through`` may understate what the turns hold, never
    # overstate it (a turn appended in between is simply also there, or left out by the bound
    # below and then newer than ``through``).
    limit = int(settings.CHAT_HOT_CACHE_TURNS)
    rows: list[Turn] = []
    if limit > 0:
        # Bounded by the conversation's lifetime, as page_selectors.turn_page is, so PostgreSQL
        # prunes the monthly partitions the conversation does not span.
        rows = list(
            Turn.objects.filter(
                conversation_id=conversation_id,
                created_at__range=partitions.turn_created_range(
                    created_at=conversation.created_at, last_turn_at=conversation.last_turn_at
                ),
            ).order_by("-created_at", "-turn_id")[: limit + 1]
        )
    turns = rows[:limit][::-1]
    through = conversation.last_turn_at
    if turns and turns[-1].created_at > through:
        through = turns[-1].created_at
    return History(
        conversation_id=conversation_id,
        owner_id=conversation.owner_id,
        summary=conversation.summary,
        summary_through=conversation.summary_through,
        through=through,
        complete=limit > 0 and len(rows) <= limit,
        turns=turns,
        source="postgres",
        org_id=conversation.org_id,
        temporary=conversation.temporary,
    )


def _refill(history: History) -> None:
    """Create the entry from ``history`` unless one exists (a newer writer's wins). A
    zero-retention conversation's never is (selectors.conversation_zero_retention's two cases,
    read here without importing the selectors): its turns may not outlive CHAT_ZDR_TTL_S."""
    if history.temporary:
        return
    if history.org_id is not None:
        from accounts.models import Organisation  # noqa: PLC0415

        if Organisation.objects.filter(pk=history.org_id, zero_retention=True).exists():
            return  # never cached: its turns may not outlive CHAT_ZDR_TTL_S
    args = [str(_ttl()), *_entry_fields(history)]
    redis_guard.call(
        PART,
        lambda r: r.eval(_FILL, 1, cache_key(history.conversation_id), *args),
        default=None,
        fallback=_FALLBACK,
        region=redis_region(history.conversation_id),
    )


def _drop(conversation_id: UUID) -> None:
    redis_guard.call(
        PART, lambda r: r.delete(cache_key(conversation_id)), default=None, fallback=_FALLBACK,
        region=redis_region(conversation_id),
    )  # fmt: skip


def history(
    conversation_id: UUID,
    *,
    last_turn_at: datetime | None = None,
    holding: UUID | None = None,
) -> History | None:
    """A conversation's newest turns and summary: from the cache when it is current, else from
    PostgreSQL (refilling the cache). None if the conversation does not exist.

    Current means: ``through >= last_turn_at`` (pass the conversation row's ``last_turn_at``
    when you have it) and, if ``holding`` is given, the entry holds that turn (the question a
    prompt is built for). A stale entry is deleted. Counted in ``chat_hot_cache_reads_total``.
    Callers check the user's access first (module docstring).
    """
    if int(settings.CHAT_HOT_CACHE_TURNS) <= 0:
        return history_load(conversation_id)  # the cache is off
    found = _read(conversation_id)
    if found is _DOWN:
        metrics.HOT_CACHE_READS.labels(result="down").inc()
        return history_load(conversation_id)
    if found is not None:
        stale = (last_turn_at is not None and found.through < last_turn_at) or (
            holding is not None and not found.holds(holding)
        )
        if not stale:
            metrics.HOT_CACHE_READS.labels(result="hit").inc()
            return found
        metrics.HOT_CACHE_READS.labels(result="stale").inc()
        _drop(conversation_id)
    else:
        metrics.HOT_CACHE_READS.labels(result="miss").inc()
    loaded = history_load(conversation_id)
    if loaded is not None:
        _refill(loaded)
    return loaded


# --- writes -------------------------------------------------------------------------------------


def _upsert_args(turn: Turn, after: datetime | None) -> list[str]:
    return [
        FORMAT,
        iso(after) if after is not None else "",
        turn_field(turn),
        turn_dump(turn),
        str(turn.turn_id),
        iso(turn.created_at),
        str(int(settings.CHAT_HOT_CACHE_TURNS)),
        str(_ttl()),
    ]


async def aturn_cached(turn: Turn, *, after: datetime | None) -> int | None:
    """Write-through: put ``turn`` (new, or a new state of a cached turn: same ``turn_id``) into
    its conversation's entry, if there is one, trimming the entry to the newest N turns.

    ``after``: the conversation's last turn time before ``turn`` was appended (for an answer:
    its question's ``created_at``); if the entry is not complete up to it, the entry is stale
    and is deleted instead. Returns 1 (updated), 0 (no entry: the next read fills it from
    PostgreSQL), -1 (stale, deleted) or None (Redis unavailable: skipped, logged, counted).
    Never raises for Redis errors.
    """
    key = cache_key(turn.conversation_id)
    region = redis_region(turn.conversation_id)
    try:
        args = _upsert_args(turn, after)
        return await redis_guard.acall(
            PART, lambda r: r.eval(_UPSERT, 1, key, *args), default=None, fallback=_FALLBACK,
            region=region,
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - a cache must never fail the turn that writes through
        logger.exception("hot cache write-through of turn %s failed", turn.turn_id)
        await redis_guard.acall(PART, lambda r: r.delete(key), default=None, region=region)
        return None


def summary_set(
    *, conversation_id: UUID, summary: str, summary_through: datetime | None
) -> int | None:
    """Write-through of a stored running summary (call after it is committed to PostgreSQL).
    Returns 1 (updated), 0 (no entry) or None (Redis unavailable). Never raises for Redis
    errors. A summary missed while Redis was down only makes prompts longer: the entry's older
    summary still covers what it says it covers."""
    args = [FORMAT, summary, iso(summary_through) if summary_through else "", str(_ttl())]
    return redis_guard.call(
        PART,
        lambda r: r.eval(_SUMMARY, 1, cache_key(conversation_id), *args),
        default=None,
        fallback=_FALLBACK,
        region=redis_region(conversation_id),
    )


def forget(conversation_id: UUID) -> None:
    """Delete a conversation's entry (the conversation was deleted or purged). Never raises for
    Redis errors; an entry left behind expires within ``CHAT_HOT_CACHE_TTL_S`` and is never read
    (every read path checks the conversation row first)."""
    _drop(conversation_id)
