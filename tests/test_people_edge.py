"""Edge inputs on the people and organisation pages (sign-up, organisations, invitations,
policies, sharing with the workspace): what a careless client or a person in an unusual spot
sends gets a 4xx or a form error saying what to do, never a 500 or a lost way back.

People and organisations: the ``acme`` fixture of tests/test_workspaces.py.
"""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client

from accounts.models import Membership, Organisation
from tests.test_workspaces import acme, client_for  # noqa: F401 - the fixture
from workspaces.models import Invitation

pytestmark = pytest.mark.django_db

STRONG = "correct horse battery staple"
INVITATIONS = "/orgs/acme/invitations/"
LINK = re.compile(r"http://testserver(/invitations/[A-Za-z0-9_-]+/)")


# --- policies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["rate_limit_rpm", "rate_limit_tpm"])
def test_a_limit_beyond_what_can_be_stored_is_a_form_error_on_an_unlimited_tier(
    acme, settings, field
):
    # Given a tier whose shared limits are unlimited (no ceiling for owners to stay under)
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": None, "tpm": None}}
    # When an owner types a number larger than the column holds
    response = client_for(acme, "owner").post(
        "/orgs/acme/policies/", {"region": acme["org"].region, field: "99999999999"}
    )
    # Then the form says so (was: 500, integer out of range) and nothing is stored
    assert response.status_code == 400
    assert "less than or equal to" in response.content.decode()
    assert getattr(Organisation.objects.get(pk=acme["org"].pk), field) is None


# --- sharing a conversation with the workspace ------------------------------------------------


@pytest.mark.parametrize("target", ["/\\evil.example/", "/\\/evil.example/", "/\t/evil.example/"])
def test_the_share_redirect_refuses_paths_a_browser_reads_as_another_site(acme, target):
    # Given a "next" a browser turns into //evil.example/ (backslash, tab)
    response = client_for(acme, "member").post(
        f"/c/{acme['shared'].pk}/workspace", {"shared": "1", "next": target}
    )
    # Then the redirect goes to the conversation instead
    assert response.status_code == 303
    assert response["Location"] == f"/c/{acme['shared'].pk}/"


# --- invitations -------------------------------------------------------------------------------


def test_inviting_the_address_of_a_member_is_a_form_error_and_sends_nothing(acme):
    # Given mia (mia@example.com) is a member; when an owner invites her address, in capitals
    response = client_for(acme, "owner").post(
        INVITATIONS, {"email": "MIA@example.com", "role": "member"}
    )
    # Then the form says she is one already; no invitation, no email
    assert response.status_code == 400
    assert "already a member" in response.content.decode()
    assert not Invitation.objects.filter(email__iexact="mia@example.com").exists()
    assert mail.outbox == []


def test_inviting_an_address_twice_points_to_the_pending_invitation(acme):
    # Given a pending invitation for newcomer@example.com
    owner = client_for(acme, "owner")
    first = owner.post(INVITATIONS, {"email": "newcomer@example.com", "role": "member"})
    assert first.status_code == 201
    # When the same address is invited again (another case)
    again = owner.post(INVITATIONS, {"email": "Newcomer@Example.com", "role": "admin"})
    # Then the form says one is pending and how to send a new one; still one invitation
    assert again.status_code == 400
    assert "withdraw it" in again.content.decode()
    assert Invitation.objects.filter(email__iexact="newcomer@example.com").count() == 1
    assert len(mail.outbox) == 1


def test_a_withdrawn_invitation_does_not_stop_inviting_the_address_again(acme):
    owner = client_for(acme, "owner")
    owner.post(INVITATIONS, {"email": "newcomer@example.com", "role": "member"})
    invitation = Invitation.objects.get(email="newcomer@example.com")
    owner.post(f"/orgs/acme/invitations/{invitation.pk}/revoke")
    response = owner.post(INVITATIONS, {"email": "newcomer@example.com", "role": "member"})
    assert response.status_code == 201
    assert Invitation.objects.filter(email="newcomer@example.com").count() == 2


def test_someone_without_an_account_signs_up_from_an_invitation_and_comes_back_to_it(acme):
    # Given a link invitation opened by a visitor with no account
    path = LINK.search(
        client_for(acme, "owner").post(INVITATIONS, {"email": "", "role": "member"})
        .content.decode()
    ).group(1)
    visitor = Client()
    login_url = visitor.get(path)["Location"]
    # When they follow "Sign up" from the sign-in page and create an account
    login_page = visitor.get(login_url).content.decode()
    signup_href = re.search(r'href="(/accounts/signup/[^"]*)"', login_page).group(1)
    signup_page = visitor.get(signup_href.replace("&amp;", "&"))
    next_field = re.search(r'name="next" value="([^"]*)"', signup_page.content.decode())
    response = visitor.post(
        "/accounts/signup/",
        {"username": "newbie", "password1": STRONG, "password2": STRONG,
         "next": next_field.group(1) if next_field else ""},
    )  # fmt: skip
    # Then they land on the invitation again, signed in, and can accept it
    assert response.status_code == 302
    assert response["Location"] == path
    assert visitor.post(path).status_code == 303
    assert Membership.objects.filter(organisation=acme["org"], user__username="newbie").exists()


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil.example/"])
def test_sign_up_never_sends_anyone_off_the_site(target):
    response = Client().post(
        "/accounts/signup/",
        {"username": "newbie", "password1": STRONG, "password2": STRONG, "next": target},
    )
    assert response.status_code == 302
    assert response["Location"] == "/"


# --- URL names and settings pages ------------------------------------------------------------


def test_a_url_name_has_hyphens_where_a_name_or_slug_has_underscores(make_user):
    """Given a name with an underscore, then its URL name has a hyphen there; given a URL name
    with one, then the form says what to use instead, naming the hyphenated one (the help text
    promises letters, digits and hyphens; slugify kept ``_``)."""
    client = Client()
    client.force_login(make_user("pat"))

    made = client.post("/orgs/", {"name": "Data_Team", "slug": "", "region": "eu-west"})
    refused = client.post("/orgs/", {"name": "Ok", "slug": "my_team", "region": "eu-west"})

    assert made.status_code == 303, made.content
    assert Organisation.objects.filter(slug="data-team").exists()
    assert refused.status_code == 400
    assert "(e.g. &#x27;my-team&#x27;)" in refused.content.decode()
    assert not Organisation.objects.filter(slug__contains="_").exists()


@pytest.mark.parametrize("path", ["/settings/api-keys/", "/settings/sessions/"])
def test_a_settings_page_answers_other_methods_with_405(make_user, path):
    """Given a signed-in person, when a settings page is sent PUT or DELETE, then 405 naming the
    methods it takes (was: the page rendered as for GET)."""
    client = Client()
    client.force_login(make_user("pat"))

    for method in (client.put, client.delete):
        response = method(path)
        assert response.status_code == 405, (method, response.status_code)
        assert "GET" in response["Allow"]
    assert client.get(path).status_code == 200
