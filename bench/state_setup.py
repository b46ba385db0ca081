"""The setup of bench/state_bench.py: its sizes and shared helpers (:class:`Bench`, the
timings' :func:`summary`), the scratch database (created beside the server's own, migrated,
dropped at the end) and the data built in it (:func:`data_build`: the partitioned turn log, the
naive baseline table, the long conversation). The measured sections are in state_bench.py.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench.harness import percentile

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
OUT_PATH = VAR / "bench" / "state_bench.json"

SMALL_CONVERSATIONS = 900
SMALL_TURNS = 1_000
LONG_TURNS = 100_000
TOTAL_TURNS = SMALL_CONVERSATIONS * SMALL_TURNS + LONG_TURNS
PAGE = 50
LONG_ID = "00000000-0000-4000-8000-999999999999"
# The long conversation starts an hour into the first month: turn_page widens its range by
# partitions.TURN_TIME_MARGIN, which from a month's first minutes reaches into the month before.
LONG_START = dt.timedelta(hours=1)

# Every column of a turn, in the order the INSERTs below write them.
TURN_COLUMNS = (
    "turn_id, role, content, token_count, status, moderation_verdict, created_at, "
    "conversation_id, context_trimmed"
)
TURN_SELECT = (
    "turn_id, conversation_id, role, content, token_count, prompt_tokens, status, "
    "moderation_verdict, reply_to_id, replaces_id, context_trimmed, created_at"
)


def log(message: str) -> None:
    print(f"[state_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summary(samples_s: list[float]) -> dict:
    """{n, p50_ms, p99_ms, mean_ms} of per-operation seconds."""
    ms = [s * 1000 for s in samples_s]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


@dataclass
class Bench:
    """What the sections share: settings, the data's landmarks, the results so far."""

    appends: int
    pages: int
    owner_id: int = 0
    first_month: dt.datetime | None = None
    long_keys: list[tuple[dt.datetime, str]] = field(default_factory=list)  # newest first
    small_ids: list[str] = field(default_factory=list)
    results: dict = field(default_factory=dict)


# --- the scratch database ------------------------------------------------------------------------


def scratch_urls() -> tuple[str, str]:
    """(the server's own database URL, the scratch database's URL)."""
    base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/chat"
    parts = urlsplit(base)
    scratch = urlunsplit(parts._replace(path=f"/chat_bench_state_{os.getpid()}"))
    return base, scratch


def database_create(base_url: str, scratch_url: str) -> str:
    import psycopg  # noqa: PLC0415

    name = urlsplit(scratch_url).path.lstrip("/")
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return name


def database_drop(base_url: str, name: str) -> None:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_start(scratch_url: str) -> None:
    os.environ["DATABASE_URL"] = scratch_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()


# --- data --------------------------------------------------------------------------------------


