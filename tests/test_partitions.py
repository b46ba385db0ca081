"""The partitioned turn log: its key, its migration both ways, partition maintenance (function,
command, Celery task on a real worker), and the invariants that replace a unique turn_id."""

from __future__ import annotations

import datetime as dt
import functools
import json
import subprocess
import sys
import threading
import time
import uuid
from io import StringIO

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from chatsite.celery import app as celery_app
from conversations import partitions, services
from conversations.models import Turn
from conversations.partitions import (
    DEFAULT_PARTITION,
    month_add,
    month_start,
    partition_name,
    turn_partitions_ensure,
)
from tests.processes import celery_worker_process, database_url, stack_env

UTC = dt.UTC


def _one(sql: str, params=()) -> object:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def _table_kind() -> str:
    """'p' for a partitioned table, 'r' for a plain one."""
    return _one("SELECT relkind FROM pg_class WHERE oid = 'conversations_turn'::regclass")


def _primary_key() -> str:
    return _one(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'conversations_turn'::regclass AND contype = 'p'"
    )


def _partition_of(turn_id) -> str:
    return _one("SELECT tableoid::regclass::text FROM conversations_turn WHERE turn_id = %s", [turn_id])


def _bounds(name: str) -> str:
    return _one("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = %s", [name])


def _insert_turn(conversation, created_at: dt.datetime, content: str = "hello") -> uuid.UUID:
    """A user turn written with an explicit created_at (as a late write-back would be)."""
    turn = Turn.objects.create(
        conversation=conversation, role=Turn.Role.USER, content=content, created_at=created_at
    )
    return turn.turn_id


@pytest.fixture
def drop_partitions_afterwards():
    """Names appended to the yielded list are dropped after the test (transactional tests
    commit the partitions they create; empty or not, they must not outlive the test)."""
    names: list[str] = []
    yield names
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'DROP TABLE IF EXISTS "{name}"')


# --- the key -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_turn_log_is_partitioned_by_created_at_with_key_turn_id_created_at():
    """The brief's PRIMARY KEY (conversation_id, turn_id) is impossible on a table partitioned
    by created_at; the key is (turn_id, created_at) (migration 0004's docstring)."""
    assert _table_kind() == "p"
    assert _one("SELECT pg_get_partkeydef('conversations_turn'::regclass)") == "RANGE (created_at)"
    assert _primary_key() == "PRIMARY KEY (turn_id, created_at)"
    assert DEFAULT_PARTITION in partitions.turn_partitions_list()


@pytest.mark.django_db
def test_this_month_and_three_ahead_have_partitions_after_migrating():
    first = month_start(timezone.now())
    present = set(partitions.turn_partitions_list())
    assert {partition_name(month_add(first, i)) for i in range(4)} <= present


@pytest.mark.django_db
def test_models_and_migrations_agree():
    """Django's migration state matches the models (the RunSQL of 0004 changes no state)."""
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


# --- the migration, both ways --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_migration_reverses_to_a_plain_table_and_reapplies_keeping_every_row(make_user):
    """Given turns in this month, last month and far ahead (DEFAULT); when 0004 is unapplied
    and applied again with the real MigrationExecutor; then each state has every row, the plain
    table is keyed on turn_id, and the rows land in their months' partitions again."""
    user = make_user()
    conversation = services.conversation_create(owner=user)
    now = timezone.now()
    last_month = month_add(month_start(now), -1) + dt.timedelta(days=3)
    far_ahead = month_add(month_start(now), 40)
    rows = {
        _insert_turn(conversation, now, "this month"): "this month",
        _insert_turn(conversation, last_month, "last month"): "last month",
        _insert_turn(conversation, far_ahead, "far ahead"): "far ahead",
    }

    def stored() -> dict:
        with connection.cursor() as cursor:
            cursor.execute("SELECT turn_id, content FROM conversations_turn")
            return dict(cursor.fetchall())

    executor = MigrationExecutor(connection)
    executor.migrate([("conversations", "0003_summary_versions_cross_db_refs")])
    assert _table_kind() == "r"
    assert _primary_key() == "PRIMARY KEY (turn_id)"
    assert stored() == rows

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert _table_kind() == "p"
    assert _primary_key() == "PRIMARY KEY (turn_id, created_at)"
    assert stored() == rows
    by_content = {content: turn_id for turn_id, content in rows.items()}
    assert _partition_of(by_content["this month"]) == partition_name(month_start(now))
    assert _partition_of(by_content["last month"]) == partition_name(month_start(last_month))
    assert _partition_of(by_content["far ahead"]) == DEFAULT_PARTITION


