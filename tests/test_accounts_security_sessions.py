"""The signed-in sessions page (issue 10): what a sign-in records, "last seen" at most once a
minute, sign out one / all others / everywhere (session store and session hash), CSRF."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.models import Session
from django.test import AsyncClient, Client
from django.utils import timezone

from accounts.models import UserSession
from accounts.selectors import device_label
from accounts.signals import SEEN_SESSION_KEY
from tests.test_accounts_security import (  # noqa: F401 - the autouse fixture
    fresh_throttle_counters,
    is_signed_in,
    sign_in,
)

pytestmark = pytest.mark.django_db

FIREFOX_LINUX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
SAFARI_IPHONE = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1"
)


def signed_in(username: str, *, ip: str = "192.0.2.30", ua: str = FIREFOX_LINUX) -> Client:
    client = Client(HTTP_USER_AGENT=ua, REMOTE_ADDR=ip)
    assert sign_in(client, username, ip=ip, HTTP_USER_AGENT=ua).status_code == 302
    return client


def row_of(client: Client) -> UserSession:
    return UserSession.objects.get(session_key=client.session.session_key)


# --- what is recorded and shown ---------------------------------------------------------------


def test_a_sign_in_records_device_address_and_times(make_user):
    user = make_user("ann")
    before = timezone.now()
    client = signed_in("ann", ip="198.51.100.4")
    row = row_of(client)
    assert row.user == user
    assert row.ip == "198.51.100.4"
    assert row.user_agent == FIREFOX_LINUX
    assert before <= row.created_at <= timezone.now()
    assert before <= row.last_seen_at <= timezone.now()


def test_the_page_lists_sessions_with_this_device_marked(make_user):
    """Two sessions: the page shows both devices and addresses, and only the one viewing it is
    marked "this device"."""
    make_user("ben")
    laptop = signed_in("ben", ip="198.51.100.5", ua=FIREFOX_LINUX)
    phone = signed_in("ben", ip="198.51.100.6", ua=SAFARI_IPHONE)

    response = laptop.get("/settings/sessions/")
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    listing = response.context["sessions"]
    assert [(s.device, s.ip, s.is_current) for s in listing] == [
        ("Firefox on Linux", "198.51.100.5", True),
        ("Mobile Safari on iOS (iPhone)", "198.51.100.6", False),
    ]
    body = response.content.decode()
    assert body.count("this device") == 1
    assert "Mobile Safari on iOS (iPhone)" in body
    assert phone.session.session_key not in body  # a session key is a credential


def test_another_users_sessions_are_not_listed(make_user):
    make_user("cat")
    make_user("dan")
    cat = signed_in("cat")
    dan = signed_in("dan", ua=SAFARI_IPHONE)
    listing = cat.get("/settings/sessions/").context["sessions"]
    assert [s.id for s in listing] == [row_of(cat).pk]
    assert row_of(dan).pk not in [s.id for s in listing]


def test_a_hostile_user_agent_is_shown_as_text(make_user):
    make_user("eve")
    client = signed_in("eve", ua='<script>alert(1)</script><img src=x onerror=alert(2)>')
    body = client.get("/settings/sessions/").content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_device_labels():
    assert device_label(FIREFOX_LINUX) == "Firefox on Linux"
    assert device_label(SAFARI_IPHONE) == "Mobile Safari on iOS (iPhone)"
    assert device_label("") == "Unknown device"
    assert device_label("curl/8.5.0") == "curl"
    assert device_label("Zzz/0") == "Unknown device"


def test_signing_out_forgets_the_session(make_user):
    make_user("fay")
    client = signed_in("fay")
    key = client.session.session_key
    assert client.post("/accounts/logout/").status_code == 302
    assert not UserSession.objects.filter(session_key=key).exists()


def test_sessions_that_ended_elsewhere_are_left_off_the_list(make_user):
    """A session deleted from the store (expired, clearsessions) no longer shows."""
    make_user("gus")
    here = signed_in("gus")
    gone = signed_in("gus", ua=SAFARI_IPHONE)
    Session.objects.filter(session_key=gone.session.session_key).delete()
    listing = here.get("/settings/sessions/").context["sessions"]
    assert [s.is_current for s in listing] == [True]


# --- last seen ------------------------------------------------------------------------------------


def age_row(client: Client, minutes: int = 10) -> None:
    UserSession.objects.filter(session_key=client.session.session_key).update(
        last_seen_at=timezone.now() - timedelta(minutes=minutes)
    )


def age_seen_marker(client: Client, seconds: float = 61) -> None:
    session = client.session
    session[SEEN_SESSION_KEY] = time.time() - seconds
    session.save()


def test_last_seen_is_not_written_again_within_the_minute(make_user):
    make_user("hal")
    client = signed_in("hal")
    age_row(client)
    stale = row_of(client).last_seen_at
    client.get("/settings/sessions/")
    client.get("/settings/sessions/")
    assert row_of(client).last_seen_at == stale


def test_last_seen_address_and_agent_are_refreshed_after_a_minute(make_user):
    make_user("ida")
    client = signed_in("ida", ip="198.51.100.10")
    age_row(client)
    age_seen_marker(client)
    client.get("/settings/sessions/", REMOTE_ADDR="198.51.100.11", HTTP_USER_AGENT=SAFARI_IPHONE)
    row = row_of(client)
    assert timezone.now() - row.last_seen_at < timedelta(seconds=5)
    assert row.ip == "198.51.100.11"
    assert row.user_agent == SAFARI_IPHONE


def test_a_session_from_before_recording_gets_a_row(make_user):
    """A signed-in session without a row (made before sessions were recorded) is listed once it
    is next used."""
    make_user("jon")
    client = signed_in("jon")
    UserSession.objects.all().delete()
    age_seen_marker(client)
    client.get("/settings/sessions/")
    assert row_of(client).user.username == "jon"


def test_the_v1_api_does_not_touch_sessions(make_user):
    make_user("kim")
    client = signed_in("kim")
    age_row(client)
    age_seen_marker(client)
    stale = row_of(client).last_seen_at
    client.get("/v1/conversations")  # a session cookie does not authenticate /v1 (401)
    assert row_of(client).last_seen_at == stale


@pytest.mark.django_db(transaction=True)
async def test_last_seen_is_refreshed_under_asgi_too(make_user):
    """The middleware's async path (AsyncClient runs the ASGI handler)."""
    user = await sync_to_async(make_user)("lea")
    client = AsyncClient()
    await client.aforce_login(user)
    session = await client.asession()
    key = session.session_key
    await session.aset(SEEN_SESSION_KEY, time.time() - 61)
    await session.asave()
    await UserSession.objects.filter(session_key=key).aupdate(
        last_seen_at=timezone.now() - timedelta(minutes=10), ip=None
    )
    response = await client.get("/settings/sessions/")
    assert response.status_code == 200
    row = await UserSession.objects.aget(session_key=key)
    assert timezone.now() - row.last_seen_at < timedelta(seconds=5)
    assert row.ip == "127.0.0.1"  # AsyncClient's ASGI scope client