def data_build(bench: Bench) -> None:
    """Migrate; 12 monthly partitions before this month; 1,000,000 turns; the flat copy."""
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415
    from django.utils import timezone  # noqa: PLC0415

    from accounts.models import User  # noqa: PLC0415
    from conversations.partitions import month_add, month_start, turn_partitions_ensure  # noqa: PLC0415

    t0 = time.monotonic()
    call_command("migrate", verbosity=0)
    log(f"migrated in {time.monotonic() - t0:.1f} s")
    first = month_add(month_start(timezone.now()), -12)
    bench.first_month = first
    turn_partitions_ensure(months_ahead=11, now=first)
    bench.owner_id = User.objects.create(username="state-bench").pk
    year_s = (month_add(first, 12) - first).total_seconds() - 3600
    small_span_s = SMALL_TURNS * 60.0  # a small conversation: a turn a minute
    small_gap_s = (year_s - small_span_s) / SMALL_CONVERSATIONS
    long_gap_s = (year_s - LONG_START.total_seconds()) / LONG_TURNS
    t0 = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '256MB'")
        cursor.execute(
            "INSERT INTO conversations_conversation (conversation_id, owner_id, title, model, "
            "system_prompt, region, created_at, last_turn_at, summary) "
            "SELECT ('00000000-0000-4000-8000-' || lpad(k::text, 12, '0'))::uuid, %(owner)s, "
            "'bench ' || k, 'bench', '', 'eu-west', "
            "%(first)s + k * make_interval(secs => %(gap)s), "
            "%(first)s + k * make_interval(secs => %(gap)s) + make_interval(secs => %(span)s), '' "
            "FROM generate_series(0, %(n)s - 1) k",
            {"owner": bench.owner_id, "first": first, "gap": small_gap_s,
             "span": small_span_s - 60, "n": SMALL_CONVERSATIONS},
        )  # fmt: skip
        cursor.execute(
            "INSERT INTO conversations_conversation (conversation_id, owner_id, title, model, "
            "system_prompt, region, created_at, last_turn_at, summary) VALUES "
            "(%s, %s, 'the long one', 'bench', '', 'eu-west', %s, %s, '')",
            [LONG_ID, bench.owner_id, first + LONG_START, first + dt.timedelta(seconds=year_s)],
        )
        # Small conversations' turns, then the long one's; random ids as the app makes them.
        cursor.execute(
            f"INSERT INTO conversations_turn ({TURN_COLUMNS}) "
            "SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN 'user' ELSE 'assistant' END, "
            "'bench turn ' || g || ' about partitions, keyset pages and monthly ranges', 9, "
            "'complete', '{}', "
            "%(first)s + (g / %(each)s) * make_interval(secs => %(gap)s) "
            "+ (g %% %(each)s) * interval '1 minute', "
            "('00000000-0000-4000-8000-' || lpad((g / %(each)s)::text, 12, '0'))::uuid, 0 "
            "FROM generate_series(0, %(n)s - 1) g",
            {"first": first, "each": SMALL_TURNS, "gap": small_gap_s,
             "n": SMALL_CONVERSATIONS * SMALL_TURNS},
        )  # fmt: skip
        cursor.execute(
            f"INSERT INTO conversations_turn ({TURN_COLUMNS}) "
            "SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN 'user' ELSE 'assistant' END, "
            "'long turn ' || g, 9, 'complete', '{}', "
            "%(first)s + g * make_interval(secs => %(gap)s), %(long)s, 0 "
            "FROM generate_series(0, %(n)s - 1) g",
            {"first": first + LONG_START, "gap": long_gap_s, "long": LONG_ID, "n": LONG_TURNS},
        )
        log(f"{TOTAL_TURNS:,} turns into 12 partitions in {time.monotonic() - t0:.1f} s")
        t0 = time.monotonic()
        # The baseline: one plain table, same rows, same indexes, keyed on turn_id alone.
        cursor.execute(
            "CREATE TABLE turn_flat (LIKE conversations_turn INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute("INSERT INTO turn_flat SELECT * FROM conversations_turn")
        for ddl in (
            "ALTER TABLE turn_flat ADD PRIMARY KEY (turn_id)",
            "ALTER TABLE turn_flat ADD FOREIGN KEY (conversation_id) REFERENCES "
            "conversations_conversation (conversation_id) DEFERRABLE INITIALLY DEFERRED",
            "CREATE INDEX ON turn_flat (created_at)",
            "CREATE INDEX ON turn_flat (conversation_id)",
            "CREATE INDEX ON turn_flat (reply_to_id)",
            "CREATE INDEX ON turn_flat (replaces_id)",
            "CREATE INDEX ON turn_flat (conversation_id, created_at, turn_id)",
            "CREATE INDEX ON turn_flat USING gin "
            "(to_tsvector('english'::regconfig, COALESCE(content, '')))",
        ):
            cursor.execute(ddl)
        log(f"flat copy with its indexes in {time.monotonic() - t0:.1f} s")
        cursor.execute("VACUUM ANALYZE conversations_turn")
        cursor.execute("VACUUM ANALYZE turn_flat")
        cursor.execute("ANALYZE conversations_conversation")
        cursor.execute(
            "SELECT created_at, turn_id FROM conversations_turn WHERE conversation_id = %s "
            "ORDER BY created_at DESC, turn_id DESC",
            [LONG_ID],
        )
        bench.long_keys = [(created_at, str(turn_id)) for created_at, turn_id in cursor.fetchall()]
        cursor.execute(
            "SELECT conversation_id::text FROM conversations_conversation WHERE conversation_id <> %s",
            [LONG_ID],
        )
        bench.small_ids = [cid for (cid,) in cursor.fetchall()]
    assert len(bench.long_keys) == LONG_TURNS
