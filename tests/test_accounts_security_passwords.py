"""Password reset by email and password change (issue 10): single-use links, sessions ended,
strength rules, limits on reset mail, CSRF."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core import mail
from django.test import Client

from accounts.models import UserSession
from tests.conftest import PASSWORD
from tests.test_accounts_security import (  # noqa: F401 - the autouse fixture
    WRONG,
    fresh_throttle_counters,
    is_signed_in,
    sign_in,
)

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "velvet-harbour-quince-58"
RESET_LINK = re.compile(r"https?://[^/\s]+(/accounts/reset/[^/\s]+/[^/\s]+/)")


def request_reset(client: Client, email: str, *, ip: str = "192.0.2.20"):
    return client.post("/accounts/password_reset/", {"email": email}, REMOTE_ADDR=ip)


def reset_link_from_mail() -> str:
    """The path of the link in the newest mail."""
    assert mail.outbox, "no mail was sent"
    match = RESET_LINK.search(mail.outbox[-1].body)
    assert match, mail.outbox[-1].body
    return match.group(1)


def follow_reset_link(client: Client, link: str, password: str = NEW_PASSWORD):
    """Open the link (Django moves the token into the session and redirects to a
    .../set-password/ URL), then submit the new password."""
    opened = client.get(link)
    assert opened.status_code == 302, opened.status_code
    form_url = opened["Location"]
    return client.post(form_url, {"new_password1": password, "new_password2": password})


# --- reset ------------------------------------------------------------------------------------------


def test_reset_mails_a_link_that_sets_a_new_password(make_user):
    """Given an account with an email, when a reset is asked for and its link followed, then the
    new password signs in and the old one does not."""
    make_user("rosa", email="rosa@example.org")
    response = request_reset(Client(), "rosa@example.org")
    assert response.status_code == 302 and response["Location"] == "/accounts/password_reset/done/"
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["rosa@example.org"]
    assert mail.outbox[0].subject == "Reset your password"

    done = follow_reset_link(Client(), reset_link_from_mail())
    assert done.status_code == 302 and done["Location"] == "/accounts/reset/done/"
    assert sign_in(Client(), "rosa", NEW_PASSWORD).status_code == 302
    assert sign_in(Client(), "rosa", PASSWORD).status_code == 400


def test_a_reset_link_works_only_once(make_user):
    make_user("sam", email="sam@example.org")
    request_reset(Client(), "sam@example.org")
    link = reset_link_from_mail()
    follow_reset_link(Client(), link)

    again = Client().get(link, follow=True)
    assert again.status_code == 200
    assert not again.context["validlink"]
    assert "This link no longer works" in again.content.decode()
    # Posting a password through it changes nothing either.
    Client().post(link, {"new_password1": "another-new-pass-77", "new_password2": "another-new-pass-77"})
    assert sign_in(Client(), "sam", "another-new-pass-77").status_code == 400
    assert sign_in(Client(), "sam", NEW_PASSWORD).status_code == 302


def test_a_reset_signs_the_account_out_everywhere(make_user):
    """A session signed in before the reset (maybe the intruder's) is over after it, and is
    gone from the session store and the sessions list."""
    make_user("tina", email="tina@example.org")
    other = Client()
    assert sign_in(other, "tina").status_code == 302
    other_key = other.session.session_key

    request_reset(Client(), "tina@example.org")
    follow_reset_link(Client(), reset_link_from_mail())

    response = other.get("/settings/sessions/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert not Session.objects.filter(session_key=other_key).exists()
    assert not UserSession.objects.filter(user__username="tina").exists()


def test_a_reset_unlocks_a_locked_account(make_user, django_capture_on_commit_callbacks):
    """The lockout message says "or reset your password": a completed reset lifts the lock."""
    make_user("uma", email="uma@example.org")
    for i in range(5):
        sign_in(Client(), "uma", WRONG, ip=f"198.51.100.{i + 30}")
    assert sign_in(Client(), "uma").status_code == 429

    request_reset(Client(), "uma@example.org")
    with django_capture_on_commit_callbacks(execute=True):
        follow_reset_link(Client(), reset_link_from_mail())
    assert sign_in(Client(), "uma", NEW_PASSWORD).status_code == 302


def test_a_reset_verifies_the_email(make_user):
    user = make_user("vera", email="vera@example.org")
    assert not user.email_is_verified
    request_reset(Client(), "vera@example.org")
    follow_reset_link(Client(), reset_link_from_mail())
    user.refresh_from_db()
    assert user.email_is_verified


def test_an_unknown_email_looks_the_same_and_sends_nothing():
    response = request_reset(Client(), "nobody@example.org")
    assert response.status_code == 302 and response["Location"] == "/accounts/password_reset/done/"
    assert mail.outbox == []


def test_a_reset_refuses_a_weak_new_password(make_user):
    make_user("walt", email="walt@example.org")
    request_reset(Client(), "walt@example.org")
    response = follow_reset_link(Client(), reset_link_from_mail(), password="qwerty123456")
    assert response.status_code == 400
    assert "too common" in response.content.decode()
    assert sign_in(Client(), "walt", PASSWORD).status_code == 302


def test_reset_mail_to_one_address_is_limited(make_user, settings):
    """Past CHAT_ACCOUNTS_RESET_EMAIL_LIMIT requests no more mail goes to the address (nobody's
    inbox can be flooded), and the page looks exactly the same."""
    settings.CHAT_ACCOUNTS_RESET_EMAIL_LIMIT = 2
    make_user("xena", email="xena@example.org")
    answers = [request_reset(Client(), "xena@example.org", ip=f"198.51.100.{i + 50}") for i in range(3)]
    assert [a["Location"] for a in answers] == ["/accounts/password_reset/done/"] * 3
    assert len(mail.outbox) == 2


def test_reset_requests_from_one_address_are_limited(make_user, settings):
    settings.CHAT_ACCOUNTS_RESET_IP_LIMIT = 2
    ip = "203.0.113.40"
    request_reset(Client(), "a@example.org", ip=ip)
    request_reset(Client(), "b@example.org", ip=ip)
    response = request_reset(Client(), "c@example.org", ip=ip)
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert "Too many password reset requests from your network" in response.content.decode()
    assert request_reset(Client(), "c@example.org", ip="203.0.113.41").status_code == 302


def test_reset_request_without_a_csrf_token_is_refused(make_user):
    make_user("yara", email="yara@example.org")
    response = request_reset(Client(enforce_csrf_checks=True), "yara@example.org")
    assert response.status_code == 403
    assert mail.outbox == []


def test_set_new_password_without_a_csrf_token_is_refused(make_user):
    make_user("zoe", email="zoe@example.org")
    request_reset(Client(), "zoe@example.org")
    client = Client(enforce_csrf_checks=True)
    opened = client.get(reset_link_from_mail())
    response = client.post(
        opened["Location"], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
    )
    assert response.status_code == 403
    assert sign_in(Client(), "zoe", PASSWORD).status_code == 302


# --- change -----------------------------------------------------------------------------------------


def change_password(client: Client, old: str = PASSWORD, new: str = NEW_PASSWORD):
    return client.post(
        "/accounts/password_change/",
        {"old_password": old, "new_password1": new, "new_password2": new},
    )


def test_changing_the_password_keeps_this_session_and_ends_the_others(make_user):
    """Given two signed-in sessions, when one changes the password, then it stays signed in
    (update_session_auth_hash) and the other is signed out and gone from store and list."""
    make_user("adam")
    here, there = Client(), Client()
    sign_in(here, "adam")
    sign_in(there, "adam", ip="198.51.100.8")
    there_key = there.session.session_key

    response = change_password(here)
    assert response.status_code == 302 and response["Location"] == "/accounts/password_change/done/"
    assert here.get("/settings/sessions/").status_code == 200
    assert there.get("/settings/sessions/").status_code == 302
    assert not Session.objects.filter(session_key=there_key).exists()
    rows = list(UserSession.objects.filter(user__username="adam"))
    assert [row.session_key for row in rows] == [here.session.session_key]
    assert sign_in(Client(), "adam", NEW_PASSWORD).status_code == 302


def test_changing_the_password_needs_the_current_one(make_user):
    make_user("beth")
    client = Client()
    sign_in(client, "beth")
    response = change_password(client, old="not-my-password-x")
    assert response.status_code == 400
    assert "old password was entered incorrectly" in response.content.decode()
    assert sign_in(Client(), "beth", PASSWORD).status_code == 302


def test_changing_to_a_short_password_is_refused(make_user):
    make_user("cleo")
    client = Client()
    sign_in(client, "cleo")
    response = change_password(client, new="Tz8!short")
    assert response.status_code == 400
    assert "at least 12 characters" in response.content.decode()


def test_change_password_without_a_csrf_token_is_refused(make_user):
    user = make_user("dora")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert change_password(client).status_code == 403
    assert get_user_model().objects.get(username="dora").check_password(PASSWORD)
