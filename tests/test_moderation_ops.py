"""Operating moderation: an organisation's moderation page (who may see it, validation, saving),
the organisation admin's checks of the same fields, and the Turn admin's moderation filter.

Defaults are the deployment's (chatsite/settings/moderation.py CHAT_MODERATION_THRESHOLDS).
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from django.conf import settings
from django.contrib.admin.sites import site as admin_site
from django.test import Client

from accounts.models import Membership, Organisation
from conversations import services
from conversations.models import Turn
from moderation.forms import (
    MAX_BLOCKED_TERMS,
    MAX_TERM_CHARS,
    ModerationPolicyForm,
    OrganisationAdminForm,
)

pytestmark = pytest.mark.django_db

PAGE = "/orgs/{}/moderation/"


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def acme(make_user):
    """Organisation "acme" with owner olga, admin adam and member mia; bob owns "other"."""
    org = Organisation.objects.create(name="Acme", slug="acme")
    other = Organisation.objects.create(name="Other", slug="other")
    people = {}
    for name, role in [("olga", "owner"), ("adam", "admin"), ("mia", "member")]:
        people[name] = make_user(name)
        Membership.objects.create(organisation=org, user=people[name], role=role)
    people["bob"] = make_user("bob")
    Membership.objects.create(organisation=other, user=people["bob"], role="owner")
    people["org"], people["other"] = org, other
    return people


class _Controls(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: dict[str, dict[str, str | None]] = {}
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("input", "textarea") and attrs.get("name"):
            self.found[attrs["name"]] = attrs
            if tag == "textarea":
                self._textarea = attrs["name"]
                attrs["text"] = ""

    def handle_data(self, data):
        if self._textarea:
            self.found[self._textarea]["text"] += data

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None


def controls(html: str) -> dict[str, dict[str, str | None]]:
    """The page's form controls by name -> their attributes (a textarea's content: "text")."""
    parser = _Controls()
    parser.feed(html)
    return parser.found


def policy_post(**overrides) -> dict:
    """A complete, valid POST of the form: every threshold blank, no terms, fail-open off."""
    data = {f"threshold_{c}": "" for c in settings.CHAT_MODERATION_THRESHOLDS}
    data["blocked_terms"] = ""
    data.update(overrides)
    return data


# --- who may see the page ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("olga", "acme", 200),  # owner
        ("adam", "acme", 200),  # admin
        ("mia", "acme", 404),  # plain member
        ("bob", "acme", 404),  # another organisation's owner
        ("bob", "other", 200),
        ("olga", "no-such-org", 404),
    ],
)
def test_moderation_page_is_for_the_orgs_owners_and_admins_only(acme, who, slug, status):
    response = client_for(acme[who]).get(PAGE.format(slug))
    assert response.status_code == status
    if status == 404:
        assert b"moderation-form" not in response.content and b"Acme" not in response.content


def test_moderation_page_sends_anonymous_visitors_to_sign_in_without_showing_the_org(acme):
    response = Client().get(PAGE.format("acme"))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    # Same answer for an organisation that does not exist: nothing is revealed.
    assert Client().get(PAGE.format("no-such-org")).status_code == 302


@pytest.mark.parametrize("who", ["mia", "bob"])
def test_members_and_outsiders_cannot_change_the_policy(acme, who):
    response = client_for(acme[who]).post(
        PAGE.format("acme"), policy_post(threshold_offensive="0.1", blocked_terms="x",
                                         moderation_fail_open="on"),
    )  # fmt: skip
    assert response.status_code == 404
    acme["org"].refresh_from_db()
    assert acme["org"].moderation_thresholds == {}
    assert acme["org"].blocked_terms == []
    assert acme["org"].moderation_fail_open is False


def test_post_without_csrf_token_is_refused(acme):
    client = Client(enforce_csrf_checks=True)
    client.force_login(acme["olga"])
    response = client.post(PAGE.format("acme"), policy_post(moderation_fail_open="on"))
    assert response.status_code == 403
    acme["org"].refresh_from_db()
    assert acme["org"].moderation_fail_open is False


# --- what the page shows -------------------------------------------------------------------


def test_page_shows_each_categorys_default_and_fail_open_off_with_its_warning(acme):
    html = client_for(acme["olga"]).get(PAGE.format("acme")).content.decode()

    found = controls(html)
    for category, default in settings.CHAT_MODERATION_THRESHOLDS.items():
        assert f'data-category="{category}"' in html
        field = found[f"threshold_{category}"]
        assert (field["placeholder"], field.get("value")) == (str(default), None)
        assert (field["min"], field["max"]) == ("0", "1")
    assert 'id="fail-open-warning"' in html and "unchecked" in html
    assert "checked" not in found["moderation_fail_open"]  # off by default
    assert found["blocked_terms"]["text"].strip() == ""
    assert "csrfmiddlewaretoken" in found


def test_page_shows_the_orgs_saved_policy(acme):
    org = acme["org"]
    org.moderation_thresholds = {"offensive": 0.9}
    org.blocked_terms = ["project falcon", "acme secret"]
    org.moderation_fail_open = True
    org.save()

    html = client_for(acme["adam"]).get(PAGE.format("acme")).content.decode()

    found = controls(html)
    assert found["threshold_offensive"]["value"] == "0.9"
    assert "value" not in found["threshold_prompt_injection"]  # blank: the default applies
    assert found["blocked_terms"]["text"].strip() == "project falcon\nacme secret"
    assert "checked" in found["moderation_fail_open"]


# --- saving ------------------------------------------------------------------------------------


def test_saving_stores_thresholds_terms_and_fail_open_on_the_org(acme):
    client = client_for(acme["olga"])
    response = client.post(
        PAGE.format("acme"),
        policy_post(
            threshold_offensive="0.9",
            threshold_prompt_injection="0.35",
            blocked_terms=(
                "  Project   Falcon \n\nacme secret\nproject falcon\n  \nACME SECRET\nzeta"
            ),
            moderation_fail_open="on",
        ),
    )

    assert response.status_code == 303
    assert response["Location"] == PAGE.format("acme")
    org = Organisation.objects.get(slug="acme")
    # Blank thresholds are not stored: the deployment default keeps applying to them.
    assert org.moderation_thresholds == {"offensive": 0.9, "prompt_injection": 0.35}
    # Trimmed, inner spaces collapsed, repeats (ignoring case) dropped, first spelling kept.
    assert org.blocked_terms == ["Project Falcon", "acme secret", "zeta"]
    assert org.moderation_fail_open is True
    confirmation = client.get(response["Location"]).content.decode()
    assert 'id="saved"' in confirmation and "next message" in confirmation


def test_saved_policy_is_what_the_next_turns_check_applies(acme):
    """The gates read the organisation at each turn (moderation.verdicts.policy_for): what the
    page saved is the policy, the defaults fill the blanks, and a saved term stops a message."""
    from moderation.base import moderator  # noqa: PLC0415
    from moderation.verdicts import policy_for  # noqa: PLC0415

    client_for(acme["olga"]).post(
        PAGE.format("acme"),
        policy_post(threshold_offensive="0.95", blocked_terms="Project Falcon",
                    moderation_fail_open="on"),
    )  # fmt: skip

    policy = policy_for(Organisation.objects.get(slug="acme"))
    assert policy.thresholds["offensive"] == 0.95
    assert policy.thresholds["prompt_injection"] == settings.CHAT_MODERATION_THRESHOLDS[
        "prompt_injection"
    ]
    assert policy.blocked_terms == ("Project Falcon",) and policy.fail_open is True
    verdict = moderator().check_input("What is the status of project falcon?", policy)
    assert verdict.flagged and "blocked_term" in verdict.categories
    assert not moderator().check_input("What is the status of project eagle?", policy).flagged


def test_clearing_fields_returns_to_the_defaults(acme):
    org = acme["org"]
    org.moderation_thresholds = {"offensive": 0.9, "unsafe": 0.2}
    org.blocked_terms = ["falcon"]
    org.moderation_fail_open = True
    org.save()

    response = client_for(acme["adam"]).post(PAGE.format("acme"), policy_post())

    assert response.status_code == 303
    org.refresh_from_db()
    assert org.moderation_thresholds == {} and org.blocked_terms == []
    assert org.moderation_fail_open is False


def test_saving_writes_only_the_moderation_fields(acme):
    """A form loaded before someone else changed the org's tier does not undo that change."""
    org = acme["org"]
    form = ModerationPolicyForm(policy_post(threshold_unsafe="0.4"), instance=org)
    Organisation.objects.filter(pk=org.pk).update(tier="free", name="Acme Ltd")

    assert form.is_valid(), form.errors
    form.save()

    org = Organisation.objects.get(pk=org.pk)
    assert (org.tier, org.name) == ("free", "Acme Ltd")
    assert org.moderation_thresholds == {"unsafe": 0.4}


