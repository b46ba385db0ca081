"""Retention purge (conversations/retention.py) with a moved clock: ``now`` is passed in, the
conversations' last turns are real rows. The daily task through a real Celery worker is in
tests/integration/test_writeback_worker.py."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import Organisation
from conversations import held, retention, services
from conversations.models import Conversation, Turn
from tests.test_writeback import plain_redis

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def conversation_last_active(owner, days_ago: float, org: Organisation | None = None) -> Conversation:
    """A conversation with one user turn, last active ``days_ago`` days before NOW."""
    conversation = services.conversation_create(owner=owner)
    services.turn_append_user(conversation=conversation, content="hello")
    Conversation.objects.filter(pk=conversation.pk).update(
        last_turn_at=NOW - timedelta(days=days_ago), org=org
    )
    return conversation


def org(**fields) -> Organisation:
    return Organisation.objects.create(name="Org", slug=f"org-{uuid.uuid4().hex[:8]}", **fields)


def remaining(*conversations: Conversation) -> list[bool]:
    return [Conversation.objects.filter(pk=c.pk).exists() for c in conversations]


def test_a_free_conversation_is_purged_after_30_days_with_its_turns(make_user):
    """Given a free user's conversation last active 31 days ago, when the purge runs, then it
    and its turns are gone."""
    old = conversation_last_active(make_user(tier="free"), 31)
    assert retention.conversations_purge_expired(now=NOW) == 1
    assert remaining(old) == [False]
    assert not Turn.objects.filter(conversation_id=old.pk).exists()


def test_a_recent_free_conversation_is_kept(make_user):
    recent = conversation_last_active(make_user(tier="free"), 29)
    assert retention.conversations_purge_expired(now=NOW) == 0
    assert remaining(recent) == [True]


def test_paid_and_enterprise_conversations_are_kept(make_user):
    paid = conversation_last_active(make_user(tier="paid"), 400)
    enterprise = conversation_last_active(make_user(tier="enterprise"), 400)
    assert retention.conversations_purge_expired(now=NOW) == 0
    assert remaining(paid, enterprise) == [True, True]


def test_an_organisations_own_period_overrides_the_tier(make_user):
    """Given an org with retention_days = 7 (its tier keeps forever) and a paid member, its
    conversation last active 8 days ago is purged and one active 6 days ago is kept."""
    seven = org(tier="enterprise", retention_days=7)
    member = make_user(tier="paid")
    expired = conversation_last_active(member, 8, org=seven)
    recent = conversation_last_active(member, 6, org=seven)
    own = conversation_last_active(member, 8)  # the member's own, outside the org: paid, kept
    assert retention.conversations_purge_expired(now=NOW) == 1
    assert remaining(expired, recent, own) == [False, True, True]


def test_an_organisation_without_a_period_follows_its_tier(make_user):
    """A free-tier org without retention_days: 30 days; a free user's conversation in an
    enterprise org (kept) is not purged by the user's own tier."""
    free_org, enterprise_org = org(tier="free"), org(tier="enterprise")
    user = make_user(tier="free")
    in_free_org = conversation_last_active(user, 31, org=free_org)
    in_enterprise_org = conversation_last_active(user, 31, org=enterprise_org)
    assert retention.conversations_purge_expired(now=NOW) == 1
    assert remaining(in_free_org, in_enterprise_org) == [False, True]


def test_the_clock_decides(make_user):
    """The same free conversation is kept at NOW and purged when the clock moves 2 days on."""
    conversation = conversation_last_active(make_user(tier="free"), 29)
    assert retention.conversations_purge_expired(now=NOW) == 0
    assert retention.conversations_purge_expired(now=NOW + timedelta(days=2)) == 1
    assert remaining(conversation) == [False]


def test_the_periods_come_from_settings(make_user, settings):
    settings.CHAT_RETENTION_DAYS_BY_TIER = {"free": 3, "paid": 10, "enterprise": None}
    free, paid = make_user(tier="free"), make_user(tier="paid")
    gone = [conversation_last_active(free, 4), conversation_last_active(paid, 11)]
    kept = [conversation_last_active(free, 2), conversation_last_active(paid, 9)]
    assert retention.conversations_purge_expired(now=NOW) == 2
    assert remaining(*gone, *kept) == [False, False, True, True]


@pytest.mark.django_db(transaction=True)  # the Redis copies go once the purge commits
def test_a_purged_conversation_leaves_no_held_turns_in_redis(make_user):
    """Given an expired conversation with an answer still held in Redis for write-back, the
    purge deletes the held record too (a purge deletes every copy)."""
    conversation = conversation_last_active(make_user(tier="free"), 31)
    question = Turn.objects.get(conversation_id=conversation.pk)
    record = held.answer_record(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="held", status="complete", prompt_tokens=1, completion_tokens=1,
    )  # fmt: skip
    held.hold(record, ttl_s=600, due=True)
    assert retention.conversations_purge_expired(now=NOW) == 1
    assert held.record_get(record["turn_id"]) is None
    assert not plain_redis().exists(held.conversation_key(conversation.pk))


def test_beat_purges_daily_and_sweeps_held_answers_every_minute(settings):
    """The beat schedule runs the purge once a day and the write-back sweeper every
    CHAT_WRITEBACK_SWEEP_S (60 s), both as tasks the workers know."""
    from celery.schedules import crontab  # noqa: PLC0415

    from chatsite.celery import app  # noqa: PLC0415

    app.loader.import_default_modules()
    purge = settings.CELERY_BEAT_SCHEDULE["conversations.conversations_purge_expired"]
    sweep = settings.CELERY_BEAT_SCHEDULE["conversations.turn_write_back_sweep"]
    assert isinstance(purge["schedule"], crontab)
    assert len(purge["schedule"].hour) == len(purge["schedule"].minute) == 1  # once a day
    assert sweep["schedule"] == settings.CHAT_WRITEBACK_SWEEP_S == 60
    assert {purge["task"], sweep["task"]} <= set(app.tasks)
