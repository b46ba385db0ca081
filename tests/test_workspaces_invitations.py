"""Invitations into an organisation (issue 8): by link and by email (sent through
django.core.mail; the test runner's locmem backend collects it in mail.outbox), single use,
expiry, withdrawal, the wrong account, and what the invitee sees at each refusal.

People and organisations: the ``acme`` fixture of tests/test_workspaces.py.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.test import Client
from django.utils import timezone

from accounts.models import Membership, Organisation
from tests.test_workspaces import acme, client_for  # noqa: F401 - the fixture
from workspaces import invitations, selectors, services
from workspaces.models import Invitation

pytestmark = pytest.mark.django_db

LINK = re.compile(r"http://testserver(/invitations/[A-Za-z0-9_-]+/)")


def invite(acme, who: str = "owner", **data) -> tuple[object, str]:
    """Invite through the invitations page as ``who``; returns (response, the link's path)."""
    response = client_for(acme, who).post(
        "/orgs/acme/invitations/", {"email": "", "role": "member", **data}
    )
    found = LINK.search(response.content.decode())
    return response, found.group(1) if found else ""


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def is_member(acme, user) -> bool:
    return Membership.objects.filter(organisation=acme["org"], user=user).exists()


# --- by link ------------------------------------------------------------------------------------


def test_a_link_invitation_lets_whoever_opens_it_join_with_its_role(acme, make_user):
    response, path = invite(acme, role="admin")
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    newcomer = make_user("nina")
    client = signed_in(newcomer)

    page = client.get(path)
    assert page.status_code == 200
    assert "olga invited you to join <strong>Acme</strong> as admin" in page.content.decode()

    accepted = client.post(path)
    assert accepted.status_code == 303 and accepted["Location"] == "/orgs/acme/"
    assert Membership.objects.get(organisation=acme["org"], user=newcomer).role == "admin"
    invitation = Invitation.objects.get()
    assert invitation.accepted_by == newcomer and invitation.accepted_at is not None


def test_the_link_is_shown_once_and_only_its_hash_is_stored(acme):
    _, path = invite(acme)
    token = path.split("/")[2]
    invitation = Invitation.objects.get()
    assert (
        invitation.token_hash == invitations.token_hash(token) and token not in invitation.token_hash
    )
    listing = client_for(acme, "owner").get("/orgs/acme/invitations/").content.decode()
    assert token not in listing
    assert f'data-invitation="{invitation.pk}"' in listing  # listed as pending, without its secret


def test_an_anonymous_visitor_is_sent_to_sign_in_and_back(acme):
    _, path = invite(acme)
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


# --- by email -----------------------------------------------------------------------------------


def test_an_email_invitation_is_sent_with_a_link_that_works_for_that_address(acme, make_user):
    response, shown = invite(acme, email="Nina@Example.COM")
    assert response.status_code == 201
    assert "The invitation was emailed to Nina@example.com" in response.content.decode()
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["Nina@example.com"]
    assert message.subject == "Invitation to join Acme"
    assert "olga invited you to join the organisation Acme as member" in message.body
    path = LINK.search(message.body).group(1)
    assert path == shown

    nina = make_user("nina", email="nina@example.com")  # the same address, another case
    assert signed_in(nina).post(path).status_code == 303
    assert is_member(acme, nina)


def test_an_email_invitation_accepted_by_another_account_is_refused_and_stays_usable(
    acme, make_user
):
    invite(acme, email="nina@example.com")
    path = LINK.search(mail.outbox[0].body).group(1)
    wrong = make_user("walt", email="walt@example.com")

    for response in (signed_in(wrong).get(path), signed_in(wrong).post(path)):
        assert response.status_code == 403
        text = response.content.decode()
        assert "This invitation is for n***@example.com, but you are signed in as walt" in text
        assert "nina@example.com" not in text  # the address is not handed to whoever holds the link
    assert not is_member(acme, wrong)
    assert Invitation.objects.get().accepted_at is None

    nina = make_user("nina", email="nina@example.com")
    assert signed_in(nina).post(path).status_code == 303  # the right person still can


def test_an_account_without_an_address_may_accept_an_email_invitation(acme, make_user):
    """Sign-up asks for no email address; the link reached them through the invited mailbox."""
    invite(acme, email="nina@example.com")
    path = LINK.search(mail.outbox[0].body).group(1)
    nina = make_user("nina")  # email ""
    assert signed_in(nina).post(path).status_code == 303
    assert is_member(acme, nina)


class FailingBackend(BaseEmailBackend):
    """An email backend whose server is down."""

    def send_messages(self, messages):
        raise ConnectionRefusedError("no mail server")


def test_when_the_email_cannot_be_sent_the_inviter_is_told_and_gets_the_link(acme, settings):
    settings.EMAIL_BACKEND = "tests.test_workspaces_invitations.FailingBackend"
    response, path = invite(acme, email="nina@example.com")
    assert response.status_code == 201
    assert "could not be sent" in response.content.decode()
    assert path and Invitation.objects.get().email == "nina@example.com"


def test_a_bad_address_is_refused_and_nothing_is_sent(acme):
    response, _ = invite(acme, email="not an address")
    assert response.status_code == 400
    assert "is not an email address" in response.content.decode()
    assert mail.outbox == [] and not Invitation.objects.exists()


def test_an_admin_may_invite_members_but_not_admins(acme):
    refused, _ = invite(acme, "admin", role="admin")
    assert refused.status_code == 400
    assert "Select a valid choice" in refused.content.decode()
    allowed, _ = invite(acme, "admin", role="member")
    assert allowed.status_code == 201
    assert list(Invitation.objects.values_list("role", flat=True)) == ["member"]


def test_nobody_can_be_invited_straight_in_as_owner(acme):
    response, _ = invite(acme, role="owner")
    assert response.status_code == 400
    assert not Invitation.objects.exists()


# --- refusals -----------------------------------------------------------------------------------


def test_an_expired_invitation_is_refused_with_when_it_expired(acme, make_user):
    _, path = invite(acme)
    Invitation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    nina = make_user("nina")
    response = signed_in(nina).post(path)
    assert response.status_code == 410
    assert "This invitation to Acme expired on" in response.content.decode()
    assert not is_member(acme, nina)


def test_an_invitation_expires_after_the_configured_days(acme, settings):
    settings.CHAT_WORKSPACE_INVITATION_TTL_DAYS = 2
    invite(acme)
    lifetime = Invitation.objects.get().expires_at - timezone.now()
    assert timedelta(days=2) - timedelta(minutes=1) < lifetime <= timedelta(days=2)


def test_a_withdrawn_invitation_stops_working_at_once(acme, make_user):
    _, path = invite(acme)
    nina = make_user("nina")
    assert signed_in(nina).get(path).status_code == 200
    invitation = Invitation.objects.get()
    assert (
        client_for(acme, "owner").post(f"/orgs/acme/invitations/{invitation.pk}/revoke").status_code
        == 303
    )

    response = signed_in(nina).post(path)
    assert response.status_code == 410
    assert "This invitation to Acme was withdrawn" in response.content.decode()
    assert not is_member(acme, nina)
    listing = client_for(acme, "owner").get("/orgs/acme/invitations/").content.decode()
    assert f'data-invitation="{invitation.pk}"' not in listing


def test_an_invitation_works_once(acme, make_user):
    _, path = invite(acme)
    first, second = make_user("nina"), make_user("ned")
    assert signed_in(first).post(path).status_code == 303
    response = signed_in(second).post(path)
    assert response.status_code == 410
    assert "has already been used; each invitation works once" in response.content.decode()
    assert not is_member(acme, second)


def test_an_unknown_or_mangled_link_is_a_404_saying_what_to_do(acme, make_user):
    _, path = invite(acme)
    client = signed_in(make_user("nina"))
    for bad in (path[:-5] + "/", "/invitations/nonsense/"):
        response = client.get(bad)
        assert response.status_code == 404
        assert "This invitation link is not valid" in response.content.decode()


def test_a_member_opening_an_invitation_is_told_and_it_stays_unused(acme):
    _, path = invite(acme)
    response = client_for(acme, "member").post(path)
    assert response.status_code == 409
    assert "You are already a member of Acme" in response.content.decode()
    assert Invitation.objects.get().accepted_at is None


def test_an_invitation_of_another_organisation_cannot_be_withdrawn_from_this_one(acme):
    globex_seat = selectors.seat_get(slug="globex", user=acme["other_org"])
    theirs = invitations.invitation_create(seat=globex_seat)
    response = client_for(acme, "owner").post(
        f"/orgs/acme/invitations/{theirs.invitation.pk}/revoke"
    )
    assert response.status_code == 404
    theirs.invitation.refresh_from_db()
    assert theirs.invitation.revoked_at is None


def test_a_removed_members_old_invitations_still_work_for_whom_they_were_meant(acme, make_user):
    """Invitations belong to the organisation, not to the admin who made them."""
    _, path = invite(acme, "admin")
    owner_seat = selectors.seat_get(slug="acme", user=acme["owner"])
    services.member_remove(
        seat=owner_seat,
        membership=Membership.objects.get(organisation=acme["org"], user=acme["admin"]),
    )
    nina = make_user("nina")
    assert signed_in(nina).post(path).status_code == 303
    assert is_member(acme, nina)


# --- the admin --------------------------------------------------------------------------------


def test_the_admin_lists_invitations_by_state_and_withdraws_them(acme, django_user_model):
    seat = selectors.seat_get(slug="acme", user=acme["owner"])
    pending = invitations.invitation_create(seat=seat, email="nina@example.com").invitation
    used = invitations.invitation_create(seat=seat)
    invitations.invitation_accept(token=used.token, user=django_user_model.objects.create_user("ned"))
    staff = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = signed_in(staff)

    listing = client.get("/admin/workspaces/invitation/?state=pending").content.decode()
    assert "nina@example.com" in listing and f"/{used.invitation.pk}/change/" not in listing
    assert (
        client.get("/admin/workspaces/invitation/add/").status_code == 403
    )  # secrets are not made here

    response = client.post(
        "/admin/workspaces/invitation/",
        {"action": "withdraw", "_selected_action": [pending.pk, used.invitation.pk]},
    )
    assert response.status_code == 302
    pending.refresh_from_db()
    used.invitation.refresh_from_db()
    assert pending.revoked_at is not None
    assert used.invitation.revoked_at is None  # an accepted one stays accepted


def test_opening_an_invitation_you_accepted_says_you_joined(acme, make_user):
    _, path = invite(acme)
    nina = make_user("nina")
    client = signed_in(nina)
    assert client.post(path).status_code == 303
    again = client.get(path)
    assert again.status_code == 409
    assert "You already joined Acme with this invitation" in again.content.decode()


def test_an_organisation_name_cannot_break_the_email_headers(acme):
    """Names are one line when made on the page; one edited in the admin is made one line for
    the subject (Django refuses a header with a newline: that would be a 500)."""
    Organisation.objects.filter(pk=acme["org"].pk).update(name="Acme\nBcc: everyone@example.com")
    response, _ = invite(acme, email="nina@example.com")
    assert response.status_code == 201
    assert mail.outbox[0].subject == "Invitation to join Acme Bcc: everyone@example.com"
    assert mail.outbox[0].bcc == []
