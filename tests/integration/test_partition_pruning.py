"""History pages on a 1,000,000-turn log over 12 monthly partitions: a page of 50 for one
conversation reads only the partitions it can lie in (EXPLAIN), and keyset pages are right.

The data (made once for the module, in one INSERT ... SELECT generate_series): 1,000 conversations
of 1,000 turns each, in 2020; conversation k starts at 2020-01-01 + 8 h * k and has a turn every
30 minutes (so it lasts ~21 days). Conversation 435 starts 2020-05-25 and ends 2020-06-14: it
spans the May and June partitions. Turn g (0..999,999) is turn g % 1000 of conversation g // 1000;
ids are made from the numbers, so each expected page is known exactly.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import User
from conversations import page_selectors
from conversations.models import Conversation, Turn
from conversations.partitions import DEFAULT_PARTITION, turn_partitions_ensure

CONVERSATIONS = 1_000
TURNS_EACH = 1_000
YEAR = 2020
MONTHS = [f"conversations_turn_y{YEAR}m{m:02d}" for m in range(1, 13)]
TARGET = 435  # spans May and June


def number_uuid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


@pytest.fixture(scope="module")
def turn_log(django_db_setup, django_db_blocker):
    """1,000,000 committed turns over the 12 partitions of 2020; removed after the module."""
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        created = turn_partitions_ensure(months_ahead=11, now=dt.datetime(YEAR, 1, 1, tzinfo=dt.UTC))
        assert created == MONTHS
        owner_id = User.objects.create(username="pruning-owner").pk
        start = "timestamptz '2020-01-01 00:00+00' + {k} * interval '8 hours'"
        cursor.execute(
            "INSERT INTO conversations_conversation (conversation_id, owner_id, title, model, "
            "system_prompt, region, created_at, last_turn_at, summary) "
            "SELECT ('00000000-0000-4000-8000-' || lpad(k::text, 12, '0'))::uuid, %s, 'c' || k, "
            f"'m', '', 'eu-west', {start.format(k='k')}, "
            f"{start.format(k='k')} + {TURNS_EACH - 1} * interval '30 minutes', '' "
            f"FROM generate_series(0, {CONVERSATIONS - 1}) k",
            [owner_id],
        )
        cursor.execute(
            "INSERT INTO conversations_turn (turn_id, role, content, token_count, status, "
            "moderation_verdict, created_at, conversation_id, context_trimmed) "
            "SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, "
            "CASE WHEN g % 2 = 0 THEN 'user' ELSE 'assistant' END, 'turn ' || g, 2, 'complete', "
            f"'{{}}', {start.format(k=f'(g / {TURNS_EACH})')} "
            f"+ (g % {TURNS_EACH}) * interval '30 minutes', "
            f"('00000000-0000-4000-8000-' || lpad((g / {TURNS_EACH})::text, 12, '0'))::uuid, 0 "
            f"FROM generate_series(0, {CONVERSATIONS * TURNS_EACH - 1}) g"
        )
        cursor.execute("ANALYZE conversations_turn")
        cursor.execute("ANALYZE conversations_conversation")
    yield owner_id
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for name in MONTHS:
            cursor.execute(f'DROP TABLE "{name}"')
        cursor.execute("DELETE FROM conversations_conversation WHERE owner_id = %s", [owner_id])
    with django_db_blocker.unblock():
        User.objects.filter(pk=owner_id).delete()


def scanned_relations(plan: dict) -> set[str]:
    """Every table an EXPLAIN (FORMAT JSON) plan node scans."""
    found = {plan["Relation Name"]} if "Relation Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= scanned_relations(child)
    return found


def page_and_plan(conversation: Conversation, before) -> tuple[list[Turn], bool, set[str]]:
    """turn_page's result, and the tables its turn query scans per EXPLAIN of the very SQL it
    ran (captured from the connection)."""
    with CaptureQueriesContext(connection) as queries:
        page, more = page_selectors.turn_page(conversation=conversation, before=before, limit=50)
    (sql,) = [q["sql"] for q in queries.captured_queries if '"conversations_turn"' in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        (plan,) = cursor.fetchone()[0]
    return page, more, scanned_relations(plan["Plan"])


def turn_numbers(page: list[Turn]) -> list[int]:
    return [int(t.content.split()[1]) for t in page]


@pytest.mark.django_db
def test_the_log_holds_a_million_turns_over_twelve_monthly_partitions(turn_log):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text, count(*) FROM conversations_turn "
            "WHERE conversation_id IN (SELECT conversation_id FROM conversations_conversation "
            "WHERE owner_id = %s) GROUP BY 1",
            [turn_log],
        )
        counts = dict(cursor.fetchall())
    assert set(counts) == set(MONTHS)
    assert sum(counts.values()) == CONVERSATIONS * TURNS_EACH


@pytest.mark.django_db
def test_the_newest_page_reads_only_the_partitions_the_conversation_spans(turn_log, settings):
    """Given a conversation that lives in May and June; when its newest page of 50 is read;
    then the query plans scans of the May and June partitions only (not the other 10 months,
    not DEFAULT, not the months made ahead), and the page is its last 50 turns, in order."""
    settings.CHAT_HOT_CACHE_TURNS = 0  # the hot cache off: turn_page's own query
    conversation = Conversation.objects.get(pk=number_uuid(TARGET))

    page, more, scanned = page_and_plan(conversation, before=None)

    assert scanned == {f"conversations_turn_y{YEAR}m05", f"conversations_turn_y{YEAR}m06"}
    first = TARGET * TURNS_EACH
    assert turn_numbers(page) == list(range(first + 950, first + 1000))
    assert more is True


@pytest.mark.django_db
def test_the_hot_cache_fill_reads_only_the_partitions_the_conversation_spans(turn_log):
    """Given the same conversation with no hot cache entry; when its newest page is read (the
    cache fills conv:{id} from PostgreSQL, conversations/cache.py); then that one turn query
    scans the May and June partitions only, and the page is its last 50 turns."""
    from conversations import cache  # noqa: PLC0415

    conversation = Conversation.objects.get(pk=number_uuid(TARGET))
    cache.forget(conversation.pk)

    page, more, scanned = page_and_plan(conversation, before=None)

    cache.forget(conversation.pk)
    assert scanned == {f"conversations_turn_y{YEAR}m05", f"conversations_turn_y{YEAR}m06"}
    first = TARGET * TURNS_EACH
    assert turn_numbers(page) == list(range(first + 950, first + 1000))
    assert more is True


@pytest.mark.django_db
def test_a_cursor_page_deep_in_the_conversation_reads_one_partition(turn_log):
    """Given the cursor of turn 100 of the conversation (in May); when the page before it is
    read; then only the May partition is scanned, and the page is turns 50..99 in order."""
    conversation = Conversation.objects.get(pk=number_uuid(TARGET))
    first = TARGET * TURNS_EACH
    cursor_turn = Turn.objects.get(turn_id=number_uuid(first + 100))

    page, more, scanned = page_and_plan(
        conversation, before=(cursor_turn.created_at, cursor_turn.turn_id)
    )

    assert scanned == {f"conversations_turn_y{YEAR}m05"}
    assert DEFAULT_PARTITION not in scanned
    assert turn_numbers(page) == list(range(first + 50, first + 100))
    assert more is True


@pytest.mark.django_db
def test_following_cursors_walks_to_the_first_turn_without_gaps(turn_log):
    """Keyset pages from the newest back to the oldest: every turn once, in order, across the
    partition boundary, and the last page says no more remain."""
    conversation = Conversation.objects.get(pk=number_uuid(TARGET))
    seen: list[int] = []
    before = None
    while True:
        page, more = page_selectors.turn_page(conversation=conversation, before=before, limit=50)
        seen = turn_numbers(page) + seen
        if not more:
            break
        before = (page[0].created_at, page[0].turn_id)
    first = TARGET * TURNS_EACH
    assert seen == list(range(first, first + TURNS_EACH))