def test_the_other_orgs_policy_is_untouched(acme):
    client_for(acme["olga"]).post(PAGE.format("acme"), policy_post(blocked_terms="falcon"))
    acme["other"].refresh_from_db()
    assert acme["other"].blocked_terms == []


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1.01", "-0.1", "abc", "nan", "inf"])
def test_threshold_outside_zero_to_one_is_refused_and_nothing_is_saved(acme, value):
    response = client_for(acme["olga"]).post(
        PAGE.format("acme"), policy_post(threshold_offensive=value, blocked_terms="falcon")
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert 'role="alert"' in html
    acme["org"].refresh_from_db()
    assert acme["org"].moderation_thresholds == {} and acme["org"].blocked_terms == []


@pytest.mark.parametrize("value", ["0", "1", "0.5"])
def test_thresholds_at_and_inside_the_bounds_are_accepted(acme, value):
    form = ModerationPolicyForm(policy_post(threshold_offensive=value), instance=acme["org"])
    assert form.is_valid(), form.errors
    assert form.thresholds() == {"offensive": float(value)}


def test_too_long_term_is_refused_naming_its_line(acme):
    too_long = "x" * (MAX_TERM_CHARS + 1)
    response = client_for(acme["olga"]).post(
        PAGE.format("acme"), policy_post(blocked_terms=f"fine\n{too_long}")
    )

    assert response.status_code == 400
    errors = response.content.decode()
    assert "Line 2" in errors and f"at most {MAX_TERM_CHARS}" in errors
    acme["org"].refresh_from_db()
    assert acme["org"].blocked_terms == []


def test_term_of_exactly_the_limit_is_accepted(acme):
    term = "y" * MAX_TERM_CHARS
    form = ModerationPolicyForm(policy_post(blocked_terms=f"  {term}  "), instance=acme["org"])
    assert form.is_valid(), form.errors
    assert form.cleaned_data["blocked_terms"] == [term]


def test_too_many_terms_are_refused(acme):
    terms = "\n".join(f"term {i}" for i in range(MAX_BLOCKED_TERMS + 1))
    response = client_for(acme["olga"]).post(PAGE.format("acme"), policy_post(blocked_terms=terms))

    assert response.status_code == 400
    assert f"at most {MAX_BLOCKED_TERMS}" in response.content.decode()
    acme["org"].refresh_from_db()
    assert acme["org"].blocked_terms == []


def test_repeats_do_not_count_towards_the_term_limit(acme):
    terms = [f"term {i}" for i in range(MAX_BLOCKED_TERMS)]
    text = "\n".join(terms + [t.upper() for t in terms[:50]])
    form = ModerationPolicyForm(policy_post(blocked_terms=text), instance=acme["org"])
    assert form.is_valid(), form.errors
    assert form.cleaned_data["blocked_terms"] == terms


# --- organisation admin ------------------------------------------------------------------------


def org_admin_data(org: Organisation, **overrides) -> dict:
    data = {
        "name": org.name, "slug": org.slug, "tier": org.tier, "region": org.region,
        "retention_days": "", "pinned_pool": "", "moderation_thresholds": "{}",
        "blocked_terms": "[]",
    }  # fmt: skip
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("thresholds", "message"),
    [
        ('{"offensive": 1.5}', "from 0 to 1"),
        ('{"offensive": "high"}', "must be a number"),
        ('{"rudeness": 0.5}', "Unknown category"),
        ("[0.5]", "must be an object"),
    ],
)
def test_org_admin_refuses_bad_thresholds(acme, thresholds, message):
    form = OrganisationAdminForm(
        org_admin_data(acme["org"], moderation_thresholds=thresholds), instance=acme["org"]
    )
    assert not form.is_valid()
    assert message in " ".join(form.errors["moderation_thresholds"])


