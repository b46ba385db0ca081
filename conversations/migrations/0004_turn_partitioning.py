"""Partition the turn log by month on ``created_at`` (DESIGN.md, issue 4).

``conversations_turn`` becomes a PostgreSQL table ``PARTITION BY RANGE (created_at)`` with one
partition per calendar month (UTC), named ``conversations_turn_y2026m11``, plus a DEFAULT
partition (``conversations_turn_default``) so an insert never fails for want of a partition.
Partitions are created ahead by ``conversations.partitions.turn_partitions_ensure`` (daily beat
task, ``manage.py turn_partitions``); this migration creates the months that existing rows need
and the current month plus three ahead.

The key. The design brief declares ``PRIMARY KEY (conversation_id, turn_id)``. PostgreSQL
rejects that on a table partitioned by ``created_at``: a unique constraint (and so a primary key)
on a partitioned table must include every partition-key column, because uniqueness is enforced
by one index per partition. The database key is therefore ``PRIMARY KEY (turn_id, created_at)``:
it contains the partition key, its leading ``turn_id`` serves lookups by id (the index is probed
in each partition), and (turn_id alone being a random UUID) it is unique in practice. Django's
model keeps ``turn_id`` as its pk: Django 5.2 cannot point a ForeignKey at a model with a
``CompositePrimaryKey`` (nor register it in the admin), and turn-to-turn references already use
``db_constraint=False``. What the database no longer enforces is "no two rows with one turn_id";
writers that might retry (``services.turn_append_assistant``) check for the id under the
conversation's row lock instead (see its docstring and tests/test_partitions.py).

The foreign key ``conversation_id -> conversations_conversation`` is kept (PostgreSQL allows
foreign keys *from* a partitioned table). Index names stay the ones Django's migration state
knows, so later schema operations find them; the Django operations at the end swap the
``(conversation_id, created_at)`` index for ``(conversation_id, created_at, turn_id)``, the exact
order of keyset history pages.

How: the whole migration is one transaction (PostgreSQL DDL is transactional). The old table is
locked against writes, a partitioned twin is created with the partitions its rows need, the rows
are copied, the old table dropped and the twin renamed. Reversing does the same in the other
direction (back to a plain table keyed on ``turn_id``; fails, changing nothing, if two rows share
a ``turn_id``).
"""

from __future__ import annotations

import datetime as dt

from django.db import migrations, models
from django.utils import timezone

# Columns as of migration 0003, in their table order.
COLUMNS = (
    "turn_id", "role", "content", "token_count", "prompt_tokens", "status",
    "moderation_verdict", "created_at", "conversation_id", "reply_to_id", "context_trimmed",
    "replaces_id",
)  # fmt: skip
COLUMN_LIST = ", ".join(f'"{c}"' for c in COLUMNS)

COLUMN_DDL = """
    "turn_id" uuid NOT NULL,
    "role" varchar(16) NOT NULL,
    "content" text NOT NULL,
    "token_count" integer NOT NULL
        CONSTRAINT "conversations_turn_token_count_check" CHECK ("token_count" >= 0),
    "prompt_tokens" integer NULL
        CONSTRAINT "conversations_turn_prompt_tokens_check" CHECK ("prompt_tokens" >= 0),
    "status" varchar(16) NOT NULL,
    "moderation_verdict" jsonb NOT NULL,
    "created_at" timestamp with time zone NOT NULL,
    "conversation_id" uuid NOT NULL,
    "reply_to_id" uuid NULL,
    "context_trimmed" integer NOT NULL
        CONSTRAINT "conversations_turn_context_trimmed_check" CHECK ("context_trimmed" >= 0),
    "replaces_id" uuid NULL
"""

# The foreign key and the indexes of migration 0003's state, with Django's names.
KEYS_AND_INDEXES = """
ALTER TABLE "conversations_turn" ADD CONSTRAINT
    "conversations_turn_conversation_id_5017480b_fk_conversat" FOREIGN KEY ("conversation_id")
    REFERENCES "conversations_conversation" ("conversation_id") DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX "conversations_turn_created_at_3fdbe9eb" ON "conversations_turn" ("created_at");
CREATE INDEX "conversations_turn_conversation_id_5017480b" ON "conversations_turn" ("conversation_id");
CREATE INDEX "conversations_turn_reply_to_id_ecbf42a4" ON "conversations_turn" ("reply_to_id");
CREATE INDEX "conversations_turn_replaces_id_96d7419d" ON "conversations_turn" ("replaces_id");
CREATE INDEX "turn_conv_time" ON "conversations_turn" ("conversation_id", "created_at");
"""