# --- partition maintenance ---------------------------------------------------------------------


@pytest.mark.django_db
def test_partitions_are_created_for_the_month_and_the_months_ahead():
    """Given a month no partition covers yet; when ensured 3 months ahead; then that month and
    the 3 after it get partitions with calendar-month bounds (UTC), and a second run creates
    nothing. (The test's transaction rolls the DDL back.)"""
    when = dt.datetime(2041, 11, 17, 8, 30, tzinfo=UTC)

    created = turn_partitions_ensure(months_ahead=3, now=when)

    assert created == [
        "conversations_turn_y2041m11",
        "conversations_turn_y2041m12",
        "conversations_turn_y2042m01",
        "conversations_turn_y2042m02",
    ]
    assert _bounds("conversations_turn_y2041m12") == (
        "FOR VALUES FROM ('2041-12-01 00:00:00+00') TO ('2042-01-01 00:00:00+00')"
    )
    assert turn_partitions_ensure(months_ahead=3, now=when) == []


@pytest.mark.django_db(transaction=True)
def test_a_turn_for_a_month_without_partition_lands_in_default_and_moves_into_its_partition(
    make_user, drop_partitions_afterwards
):
    """Given a turn written for a month that has no partition (so DEFAULT takes it); when that
    month's partition is created; then the turn is moved into it, unchanged, in one go."""
    conversation = services.conversation_create(owner=make_user())
    when = dt.datetime(2043, 5, 9, 12, 0, tzinfo=UTC)
    turn_id = _insert_turn(conversation, when, "written before its partition existed")
    assert _partition_of(turn_id) == DEFAULT_PARTITION
    drop_partitions_afterwards.append("conversations_turn_y2043m05")

    created = turn_partitions_ensure(months_ahead=0, now=when)

    assert created == ["conversations_turn_y2043m05"]
    assert _partition_of(turn_id) == "conversations_turn_y2043m05"
    moved = Turn.objects.get(turn_id=turn_id)
    assert (moved.content, moved.created_at) == ("written before its partition existed", when)
    assert _one(f'SELECT count(*) FROM "{DEFAULT_PARTITION}" WHERE turn_id = %s', [turn_id]) == 0
    # The moved-into partition is a full partition: the parent's indexes were built on it.
    assert _one(
        "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'turn_content_fts'::regclass AND c.relname LIKE %s",
        ["conversations_turn_y2043m05%"],
    ) == 1  # fmt: skip


