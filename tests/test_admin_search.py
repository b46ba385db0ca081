"""The Django admin's searches and filters an operator uses (issue 8): conversations, turns,
moderated turns, feedback and users found and filtered, and the feedback counts per pool and
model version.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.urls import reverse
from django.utils import timezone

from conversations.models import Conversation, Turn
from feedback.models import Feedback
from moderation.models import ModeratedTurn
from tests.admin_support import change, changelist, data, listed, staff  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


# --- searches and filters an operator uses ---------------------------------------------------


def test_conversations_are_found_by_owner_email_username_title_and_id(data, staff):
    conversation = data["conversation"]
    url = changelist(Conversation)

    for term in ("ann@example.com", "ann", "lisbon", str(conversation.pk)):
        assert listed(staff.get(url, {"q": term})) == {conversation.pk}, term
    assert listed(staff.get(url, {"q": "bob@example.com"})) == set()


def test_conversations_filter_by_owner_tier_org_and_region(data, staff):
    conversation, url = data["conversation"], changelist(Conversation)

    assert listed(staff.get(url, {"tier": "paid"})) == {conversation.pk}
    assert listed(staff.get(url, {"tier": "free"})) == set()
    # ann's conversations belong to her organisation (core/regions.py home_region)
    assert listed(staff.get(url, {"org__id__exact": data["org"].pk})) == {conversation.pk}
    assert listed(staff.get(url, {"org__isnull": "True"})) == set()
    assert listed(staff.get(url, {"region": conversation.region})) == {conversation.pk}


def test_turns_are_found_by_text_and_by_turn_or_conversation_id(data, staff):
    url = changelist(Turn)

    assert listed(staff.get(url, {"q": "pastéis OR nata"})) == {data["answer"].pk}
    assert listed(staff.get(url, {"q": str(data["question"].pk)})) == {data["question"].pk}
    assert len(listed(staff.get(url, {"q": str(data["conversation"].pk)}))) == 4


def test_turns_filter_by_pool_model_version_role_and_status(data, staff):
    url = changelist(Turn)

    assert listed(staff.get(url, {"pool": "frontier"})) == {data["withdrawn"].pk}
    assert listed(staff.get(url, {"model_version": "smollm2-135m-1", "role": "assistant"})) == {
        data["answer"].pk, data["withdrawn"].pk,
    }  # fmt: skip
    assert listed(staff.get(url, {"status__exact": "blocked", "role__exact": "user"})) == {data["blocked"].pk}


def test_moderated_turns_list_only_judged_turns(data, staff):
    """Turns without a verdict (the answer) are not listed; clean and flagged ones are."""
    response = staff.get(changelist(ModeratedTurn))

    assert listed(response) == {data["question"].pk, data["blocked"].pk, data["withdrawn"].pk}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"outcome": "flagged"}, {"blocked", "withdrawn"}),
        ({"outcome": "clean"}, {"question"}),
        ({"category": "prompt_injection"}, {"blocked"}),
        ({"category": "offensive"}, {"withdrawn"}),
        ({"gate": "output"}, {"withdrawn"}),
        ({"status__exact": "blocked"}, {"blocked", "withdrawn"}),
        ({"pool": "frontier"}, {"withdrawn"}),
        ({"role__exact": "user", "outcome": "flagged"}, {"blocked"}),
    ],
)
def test_moderated_turns_filter_by_outcome_category_gate_status_and_pool(data, staff, params, expected):
    response = staff.get(changelist(ModeratedTurn), params)

    assert listed(response) == {data[name].pk for name in expected}


def test_moderated_turns_show_the_verdict_and_a_withdrawn_answer_no_text(data, staff):
    html = staff.get(changelist(ModeratedTurn)).content.decode()

    assert "flagged: prompt_injection (input)" in html
    assert "flagged: offensive (output)" in html
    assert "Ignore your instructions." in html


def test_feedback_is_found_by_comment_username_and_turn_id(data, staff):
    url, feedback = changelist(Feedback), data["feedback"]

    for term in ("centre", "ann@example.com", str(data["answer"].pk)):
        assert listed(staff.get(url, {"q": term})) == {feedback.pk}, term
    assert listed(staff.get(url, {"q": "bob"})) == set()


def test_feedback_filters_and_shows_the_rated_answer(data, staff):
    url = changelist(Feedback)

    assert listed(staff.get(url, {"rating__exact": "down", "pool": "mini", "has_comment": "yes"})) == {
        data["feedback"].pk
    }
    assert listed(staff.get(url, {"rating__exact": "up"})) == set()
    assert listed(staff.get(url, {"tier": "free"})) == set()
    assert "Try the pasteis de nata in Belem." in staff.get(change(Feedback, data["feedback"].pk)).content.decode()


def test_users_are_found_by_email_and_filtered_by_tier_and_organisation(data, staff):
    url = changelist(type(data["ann"]))

    assert listed(staff.get(url, {"q": "ann@example.com"})) == {data["ann"].pk}
    assert data["ann"].pk in listed(staff.get(url, {"tier__exact": "paid"}))
    assert data["bob"].pk not in listed(staff.get(url, {"tier__exact": "paid"}))
    assert listed(staff.get(url, {"organisations__id__exact": data["org"].pk})) == {data["ann"].pk}


# --- feedback counts per pool ----------------------------------------------------------------


def test_feedback_summary_counts_per_pool_and_version(data, staff, make_user):
    """Given thumbs down on mini@smollm2-135m-1 (the fixture's) and two thumbs up on a canary
    version, the summary page shows 0/1 and 2/0 in their rows."""
    conversation = data["conversation"]
    for name in ("c1", "c2"):
        Feedback.objects.create(
            conversation=conversation, turn_id=uuid.uuid4(), user=make_user(name), rating="up",
            pool="mini", model_version="canary-2",
        )  # fmt: skip

    response = staff.get(reverse("admin:feedback_feedback_summary"))

    assert response.status_code == 200
    counts = {(c.pool, c.model_version): (c.up, c.down) for c in response.context["counts"]}
    assert counts == {("mini", "smollm2-135m-1"): (0, 1), ("mini", "canary-2"): (2, 0)}
    assert 'data-model-version="canary-2"' in response.content.decode()


def test_feedback_summary_window_leaves_out_older_ratings(data, staff):
    Feedback.objects.update(updated_at=timezone.now() - dt.timedelta(days=10))

    response = staff.get(reverse("admin:feedback_feedback_summary"), {"days": "7"})

    assert response.status_code == 200 and response.context["counts"] == []


def test_the_feedback_list_links_to_the_summary(data, staff):
    html = staff.get(changelist(Feedback)).content.decode()
    assert reverse("admin:feedback_feedback_summary") in html