CREATE_PARTITIONED = f"""
LOCK TABLE "conversations_turn" IN ACCESS EXCLUSIVE MODE;
CREATE TABLE "conversations_turn_partitioned" ({COLUMN_DDL}) PARTITION BY RANGE ("created_at");
CREATE TABLE "conversations_turn_default" PARTITION OF "conversations_turn_partitioned" DEFAULT;
"""

SWAP_IN_PARTITIONED = f"""
INSERT INTO "conversations_turn_partitioned" ({COLUMN_LIST})
    SELECT {COLUMN_LIST} FROM "conversations_turn";
DROP TABLE "conversations_turn";
ALTER TABLE "conversations_turn_partitioned" RENAME TO "conversations_turn";
-- A key on a partitioned table must contain the partition key (see the docstring).
ALTER TABLE "conversations_turn" ADD CONSTRAINT "conversations_turn_pkey"
    PRIMARY KEY ("turn_id", "created_at");
{KEYS_AND_INDEXES}
"""

SWAP_BACK_TO_PLAIN = f"""
LOCK TABLE "conversations_turn" IN ACCESS EXCLUSIVE MODE;
CREATE TABLE "conversations_turn_plain" ({COLUMN_DDL});
INSERT INTO "conversations_turn_plain" ({COLUMN_LIST})
    SELECT {COLUMN_LIST} FROM "conversations_turn";
DROP TABLE "conversations_turn";  -- with its partitions
ALTER TABLE "conversations_turn_plain" RENAME TO "conversations_turn";
ALTER TABLE "conversations_turn" ADD CONSTRAINT "conversations_turn_pkey" PRIMARY KEY ("turn_id");
{KEYS_AND_INDEXES}
"""

MONTHS_AHEAD = 3


def _month_start(moment: dt.datetime) -> dt.datetime:
    moment = moment.astimezone(dt.UTC)
    return dt.datetime(moment.year, moment.month, 1, tzinfo=dt.UTC)


def _next_month(start: dt.datetime) -> dt.datetime:
    return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)


def create_monthly_partitions(apps, schema_editor):
    """One partition per month from the oldest existing turn's month (or this month) to three
    months ahead, attached before the rows are copied so none lands in DEFAULT."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute('SELECT min("created_at") FROM "conversations_turn"')
        (oldest,) = cursor.fetchone()
        now = timezone.now()
        month = _month_start(min(oldest, now) if oldest else now)
        last = _month_start(now)
        for _ in range(MONTHS_AHEAD):
            last = _next_month(last)
        while month <= last:
            following = _next_month(month)
            cursor.execute(
                f'CREATE TABLE "conversations_turn_y{month.year:04d}m{month.month:02d}" '
                'PARTITION OF "conversations_turn_partitioned" '
                f"FOR VALUES FROM ('{month.isoformat()}') TO ('{following.isoformat()}')"
            )
            month = following


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0003_summary_versions_cross_db_refs"),
    ]

    operations = [
        migrations.RunSQL(
            CREATE_PARTITIONED,
            reverse_sql='DROP TABLE IF EXISTS "conversations_turn_partitioned"',
        ),
        migrations.RunPython(create_monthly_partitions, migrations.RunPython.noop),
        migrations.RunSQL(SWAP_IN_PARTITIONED, reverse_sql=SWAP_BACK_TO_PLAIN),
        # Keyset history pages order by (created_at, turn_id) within a conversation.
        migrations.RemoveIndex(model_name="turn", name="turn_conv_time"),
        migrations.AddIndex(
            model_name="turn",
            index=models.Index(
                fields=["conversation", "created_at", "turn_id"], name="turn_conv_keyset"
            ),
        ),
    ]
