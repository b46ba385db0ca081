"""Monthly partitions of the turn log (``conversations_turn``, partitioned by RANGE on
``created_at`` in migration 0004).

Each calendar month (UTC) has a partition ``conversations_turn_y2026m11`` covering
``[2026-11-01 00:00 UTC, 2026-12-01 00:00 UTC)``; a DEFAULT partition catches any row whose
month has none yet, so an insert never fails. :func:`turn_partitions_ensure` creates the coming
months ahead of time (daily Celery beat task ``conversations.turn_partitions_ensure``, and
``manage.py turn_partitions``).
"""

from __future__ import annotations

import datetime as dt
import logging

from celery import shared_task
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from core import regions

logger = logging.getLogger(__name__)

PARENT = "conversations_turn"
DEFAULT_PARTITION = "conversations_turn_default"
# Serialises concurrent runs (two beat schedulers, a command during the task): the key is any
# constant bigint; this one spells "turnpart".
ADVISORY_LOCK_KEY = 0x7475726E70617274
# How long one partition's creation waits for the table lock before giving up (a retry comes
# with the next run): a queued ACCESS EXCLUSIVE request would otherwise stall every reader.
LOCK_TIMEOUT = "10s"


# Clock skew allowed between the servers that write a conversation and its turns: a turn's
# created_at may precede its conversation's created_at (or exceed the last_turn_at another
# server wrote) by at most this much.
TURN_TIME_MARGIN = dt.timedelta(minutes=5)


def turn_created_range(
    *, created_at: dt.datetime, last_turn_at: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """(lowest, highest) ``created_at`` a stored turn of a conversation can have, given the
    conversation's ``created_at`` and a ``last_turn_at`` read from its row: every append raises
    last_turn_at to at least the new turn's created_at under the conversation's row lock
    (services.py; tests/test_partitions.py checks it), widened by TURN_TIME_MARGIN.

    Filtering turns by ``created_at__range`` of this lets PostgreSQL prune every monthly
    partition outside the conversation's lifetime, DEFAULT included, when planning. A turn
    appended after ``last_turn_at`` was read is outside the range: read the row first and treat
    the result as of that moment."""
    return created_at - TURN_TIME_MARGIN, last_turn_at + TURN_TIME_MARGIN


def month_start(moment: dt.datetime) -> dt.datetime:
    """The first instant (UTC) of the calendar month containing ``moment`` (aware datetime)."""
    moment = moment.astimezone(dt.UTC)
    return dt.datetime(moment.year, moment.month, 1, tzinfo=dt.UTC)


def month_add(start: dt.datetime, months: int) -> dt.datetime:
    """The first instant of the month ``months`` after the month starting at ``start``."""
    index = start.year * 12 + (start.month - 1) + months
    return dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)


def partition_name(start: dt.datetime) -> str:
    """``conversations_turn_y2026m11`` for the month starting at ``start``."""
    return f"{PARENT}_y{start.year:04d}m{start.month:02d}"


def turn_partitions_list(*, using: str = "default") -> list[str]:
    """Names of the turn log's partitions (monthly ones and DEFAULT), sorted."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
            [PARENT],
        )
        return [name for (name,) in cursor.fetchall()]


def turn_partitions_ensure(
    *, months_ahead: int = 3, now: dt.datetime | None = None, using: str = "default"
) -> list[str]:
    """Create the monthly partitions of the turn log that are missing, from the month of
    ``now`` (default: the current time) to ``months_ahead`` months after it; return the names
    created (oldest first; empty when all existed). Idempotent; safe to run concurrently.

    Rows that the DEFAULT partition holds for a new partition's month (written while that month
    had no partition) are moved into it in the same transaction: PostgreSQL refuses to create
    a partition whose range overlaps rows in DEFAULT. Each partition is created in its own
    transaction, under the table's ACCESS EXCLUSIVE lock (taken first, so writers cannot
    deadlock with the lock upgrade; held for milliseconds when nothing moves).

    Raises ValueError if ``months_ahead`` is negative; database errors (e.g. a lock wait over
    ``LOCK_TIMEOUT``) propagate after the partitions created so far are committed.
    """
    if months_ahead < 0:
        raise ValueError("months_ahead must be >= 0")
    first = month_start(now or timezone.now())
    created = []
    for offset in range(months_ahead + 1):
        start = month_add(first, offset)
        if _partition_create(start, month_add(start, 1), using=using):
            created.append(partition_name(start))
    if created:
        logger.info("turn log partitions created: %s", ", ".join(created))
    return created


def _partition_create(start: dt.datetime, end: dt.datetime, *, using: str) -> bool:
    """Create the partition for [start, end) unless it exists; True if it was created."""
    name = partition_name(start)
    connection = connections[using]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        if cursor.fetchone()[0]:
            return False
        quote = connection.ops.quote_name
        parent, default, table = quote(PARENT), quote(DEFAULT_PARTITION), quote(name)
        bounds = f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"LOCK TABLE {parent} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {default} WHERE created_at >= %s AND created_at < %s)",
            [start, end],
        )
        if not cursor.fetchone()[0]:
            cursor.execute(f"CREATE TABLE {table} PARTITION OF {parent} {bounds}")
            return True
        # Move the month's rows out of DEFAULT into a new table, then attach it: ATTACH checks
        # that DEFAULT no longer holds rows of the range and builds the parent's indexes, foreign
        # key and checks on the new partition.
        columns = ", ".join(
            quote(c.name) for c in connection.introspection.get_table_description(cursor, PARENT)
        )
        cursor.execute(
            f"CREATE TABLE {table} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute(
            f"WITH moved AS (DELETE FROM {default} WHERE created_at >= %s AND created_at < %s "
            f"RETURNING {columns}) INSERT INTO {table} ({columns}) SELECT {columns} FROM moved",
            [start, end],
        )
        logger.info("moved %d turns from %s into %s", cursor.rowcount, DEFAULT_PARTITION, name)
        cursor.execute(f"ALTER TABLE {parent} ATTACH PARTITION {table} {bounds}")
        return True


def turn_log_databases() -> list[str]:
    """The database aliases that hold a turn log: every region's primary (replicas follow
    their primary), ``["default"]`` in a single-region deployment (core/regions.py)."""
    return regions.region_dbs()


@shared_task(name="conversations.turn_partitions_ensure")
def turn_partitions_ensure_task(months_ahead: int | None = None) -> dict[str, list[str]]:
    """Celery beat task (daily, settings.CELERY_BEAT_SCHEDULE): create the turn log's coming
    monthly partitions in every region's database, ``months_ahead`` (default
    ``settings.CHAT_TURN_PARTITIONS_AHEAD``) months ahead. Returns {alias: names created}.
    Idempotent, so a redelivered message is harmless."""
    ahead = settings.CHAT_TURN_PARTITIONS_AHEAD if months_ahead is None else months_ahead
    return {
        alias: turn_partitions_ensure(months_ahead=ahead, using=alias)
        for alias in turn_log_databases()
    }
