"""Feedback counted (issue 8): counts per pool and model version of each user's current rating,
and the ``chat_feedback_total`` metric, counted once a rating is committed and exported on the
metrics endpoint."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.test import Client
from django.utils import timezone

from core import metrics
from feedback import selectors
from feedback.models import Feedback
from feedback.services import COMMENT_MAX_CHARS
from tests.feedback_support import answered, api_rate, rate, signed_in

pytestmark = pytest.mark.django_db


# --- counts per pool and model version; the metric -------------------------------------------


def test_counts_per_pool_and_version_count_each_users_current_rating(make_user):
    """Given ratings of answers from mini@v1, mini@v2 (a canary) and frontier@v1 by several
    users, one of them changed from up to down, then the counts per (pool, version) are the
    current ratings, the changed one counted once as down."""
    given = [  # (user, pool, version, ratings in order)
        ("u1", "mini", "v1", ["up"]), ("u2", "mini", "v1", ["up"]), ("u3", "mini", "v1", ["down"]),
        ("u4", "mini", "v2", ["up", "down"]), ("u5", "mini", "v2", ["down"]),
        ("u6", "frontier", "v1", ["up"]),
    ]  # fmt: skip
    for name, pool, version, ratings in given:
        owner = make_user(name)
        conversation, _, answer = answered(owner, pool=pool, version=version)
        client = signed_in(owner)
        for rating in ratings:
            assert rate(client, conversation, answer, rating).status_code == 200

    counts = {(c.pool, c.model_version): (c.up, c.down) for c in selectors.feedback_counts()}

    assert counts == {("frontier", "v1"): (1, 0), ("mini", "v1"): (2, 1), ("mini", "v2"): (0, 2)}


def test_counts_since_leave_out_older_ratings(make_user):
    owner = make_user("ann")
    for pool in ("mini", "frontier"):
        conversation, _, answer = answered(owner, pool=pool, version="v1")
        rate(signed_in(owner), conversation, answer, "up")
    Feedback.objects.filter(pool="frontier").update(updated_at=timezone.now() - dt.timedelta(days=8))

    counts = selectors.feedback_counts(since=timezone.now() - dt.timedelta(days=7))

    assert [(c.pool, c.up, c.down) for c in counts] == [("mini", 1, 0)]


def feedback_metric(pool: str, version: str, rating: str) -> float:
    return metrics.value("chat_feedback_total", pool=pool, model_version=version, rating=rating)


def test_the_metric_counts_new_and_changed_ratings_once_committed(make_user, django_capture_on_commit_callbacks):
    """Given an answer of a pool/version no other test uses, when it is rated up, up again,
    its comment edited, then rated down: up counts 1 and down 1 (a repeat or a comment edit
    counts nothing)."""
    pool, version = f"pool-{uuid.uuid4().hex[:6]}", "v-metric"
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool=pool, version=version)
    client = signed_in(owner)

    with django_capture_on_commit_callbacks(execute=True):
        rate(client, conversation, answer, "up")
    assert (feedback_metric(pool, version, "up"), feedback_metric(pool, version, "down")) == (1, 0)
    with django_capture_on_commit_callbacks(execute=True):
        rate(client, conversation, answer, "up")
        rate(client, conversation, answer, "up", "Now with a comment.")
    assert (feedback_metric(pool, version, "up"), feedback_metric(pool, version, "down")) == (1, 0)
    with django_capture_on_commit_callbacks(execute=True):
        rate(client, conversation, answer, "down", "Now with a comment.")
    assert (feedback_metric(pool, version, "up"), feedback_metric(pool, version, "down")) == (1, 1)


def test_a_refused_rating_is_not_counted(make_user, django_capture_on_commit_callbacks):
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool=pool, version="v1")

    with django_capture_on_commit_callbacks(execute=True):
        rate(signed_in(owner), conversation, answer, "up", "x" * (COMMENT_MAX_CHARS + 1))

    assert feedback_metric(pool, "v1", "up") == 0


def test_metrics_endpoint_exports_the_feedback_counter(make_user, django_capture_on_commit_callbacks):
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool=pool, version="v7")
    with django_capture_on_commit_callbacks(execute=True):
        api_rate(owner, conversation, answer, {"rating": "down"})

    body = Client().get("/metrics").content.decode()

    assert f'chat_feedback_total{{model_version="v7",pool="{pool}",rating="down"}} 1.0' in body
