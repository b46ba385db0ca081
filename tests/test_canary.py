"""A canary you can judge (issue 19, part 6): each answer stores its TTFT and TPOT, and the
admin's canary page sets each pool's model versions side by side (answers, error rate, TTFT and
TPOT percentiles, thumbs). The ``/metrics`` side (``version`` labels, engine requests by
outcome) is in tests/test_serving.py."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from conversations import services
from conversations.models import Turn
from feedback.models import Feedback
from feedback.selectors import histogram_quantile, version_health
from tests.chat_support import signed_in
from tests.versions_support import answered

pytestmark = pytest.mark.django_db(transaction=True)

STABLE = "smollm2-135m-1"  # the default pools' version (chatsite/settings/engine.py)


# --- histogram quantiles (pure) ---------------------------------------------------------------


def test_histogram_quantile_interpolates_inside_the_bucket_like_prometheus():
    bounds = (100.0, 200.0, 400.0)
    # 10 values <= 100, 10 more <= 200, none more <= 400, 20 in all.
    assert histogram_quantile(0.5, bounds, [10, 20, 20, 20]) == 100.0
    assert histogram_quantile(0.25, bounds, [10, 20, 20, 20]) == 50.0
    assert histogram_quantile(0.75, bounds, [10, 20, 20, 20]) == 150.0
    assert histogram_quantile(0.99, bounds, [10, 20, 20, 20]) == pytest.approx(198.0)


def test_histogram_quantile_beyond_the_last_bound_is_that_bound_and_none_without_values():
    assert histogram_quantile(0.99, (100.0, 200.0), [0, 1, 10]) == 200.0
    assert histogram_quantile(0.5, (100.0,), [0, 0]) is None
    with pytest.raises(ValueError, match="0..1"):
        histogram_quantile(50, (100.0,), [1, 1])


# --- each answer stores its latency -----------------------------------------------------------


async def test_an_answer_stores_its_ttft_and_tpot(make_user, engine_double):
    """Given a model that waits 0.2 s before its first token and 0.1 s between the next ones,
    when an answer is written through the page, then the stored turn has TTFT >= 200 ms and
    TPOT about 100 ms (>= 90, well under the 200 ms a doubled pause would give)."""
    engine_double.scripts = [[0.2, "one", 0.1, " two", 0.1, " three"]]
    client, _ = await signed_in(make_user)
    await answered(client, "Count to three")

    answer = await Turn.objects.aget(role=Turn.Role.ASSISTANT)

    assert answer.ttft_ms is not None and answer.ttft_ms >= 200
    assert answer.tpot_ms is not None and 90 <= answer.tpot_ms < 200


async def test_a_one_token_answer_has_a_ttft_and_no_tpot(make_user, engine_double):
    engine_double.scripts = [["Yes."]]
    client, _ = await signed_in(make_user)
    await answered(client, "Is it?")

    answer = await Turn.objects.aget(role=Turn.Role.ASSISTANT)

    assert answer.ttft_ms is not None and answer.tpot_ms is None


# --- the canary page ------------------------------------------------------------------------


def answers_of(make_user, version: str, ttfts_ms: list[float], *, failed: int = 0, tpot_ms: float = 50.0):
    """Stored answers of pool mini at ``version`` with these TTFTs; the last ``failed`` failed."""
    owner = make_user()
    conversation = services.conversation_create(owner=owner)
    turns = []
    for i, ttft in enumerate(ttfts_ms):
        question = services.turn_append_user(conversation=conversation, content=f"q{i}")
        status = Turn.Status.FAILED if i >= len(ttfts_ms) - failed else Turn.Status.COMPLETE
        turn = services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
            content="a", status=status, prompt_tokens=5, completion_tokens=9, pool="mini",
            model_version=version,
        )  # fmt: skip
        Turn.objects.filter(pk=turn.pk).update(ttft_ms=ttft, tpot_ms=tpot_ms)
        turns.append(turn)
    return conversation, turns


@pytest.fixture
def canary(settings):
    settings.CHAT_CANARIES = [{"pool": "mini", "version": "smollm2-135m-2", "percent": 10}]
    return "smollm2-135m-2"


@pytest.fixture
def staff(admin_user):
    client = Client()
    client.force_login(admin_user)
    return client


def test_version_health_sets_the_canary_beside_the_stable_version(make_user, canary):
    """Given 10 stable answers at 150 ms TTFT and 10 canary answers at 600 ms, 2 of them failed,
    and a thumbs down on the canary, then the stable row comes first, the canary row has a 20%
    error rate, a TTFT p50 in its bucket (500-800 ms) above the stable one's (100-200 ms), and
    the thumbs down."""
    answers_of(make_user, STABLE, [150.0] * 10)
    conversation, turns = answers_of(make_user, canary, [600.0] * 10, failed=2)
    Feedback.objects.create(
        conversation=conversation, turn_id=turns[0].turn_id, user=conversation.owner, rating="down",
        pool="mini", model_version=canary,
    )  # fmt: skip

    rows = [r for r in version_health() if r.pool == "mini"]

    assert [(r.model_version, r.role) for r in rows] == [(STABLE, "stable"), (canary, "canary")]
    stable, new = rows
    assert (stable.answers, stable.failed, stable.error_rate) == (10, 0, 0.0)
    assert (new.answers, new.failed, new.error_rate) == (10, 2, 0.2)
    assert 100 < stable.ttft_p50_ms <= 200 and 500 < new.ttft_p50_ms <= 800
    assert 20 < new.tpot_p99_ms <= 50
    assert (new.up, new.down, new.up_share) == (0, 1, 0.0)


def test_version_health_window_leaves_out_older_answers(make_user, canary):
    _, turns = answers_of(make_user, canary, [600.0] * 3)
    Turn.objects.filter(pk__in=[t.pk for t in turns[:2]]).update(
        created_at=timezone.now() - dt.timedelta(days=10)
    )

    [row] = [r for r in version_health(since=timezone.now() - dt.timedelta(days=7)) if r.pool == "mini"]

    assert row.answers == 1


def test_the_canary_page_shows_both_versions_for_staff(make_user, canary, staff):
    answers_of(make_user, STABLE, [150.0] * 4)
    answers_of(make_user, canary, [600.0] * 4, failed=1)

    response = staff.get(reverse("admin:feedback_feedback_canary"), {"days": "all"})

    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-model-version="{STABLE}" data-role="stable"' in html
    assert f'data-model-version="{canary}" data-role="canary"' in html
    assert '<td class="error-rate">25%</td>' in html
    assert reverse("admin:feedback_feedback_canary") in staff.get(
        reverse("admin:feedback_feedback_changelist")
    ).content.decode()


def test_the_canary_page_is_for_staff_only(make_user):
    client = Client()
    client.force_login(make_user("ann"))

    response = client.get(reverse("admin:feedback_feedback_canary"))

    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