# --- signing out elsewhere ----------------------------------------------------------------------


def test_signing_out_one_other_session_ends_it_in_the_store(make_user):
    make_user("max")
    here = signed_in("max")
    there = signed_in("max", ua=SAFARI_IPHONE)
    there_row = row_of(there)

    response = here.post(f"/settings/sessions/{there_row.pk}/end")
    assert response.status_code == 302 and response["Location"] == "/settings/sessions/"
    assert not Session.objects.filter(session_key=there_row.session_key).exists()
    assert not UserSession.objects.filter(pk=there_row.pk).exists()
    assert there.get("/settings/sessions/").status_code == 302
    assert here.get("/settings/sessions/").status_code == 200


def test_signing_out_this_session_from_the_list_signs_out_here(make_user):
    make_user("ned")
    here = signed_in("ned")
    response = here.post(f"/settings/sessions/{row_of(here).pk}/end")
    assert response["Location"] == "/accounts/login/"
    assert not is_signed_in(here)


def test_someone_elses_session_cannot_be_ended(make_user):
    make_user("ola")
    make_user("pat")
    ola = signed_in("ola")
    pat = signed_in("pat")
    response = ola.post(f"/settings/sessions/{row_of(pat).pk}/end")
    assert response.status_code == 404
    assert pat.get("/settings/sessions/").status_code == 200


def test_sign_out_all_others_keeps_this_one(make_user):
    user = make_user("quin")
    here = signed_in("quin")
    others = [signed_in("quin", ua=SAFARI_IPHONE, ip=f"198.51.100.{i + 60}") for i in range(2)]
    salt_before = user.session_salt

    response = here.post("/settings/sessions/end-others")
    assert response.status_code == 302 and response["Location"] == "/settings/sessions/"
    assert here.get("/settings/sessions/").status_code == 200
    for other in others:
        assert other.get("/settings/sessions/").status_code == 302
    user.refresh_from_db()
    assert user.session_salt != salt_before
    assert [row.session_key for row in UserSession.objects.filter(user=user)] == [
        here.session.session_key
    ]


def test_sign_out_everywhere_ends_this_session_too(make_user):
    user = make_user("rex")
    here = signed_in("rex")
    there = signed_in("rex", ua=SAFARI_IPHONE)

    response = here.post("/settings/sessions/end-all")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert not is_signed_in(here)
    assert there.get("/settings/sessions/").status_code == 302
    assert not UserSession.objects.filter(user=user).exists()


def test_sign_out_everywhere_ends_sessions_the_list_does_not_know(make_user):
    """A session with no row (another store, or made before recording) is ended all the same:
    the rotated session salt no longer matches its hash."""
    make_user("sue")
    here = signed_in("sue")
    unlisted = signed_in("sue", ua=SAFARI_IPHONE)
    UserSession.objects.filter(session_key=unlisted.session.session_key).delete()

    here.post("/settings/sessions/end-all")
    assert unlisted.get("/settings/sessions/").status_code == 302
    assert not is_signed_in(unlisted)


def test_the_password_still_works_after_signing_out_everywhere(make_user):
    make_user("ted")
    here = signed_in("ted")
    here.post("/settings/sessions/end-all")
    assert signed_in("ted").get("/settings/sessions/").status_code == 200


@pytest.mark.parametrize("path", ["/settings/sessions/end-others", "/settings/sessions/end-all"])
def test_signing_out_elsewhere_needs_a_csrf_token(make_user, path):
    user = make_user("ugo")
    other = signed_in("ugo", ua=SAFARI_IPHONE)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(path).status_code == 403
    assert other.get("/settings/sessions/").status_code == 200


def test_ending_one_session_needs_a_csrf_token(make_user):
    user = make_user("val")
    other = signed_in("val", ua=SAFARI_IPHONE)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(f"/settings/sessions/{row_of(other).pk}/end").status_code == 403
    assert other.get("/settings/sessions/").status_code == 200


def test_the_session_forms_work_with_the_pages_csrf_token(make_user):
    """The control for the CSRF tests: the page's own token is accepted."""
    make_user("wes")
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")
    token = client.cookies["csrftoken"].value
    client.post("/accounts/login/", {"username": "wes", "password": "correct-horse-battery-staple-42", "csrfmiddlewaretoken": token})
    page = client.get("/settings/sessions/")
    token = page.context["csrf_token"]
    response = client.post("/settings/sessions/end-others", {"csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302
