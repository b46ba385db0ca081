"""Backups: scripts/backup.sh dumps each database with pg_dump (custom format) and
scripts/restore.sh restores a dump into an empty database of another, empty cluster.

The round trip is checked on the real schema (the test database, migrated) holding
conversations whose turns sit in several monthly partitions of the turn log and in its DEFAULT
partition: after the restore every turn is back, in the same partition, with the same content,
and the schema (partitions and their bounds, indexes, constraints) is the same. The target is
a fresh PostgreSQL 16 cluster (tests/pgcluster.py) with the pgserver wheel's binaries.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from conversations import services
from conversations.models import Turn
from conversations.partitions import DEFAULT_PARTITION, partition_name, turn_partitions_ensure
from tests.pgcluster import clusters, pg_bin
from tests.processes import database_url

pytestmark = pytest.mark.django_db(transaction=True)  # pg_dump sees committed rows only

ROOT = Path(__file__).resolve().parents[1]
UTC = dt.UTC
PAST_MONTHS = [dt.datetime(2025, m, 1, tzinfo=UTC) for m in (1, 2, 3)]

TURNS_SQL = (
    "SELECT tableoid::regclass::text, turn_id::text, conversation_id::text, role, content, status,"
    " created_at AT TIME ZONE 'UTC' FROM conversations_turn ORDER BY created_at, turn_id"
)
PARTITIONS_SQL = (
    "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
    " JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = 'conversations_turn'::regclass ORDER BY c.relname"
)


def script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run scripts/<name> with the pgserver wheel's PostgreSQL 16 binaries (the test servers'
    version; the system's pg_dump may be older)."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *args],
        env={**os.environ, "PG_BIN": str(pg_bin()), **(env or {})},
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def source_rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [tuple(row) for row in cursor.fetchall()]


SCHEMA_SQL = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
    " WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
    " ORDER BY tablename, indexname",
    "constraints": "SELECT conrelid::regclass::text, conname, contype FROM pg_constraint"
    " WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2",
    "extensions": "SELECT extname FROM pg_extension ORDER BY 1",
}


@pytest.fixture
def turn_log(make_user):
    """Conversations of two users whose turns lie in three past monthly partitions (created
    here, dropped afterwards), in this month's partition and in DEFAULT (a month without one)."""
    created = turn_partitions_ensure(months_ahead=2, now=PAST_MONTHS[0])
    alice, bob = make_user("alice-backup"), make_user("bob-backup")
    first = services.conversation_create(owner=alice, title="Lighthouse notes")
    second = services.conversation_create(owner=bob, title="Ünïcödé & quotes")
    texts = [
        "plain words",
        "line one\nline two\n\ttabbed — em dash, emoji 🚀, quote ' and \" and backslash \\",
        "```python\nprint('code block')\n```",
        "long " * 3000,
        "",
    ]
    moments = [
        *(month + dt.timedelta(days=9, hours=h) for month in PAST_MONTHS for h in (1, 2)),
        dt.datetime(2019, 6, 1, 12, tzinfo=UTC),  # no partition: DEFAULT
        timezone.now() - dt.timedelta(seconds=5),  # this month's partition
    ]
    for i, moment in enumerate(moments):
        conversation = (first, second)[i % 2]
        role = (Turn.Role.USER, Turn.Role.ASSISTANT)[i % 2]
        Turn.objects.create(
            conversation=conversation, role=role, content=texts[i % len(texts)], created_at=moment,
            status=(Turn.Status.COMPLETE, Turn.Status.CANCELLED)[i % 3 == 2],
        )  # fmt: skip
    services.turn_append_user(conversation=first, content="asked just now, through the service")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM conversations_turn")
        for name in created:
            cursor.execute(f'DROP TABLE IF EXISTS "{name}"')


