"""The Django admin (issue 8): every list, filter, search and change page renders for a
superuser with data present; staff only; choosing a region's database; deleting a user as the
account's owner would. Searches, filters and feedback counts: test_admin_search.py; the
read-only turn log and API keys: test_admin_readonly.py.

With one database (this suite) regions are labels; the admin across region databases is
tests/test_admin_regions.py.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.contrib.admin.sites import site as admin_site
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

from conversations import services
from conversations.admin import ConversationAdmin
from conversations.models import Conversation, Turn
from feedback.models import Feedback
from tests.admin_support import MODELS, change, changelist, data, staff  # noqa: F401 - fixtures
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db


# --- every page renders ----------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_changelist_renders_with_data(data, staff, model):
    response = staff.get(changelist(model))

    assert response.status_code == 200


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_filter_choice_and_the_facet_counts_render(data, staff, model):
    """Given data, when each choice of each filter of the list is followed (as its link does),
    then each page renders (200, not the ?e=1 redirect of a bad lookup); so does the list with
    facet counts."""
    cl = staff.get(changelist(model)).context["cl"]
    choices = [c["query_string"] for spec in cl.filter_specs for c in spec.choices(cl)]

    statuses = {q: staff.get(changelist(model) + q).status_code for q in choices}

    assert set(statuses.values()) <= {200}, statuses
    assert staff.get(changelist(model), {"_facets": "1"}).status_code == 200


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_search_and_date_drilldown_renders(data, staff, model):
    model_admin = admin_site._registry[model]
    if model_admin.search_fields:
        for term in ("ann", str(data["conversation"].pk), "lisbon", '"two words"'):
            assert staff.get(changelist(model), {"q": term}).status_code == 200, term
    if model_admin.date_hierarchy:
        today = timezone.now()
        field = model_admin.date_hierarchy
        params = {f"{field}__year": today.year, f"{field}__month": today.month, f"{field}__day": today.day}
        assert staff.get(changelist(model), params).status_code == 200


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_change_page_renders(data, staff, model):
    """The change (or view-only) page of the first listed row of each model renders."""
    rows = staff.get(changelist(model)).context["cl"].result_list
    assert rows, f"no {model._meta.label} rows in this test's data"

    response = staff.get(change(model, rows[0].pk))

    assert response.status_code == 200


def test_each_of_the_tests_models_has_rows(data, staff):
    """The data fixture gives every registered model something to show (so the change-page
    test above checks a real row of each)."""
    empty = [m._meta.label for m in MODELS if not staff.get(changelist(m)).context["cl"].result_list]
    assert empty == []


# --- staff only ------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_non_staff_and_anonymous_visitors_are_sent_to_the_admin_sign_in(data, model):
    user_client = Client()
    user_client.force_login(data["ann"])

    for client in (user_client, Client()):
        response = client.get(changelist(model))
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_the_feedback_summary_is_for_staff_only(data):
    client = Client()
    client.force_login(data["ann"])

    response = client.get(reverse("admin:feedback_feedback_summary"))

    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))


def test_staff_without_view_permission_cannot_see_the_feedback_summary(data, make_user):
    client = Client()
    client.force_login(make_user("helpdesk", is_staff=True))

    response = client.get(reverse("admin:feedback_feedback_summary"))

    assert response.status_code == 403


# --- regional admins: choosing the database (the behaviour against real region databases is
# --- tests/test_admin_regions.py) ---------------------------------------------------------


TWO_REGIONS = {
    "CHAT_REGION_DATABASES": {"us-east": "region_us-east", "eu-west": "default"},
    "CHAT_REGIONS": ("eu-west", "us-east", "ap-south"),
    "CHAT_DEFAULT_REGION": "eu-west",
}


@override_settings(**TWO_REGIONS)
@pytest.mark.parametrize(
    ("query", "expected"),
    [({}, "default"), ({"region": "us-east"}, "region_us-east"), ({"region": "ap-south"}, "default"),
     ({"_changelist_filters": "region=us-east"}, "region_us-east")],
)  # fmt: skip
def test_a_regional_list_reads_the_chosen_regions_database(query, expected):
    """With a database per region, the list reads the chosen region's (a region without a
    database, or none chosen: the default region's), also from a change page's preserved
    filters. No query runs: only the database a queryset is bound to is checked."""
    request = RequestFactory().get("/", query)

    assert admin_site._registry[Conversation].get_queryset(request).db == expected
    assert admin_site._registry[Feedback].get_queryset(request).db == expected


@override_settings(**TWO_REGIONS)
def test_user_conditions_in_a_regions_database_use_ids_not_a_join(data):
    """In a region's own database (no accounts tables there) a search on users becomes a list
    of user ids looked up in default; in default it stays a join."""
    model_admin: ConversationAdmin = admin_site._registry[Conversation]
    regional = Conversation.objects.using("region_us-east").all()

    condition = model_admin.user_q(regional, "owner", email__icontains="ann@")

    assert condition.children == [("owner_id__in", [data["ann"].pk])]
    joined = model_admin.user_q(Conversation.objects.using("default"), "owner", email__icontains="ann@")
    assert joined.children == [("owner__email__icontains", "ann@")]


def test_the_region_filter_lists_every_region_with_one_database(data, staff):
    html = staff.get(changelist(Conversation)).content.decode()
    assert "?region=eu-west" in html and "?region=us-east" in html


# --- deleting a user -------------------------------------------------------------------------


def test_deleting_a_user_in_the_admin_deletes_the_account_as_its_owner_would(data, staff):
    """Issue 10: the admin's delete goes through privacy.services.account_delete: the person's
    conversations and keys are gone, their usage is kept without their id."""
    from privacy.models import AccountDeletion  # noqa: F401, PLC0415 - the app is installed

    bob = data["bob"]
    conversation = services.conversation_create(owner=bob, title="Bob's notes")
    services.turn_append_user(conversation=conversation, content="hello")
    UsageRecord.objects.create(
        user=bob, turn_id=uuid.uuid4(), conversation_id=conversation.pk, pool="mini",
        model_version="smollm2-135m-1", tier="free", prompt_tokens=5, completion_tokens=1,
        cost_usd=Decimal("0.000001"),
    )  # fmt: skip
    response = staff.post(reverse("admin:accounts_user_delete", args=[bob.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not type(bob).objects.filter(pk=bob.pk).exists()
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Turn.objects.filter(conversation_id=conversation.pk).exists()
    assert UsageRecord.objects.filter(user__isnull=True, prompt_tokens=5).count() == 1


def test_the_admin_refuses_to_delete_the_last_owner_of_an_organisation_and_says_why(data, staff):
    ann = data["ann"]
    response = staff.post(reverse("admin:accounts_user_delete", args=[ann.pk]), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "only owner of Acme" in response.content.decode()
    assert type(ann).objects.filter(pk=ann.pk, is_active=True).exists()
    assert Conversation.objects.filter(pk=data["conversation"].pk).exists()