@pytest.mark.django_db
def test_the_management_command_creates_partitions_ahead(monkeypatch):
    """``manage.py turn_partitions --months-ahead N`` (the clock moved to 2044-03)."""
    monkeypatch.setattr(timezone, "now", lambda: dt.datetime(2044, 3, 2, tzinfo=UTC))
    out = StringIO()
    call_command("turn_partitions", "--months-ahead", "1", stdout=out)

    assert "default: created conversations_turn_y2044m03" in out.getvalue()
    assert "default: created conversations_turn_y2044m04" in out.getvalue()
    assert {"conversations_turn_y2044m03", "conversations_turn_y2044m04"} <= set(
        partitions.turn_partitions_list()
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")  # send_task: broker
def test_the_beat_task_creates_partitions_on_a_real_celery_worker(tmp_path, drop_partitions_afterwards):
    """Given a real ``celery worker`` process; when the beat schedule's task message is sent
    through the broker asking for 7 months ahead; then the partitions appear in PostgreSQL."""
    now = timezone.now()
    wanted = [partition_name(month_add(month_start(now), i)) for i in range(5, 8)]
    drop_partitions_afterwards.extend(wanted)
    for name in wanted:
        connection.cursor().execute(f'DROP TABLE IF EXISTS "{name}"')
    entry = settings.CELERY_BEAT_SCHEDULE["conversations.turn_partitions_ensure"]
    with celery_worker_process(tmp_path) as worker:
        celery_app.send_task(entry["task"], kwargs={"months_ahead": 7})
        deadline = time.monotonic() + 60
        while not set(wanted) <= set(partitions.turn_partitions_list()):
            assert time.monotonic() < deadline, worker.log()[-3000:]
            time.sleep(0.3)
        assert "conversations.turn_partitions_ensure" in worker.log()


# --- what replaces a unique turn_id --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_writes_of_one_answer_store_it_once(make_user):
    """PF-J1: the database key (turn_id, created_at) would accept one turn_id twice (the two
    writes carry different created_at); turn_append_assistant checks for the id under the
    conversation's row lock, so two deliveries of one write-back at the same moment store one
    row."""
    user = make_user()
    conversation = services.conversation_create(owner=user)
    question = services.turn_append_user(conversation=conversation, content="hi")
    answer_id = uuid.uuid4()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(seconds_late: int):
        try:
            barrier.wait(10)
            services.turn_append_assistant(
                conversation_id=conversation.pk, turn_id=answer_id, reply_to_id=question.turn_id,
                content="hello", status=Turn.Status.COMPLETE, prompt_tokens=3,
                completion_tokens=1, created_at=timezone.now() + dt.timedelta(seconds=seconds_late),
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert errors == []
    assert Turn.objects.filter(turn_id=answer_id).count() == 1


@pytest.mark.django_db
def test_every_append_keeps_last_turn_at_at_or_after_its_turns(make_user):
    """History pages bound created_at by the conversation's last_turn_at to prune partitions
    (page_selectors.turn_page); that is only sound while every append raises last_turn_at to at
    least the new turn's created_at, including an answer written back late."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="hi")
    finished = timezone.now() + dt.timedelta(seconds=30)
    services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="hello", status=Turn.Status.COMPLETE, prompt_tokens=3, completion_tokens=1,
        created_at=finished,
    )  # fmt: skip
    conversation.refresh_from_db()
    newest = Turn.objects.filter(conversation=conversation).order_by("-created_at").first()
    assert conversation.last_turn_at >= newest.created_at == finished
    assert conversation.created_at <= question.created_at


@pytest.mark.django_db(transaction=True)
def test_the_command_creates_partitions_in_every_regions_database(drop_partitions_afterwards):
    """With a second region's database configured (CHAT_REGION_DATABASE_URLS), ``manage.py
    turn_partitions`` (run as its own process, as cron or an operator would) creates the months
    ahead in both turn logs."""
    default_name = connection.settings_dict["NAME"]
    region_name = f"{default_name}_us_east"
    region_url = database_url().replace(f"/{default_name}", f"/{region_name}", 1)
    wanted = partition_name(month_add(month_start(timezone.now()), 9))
    drop_partitions_afterwards.append(wanted)
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{region_name}" WITH (FORCE)')
        cursor.execute(f'CREATE DATABASE "{region_name}"')
    try:
        env = stack_env({"CHAT_REGION_DATABASE_URLS": json.dumps({"us-east": region_url})})
        manage = [sys.executable, "manage.py"]
        run = functools.partial(
            subprocess.run, env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120
        )
        migrated = run([*manage, "migrate", "--database", "region_us-east", "-v", "0"])
        assert migrated.returncode == 0, migrated.stderr[-3000:]

        made = run([*manage, "turn_partitions", "--months-ahead", "9"])

        assert made.returncode == 0, made.stderr[-3000:]
        assert f"default: created {wanted}" in made.stdout
        assert f"region_us-east: created {wanted}" in made.stdout
        assert wanted in partitions.turn_partitions_list()
        with psycopg.connect(region_url) as region:
            found = region.execute("SELECT to_regclass(%s) IS NOT NULL", [wanted]).fetchone()[0]
        assert found
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{region_name}" WITH (FORCE)')