def test_a_dump_restored_into_an_empty_cluster_has_every_turn_in_its_partition(turn_log, tmp_path):
    """Given conversations with turns spread over monthly partitions and DEFAULT; when the
    database is dumped with backup.sh and restored with restore.sh into an empty database of
    a new cluster; then every turn is there (same count, same contents, same partition), the
    turn log is still partitioned with the same partitions and bounds, and the schema (columns,
    indexes, keys and constraints, extensions) is the same."""
    before = source_rows(TURNS_SQL)
    partitions = source_rows(PARTITIONS_SQL)
    homes = {row[0] for row in before}
    assert {partition_name(m) for m in PAST_MONTHS} | {DEFAULT_PARTITION} <= homes  # the setup
    source = database_url()

    backup = script("backup.sh", "-o", str(tmp_path / "dumps"), f"default={source}")
    assert backup.returncode == 0, backup.stderr
    dump = tmp_path / "dumps" / "default.dump"
    assert dump.read_bytes()[:5] == b"PGDMP"  # pg_dump's custom format
    assert "default.dump" in (tmp_path / "dumps" / "SHA256SUMS").read_text()

    with clusters() as made:
        target = made.primary("restored", databases=("chat",))
        assert target.query("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]

        restore = script("restore.sh", str(dump), target.url())
        assert restore.returncode == 0, restore.stderr

        after = [tuple(row) for row in target.query(TURNS_SQL)]
        assert len(after) == len(before) == 9
        assert after == before
        assert [tuple(r) for r in target.query(PARTITIONS_SQL)] == partitions
        assert target.query(
            "SELECT relkind FROM pg_class WHERE oid = 'conversations_turn'::regclass"
        ) == [("p",)]
        for what, sql in SCHEMA_SQL.items():
            assert [tuple(r) for r in target.query(sql)] == source_rows(sql), what


def test_backup_without_arguments_dumps_the_default_and_every_region_primary(tmp_path):
    """Given DATABASE_URL and CHAT_REGION_DATABASE_URLS (a region with a primary and a replica
    URL); when backup.sh runs with no database arguments; then it writes one dump for default
    and one for the region's primary (the replica is not dumped), each restorable on its own."""
    with clusters() as made:
        source = made.primary("source", databases=("chat", "chat_us"))
        source.query("CREATE TABLE note (body text)")
        source.query("INSERT INTO note VALUES ('global')")
        source.query("CREATE TABLE note (body text)", dbname="chat_us")
        source.query("INSERT INTO note VALUES ('us-east 1'), ('us-east 2')", dbname="chat_us")
        env = {
            "DATABASE_URL": source.url("chat"),
            "CHAT_REGION_DATABASE_URLS": (
                f'{{"us-east": ["{source.url("chat_us")}", "postgresql://nobody@127.0.0.1:1/replica"]}}'
            ),
        }
        backup = script("backup.sh", "-o", str(tmp_path / "all"), env=env)
        assert backup.returncode == 0, backup.stderr
        assert sorted(p.name for p in (tmp_path / "all").glob("*.dump")) == [
            "default.dump",
            "region_us-east.dump",
        ]

        target = made.primary("target", databases=("chat", "chat_us"))
        for name, dbname in (("default", "chat"), ("region_us-east", "chat_us")):
            restored = script("restore.sh", str(tmp_path / "all" / f"{name}.dump"), target.url(dbname))
            assert restored.returncode == 0, restored.stderr
        assert target.query("SELECT body FROM note") == [("global",)]
        assert target.query("SELECT body FROM note ORDER BY body", dbname="chat_us") == [
            ("us-east 1",),
            ("us-east 2",),
        ]


def test_restore_refuses_a_database_that_is_not_empty(tmp_path):
    """Given a target database that already holds a table; when a dump is restored into it;
    then restore.sh refuses with a message and leaves the database as it was."""
    with clusters() as made:
        source = made.primary("source")
        source.query("CREATE TABLE note (body text)")
        source.query("INSERT INTO note VALUES ('from the dump')")
        assert script("backup.sh", "-o", str(tmp_path), f"chat={source.url()}").returncode == 0
        target = made.primary("target")
        target.query("CREATE TABLE live (body text)")
        target.query("INSERT INTO live VALUES ('live data')")

        restore = script("restore.sh", str(tmp_path / "chat.dump"), target.url())

        assert restore.returncode != 0
        assert "not empty" in restore.stderr
        assert target.query("SELECT body FROM live") == [("live data",)]
        assert target.query("SELECT to_regclass('note')") == [(None,)]


def test_restore_refuses_a_damaged_dump(tmp_path):
    """A dump whose bytes no longer match SHA256SUMS is refused before anything is restored."""
    with clusters() as made:
        source = made.primary("source")
        source.query("CREATE TABLE note (body text)")
        assert script("backup.sh", "-o", str(tmp_path), f"chat={source.url()}").returncode == 0
        dump = tmp_path / "chat.dump"
        data = bytearray(dump.read_bytes())
        data[-10] ^= 0xFF
        dump.write_bytes(bytes(data))
        target = made.primary("target")

        restore = script("restore.sh", str(dump), target.url())

        assert restore.returncode != 0
        assert "does not match its checksum" in restore.stderr
        assert target.query("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


def test_a_failed_dump_leaves_no_file_under_the_final_name(tmp_path):
    """pg_dump of a database that does not answer: backup.sh fails, naming it, and no
    ``<name>.dump`` exists (a file with that name is always a complete dump)."""
    backup = script("backup.sh", "-o", str(tmp_path), "default=postgresql://nobody@127.0.0.1:1/chat")
    assert backup.returncode != 0
    assert re.search(r"pg_dump of 'default' failed", backup.stderr), backup.stderr
    assert not (tmp_path / "default.dump").exists()