def test_org_admin_cleans_blocked_terms_like_the_page(acme):
    form = OrganisationAdminForm(
        org_admin_data(acme["org"], blocked_terms='[" Falcon ", "falcon", "x"]',
                       moderation_thresholds='{"offensive": 0.9}'),
        instance=acme["org"],
    )  # fmt: skip
    assert form.is_valid(), form.errors
    org = form.save()
    org.refresh_from_db()
    assert org.blocked_terms == ["Falcon", "x"]
    assert org.moderation_thresholds == {"offensive": 0.9}

    too_many = OrganisationAdminForm(
        org_admin_data(acme["org"], blocked_terms=json.dumps([f"t{i}" for i in range(501)])),
        instance=acme["org"],
    )
    assert not too_many.is_valid() and "at most 500" in " ".join(too_many.errors["blocked_terms"])


def test_org_admin_lists_and_edits_the_moderation_fields(acme, make_user):
    org = acme["org"]
    org.blocked_terms = ["a", "b", "c"]
    org.moderation_thresholds = {"offensive": 0.9}
    org.moderation_fail_open = True
    org.save()
    staff = client_for(make_user("root", is_staff=True, is_superuser=True))

    listing = staff.get("/admin/accounts/organisation/", {"moderation_fail_open__exact": "1"})
    change = staff.get(f"/admin/accounts/organisation/{org.pk}/change/").content.decode()

    rows = listing.context["cl"].result_list
    assert [o.slug for o in rows] == ["acme"]  # "other" is fail-closed
    assert "offensive 0.9" in listing.content.decode()
    for field in ("moderation_thresholds", "blocked_terms", "moderation_fail_open"):
        assert f'name="{field}"' in change


# --- Turn admin: the moderation filter ---------------------------------------------------------


FLAGGED = {
    "flagged": True, "categories": ["prompt_injection"], "scores": {"prompt_injection": 0.97},
    "classifier": "local", "version": "local-1", "gate": "input", "error": None,
}  # fmt: skip
FLAGGED_OUTPUT = {
    "flagged": True, "categories": ["system_prompt_leak", "blocked_term"],
    "scores": {"system_prompt_leak": 0.8, "blocked_term": 1.0}, "classifier": "local",
    "version": "local-1", "gate": "output", "error": None,
}  # fmt: skip
FAILED = {
    "flagged": True, "categories": ["moderation_unavailable"], "scores": {},
    "classifier": "local", "version": "local-1", "gate": "input", "error": "timeout",
}  # fmt: skip
CLEAN = {
    "flagged": False, "categories": [], "scores": {"offensive": 0.01}, "classifier": "local",
    "version": "local-1", "gate": "input", "error": None,
}  # fmt: skip


@pytest.fixture
def judged_turns(make_user):
    """Five turns: three flagged (input, output, failed check), one clean, one not checked."""
    owner = make_user("writer")
    conversation = services.conversation_create(owner=owner)
    turns = {}
    for name, verdict in [("flagged", FLAGGED), ("flagged_output", FLAGGED_OUTPUT),
                          ("failed", FAILED), ("clean", CLEAN), ("unchecked", {})]:
        turn = services.turn_append_user(conversation=conversation, content=f"message {name}")
        Turn.objects.filter(pk=turn.pk).update(moderation_verdict=verdict)
        turns[name] = turn.turn_id
    return turns


@pytest.fixture
def staff(make_user) -> Client:
    return client_for(make_user("root", is_staff=True, is_superuser=True))


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("flagged", {"flagged", "flagged_output", "failed"}),
        ("clean", {"clean"}),
        ("unchecked", {"unchecked"}),
        (None, {"flagged", "flagged_output", "failed", "clean", "unchecked"}),
    ],
)
def test_turn_admin_filters_by_moderation_verdict(judged_turns, staff, choice, expected):
    params = {"moderation": choice} if choice else {}
    response = staff.get("/admin/conversations/turn/", params)

    assert response.status_code == 200
    listed = {t.turn_id for t in response.context["cl"].result_list}
    assert listed == {judged_turns[name] for name in expected}


def test_turn_admin_offers_the_three_moderation_choices(judged_turns, staff):
    html = staff.get("/admin/conversations/turn/").content.decode()
    for choice, label in [("flagged", "Flagged"), ("clean", "Clean"), ("unchecked", "Not checked")]:
        assert f"?moderation={choice}" in html and label in html


def test_turn_admin_shows_the_verdicts_categories_and_gate(judged_turns, staff):
    html = staff.get("/admin/conversations/turn/").content.decode()
    assert "flagged: prompt_injection (input)" in html
    assert "flagged: system_prompt_leak, blocked_term (output)" in html
    assert "flagged: moderation_unavailable (input)" in html
    assert "clean (input)" in html


def test_turns_stay_read_only_in_the_admin(judged_turns, staff):
    turn_id = judged_turns["flagged"]
    assert staff.get("/admin/conversations/turn/add/").status_code == 403
    detail = staff.get(f"/admin/conversations/turn/{turn_id}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert admin_site._registry[Turn].has_change_permission(detail.wsgi_request) is False
    staff.post(f"/admin/conversations/turn/{turn_id}/change/", {"content": "rewritten"})
    assert Turn.objects.get(pk=turn_id).content == "message flagged"
