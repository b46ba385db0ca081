"""Sign-in throttling (per account and per address, counted in the test stack's real Redis),
password strength, CSRF on the account forms, and sign-in-only pages (issue 10)."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory

from accounts import services as account_services
from accounts import throttle
from accounts.request_info import client_ip, ip_throttle_scope
from core import redis_guard
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

ACCOUNT_LOCKED = "Too many failed sign-ins for this account."
ADDRESS_LOCKED = "Too many failed sign-ins from your network."
WRONG = "not-the-password-at-all"


@pytest.fixture(autouse=True)
def fresh_throttle_counters():
    """Each test starts and ends with no sign-in or reset counters in Redis."""

    def clear():
        client = redis_guard.sync_client()
        for pattern in ("chat:login:*", "chat:reset:*"):
            for key in client.scan_iter(match=pattern):
                client.delete(key)

    clear()
    yield
    clear()


def sign_in(client: Client, username: str, password: str = PASSWORD, *, ip: str = "192.0.2.10", **meta):
    """POST the sign-in form as a browser at ``ip`` would."""
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip, **meta
    )


def is_signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


# --- per account ----------------------------------------------------------------------------------


def test_five_failures_lock_the_account_from_every_address(make_user):
    """Given an account, when 5 wrong passwords arrive from 5 different addresses, then the 5th
    answer is 429 with the account message, and the right password from a sixth address is
    refused the same way (the lock is the account's, not the address's)."""
    make_user("alice")
    answers = [sign_in(Client(), "alice", WRONG, ip=f"198.51.100.{i}") for i in range(1, 6)]
    assert [a.status_code for a in answers] == [400, 400, 400, 400, 429]
    assert ACCOUNT_LOCKED in answers[-1].content.decode()

    client = Client()
    response = sign_in(client, "alice", PASSWORD, ip="198.51.100.77")
    assert response.status_code == 429
    assert ACCOUNT_LOCKED in response.content.decode()
    assert "reset your password" in response.content.decode()
    assert not is_signed_in(client)


def test_a_wrong_password_below_the_limit_gets_the_plain_message(make_user):
    make_user("bob")
    response = sign_in(Client(), "bob", WRONG)
    assert response.status_code == 400
    body = response.content.decode()
    assert "Please enter a correct username and password" in body
    assert "Too many" not in body


def test_a_lockout_says_when_to_retry(make_user, settings):
    """The 429 carries Retry-After in whole seconds, at most the lockout, and the message says
    the same wait in words."""
    settings.CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT = 2
    make_user("carol")
    sign_in(Client(), "carol", WRONG)
    response = sign_in(Client(), "carol", WRONG)
    assert response.status_code == 429
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= settings.CHAT_ACCOUNTS_LOGIN_LOCKOUT_S
    assert "Try again in 15 minutes" in response.content.decode()


def test_the_account_lock_expires(make_user, settings):
    """Given a short lockout (1 s), when it has passed, then the right password signs in."""
    settings.CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT = 2
    settings.CHAT_ACCOUNTS_LOGIN_LOCKOUT_S = 1
    make_user("dave")
    sign_in(Client(), "dave", WRONG)
    assert sign_in(Client(), "dave", WRONG).status_code == 429
    assert sign_in(Client(), "dave").status_code == 429

    time.sleep(1.2)
    client = Client()
    assert sign_in(client, "dave").status_code == 302
    assert is_signed_in(client)


def test_attempts_during_a_lock_do_not_extend_it(make_user, settings):
    """Hammering a locked account does not push its end further away."""
    settings.CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT = 1
    settings.CHAT_ACCOUNTS_LOGIN_LOCKOUT_S = 2
    make_user("erin")
    locked_at = time.monotonic()
    assert sign_in(Client(), "erin", WRONG).status_code == 429
    while time.monotonic() < locked_at + 1.0:  # wrong passwords through half of the lock
        assert sign_in(Client(), "erin", WRONG).status_code == 429
        time.sleep(0.05)
    time.sleep(max(0.0, locked_at + 2.3 - time.monotonic()))
    assert sign_in(Client(), "erin").status_code == 302


def test_a_successful_sign_in_clears_the_account_count(make_user):
    """Given 4 failures, when the right password is given, then the count starts again: 4 more
    failures get the plain message and only the 5th locks."""
    make_user("frank")
    for _ in range(4):
        assert sign_in(Client(), "frank", WRONG).status_code == 400
    assert sign_in(Client(), "frank").status_code == 302
    for _ in range(4):
        assert sign_in(Client(), "frank", WRONG).status_code == 400
    assert sign_in(Client(), "frank", WRONG).status_code == 429


# --- per address ----------------------------------------------------------------------------------


def test_failures_across_many_usernames_lock_the_address(make_user, settings):
    """Given an address limit of 6, when one address fails on 6 different usernames (none
    reaching the account limit), then it is locked out of every account, even with a right
    password, while another address signs in to the same account."""
    settings.CHAT_ACCOUNTS_LOGIN_IP_LIMIT = 6
    make_user("gina")
    sprayer = "203.0.113.66"
    answers = [sign_in(Client(), f"someone{i}", "Summer2026!!", ip=sprayer) for i in range(6)]
    assert [a.status_code for a in answers] == [400] * 5 + [429]
    assert ADDRESS_LOCKED in answers[-1].content.decode()

    response = sign_in(Client(), "gina", PASSWORD, ip=sprayer)
    assert response.status_code == 429
    assert ADDRESS_LOCKED in response.content.decode()

    elsewhere = Client()
    assert sign_in(elsewhere, "gina", PASSWORD, ip="203.0.113.67").status_code == 302
    assert is_signed_in(elsewhere)


def test_a_successful_sign_in_does_not_clear_the_address_count(make_user, settings):
    """An attacker who owns one account cannot wipe their address's failures by signing into
    it between guesses."""
    settings.CHAT_ACCOUNTS_LOGIN_IP_LIMIT = 4
    make_user("mallory")
    ip = "203.0.113.90"
    for i in range(3):
        assert sign_in(Client(), f"victim{i}", WRONG, ip=ip).status_code == 400
    assert sign_in(Client(), "mallory", ip=ip).status_code == 302
    assert sign_in(Client(), "victim9", WRONG, ip=ip).status_code == 429


def test_the_address_lock_expires(make_user, settings):
    settings.CHAT_ACCOUNTS_LOGIN_IP_LIMIT = 2
    settings.CHAT_ACCOUNTS_LOGIN_LOCKOUT_S = 1
    make_user("hank")
    ip = "203.0.113.91"
    sign_in(Client(), "x1", WRONG, ip=ip)
    assert sign_in(Client(), "x2", WRONG, ip=ip).status_code == 429
    time.sleep(1.2)
    assert sign_in(Client(), "hank", ip=ip).status_code == 302


def test_ipv6_addresses_of_one_64_share_a_counter(make_user, settings):
    """One subscriber holds a whole IPv6 /64: rotating addresses inside it does not buy tries."""
    settings.CHAT_ACCOUNTS_LOGIN_IP_LIMIT = 3
    answers = [sign_in(Client(), f"v6user{i}", WRONG, ip=f"2001:db8:1:2::{i + 1:x}") for i in range(3)]
    assert answers[-1].status_code == 429
    assert sign_in(Client(), "v6other", WRONG, ip="2001:db8:1:3::1").status_code == 400


def test_behind_the_proxy_the_forwarded_address_counts_and_spoofed_entries_do_not(settings):
    """With one trusted proxy (deploy/nginx.conf appends the address it saw), the client is the
    rightmost X-Forwarded-For entry; entries the client wrote itself are ignored."""
    settings.CHAT_ACCOUNTS_TRUSTED_PROXIES = 1
    request = RequestFactory().get(
        "/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.23"
    )
    assert client_ip(request) == "198.51.100.23"
    settings.CHAT_ACCOUNTS_TRUSTED_PROXIES = 0
    assert client_ip(request) == "127.0.0.1"


def test_trusted_proxies_default_to_one_behind_the_tls_proxy(settings):
    settings.CHAT_ACCOUNTS_TRUSTED_PROXIES = None
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    request = RequestFactory().get("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.5")
    assert client_ip(request) == "198.51.100.5"


def test_ip_throttle_scope_groups_ipv6_by_64_and_keeps_ipv4():
    assert ip_throttle_scope("2001:db8:1:2::1") == ip_throttle_scope("2001:db8:1:2:ffff::9")
    assert ip_throttle_scope("2001:db8:1:2::1") != ip_throttle_scope("2001:db8:1:3::1")
    assert ip_throttle_scope("192.0.2.1") != ip_throttle_scope("192.0.2.2")
    assert ip_throttle_scope("::ffff:192.0.2.1") == ip_throttle_scope("192.0.2.1")


# --- scope -------------------------------------------------------------------------------------


def test_the_admin_sign_in_is_throttled_too(make_user):
    """/admin/login/ is no way around the counters: a locked staff account is refused there."""
    make_user("root", is_staff=True, is_superuser=True)
    for i in range(5):
        sign_in(Client(), "root", WRONG, ip=f"198.51.100.{i + 10}")
    client = Client()
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "root", "password": PASSWORD, "next": "/admin/"},
        REMOTE_ADDR="198.51.100.99",
    )
    assert ACCOUNT_LOCKED in response.content.decode()
    assert not is_signed_in(client)


def test_the_v1_bearer_api_is_not_affected_by_a_locked_address(make_user, settings):
    """A bearer key keeps working from an address locked out of signing in."""
    settings.CHAT_ACCOUNTS_LOGIN_IP_LIMIT = 2
    user = make_user("ivy")
    ip = "203.0.113.50"
    sign_in(Client(), "u1", WRONG, ip=ip)
    assert sign_in(Client(), "u2", WRONG, ip=ip).status_code == 429
    key = account_services.api_key_create(user=user, name="script").raw
    response = Client().get("/v1/conversations", HTTP_AUTHORIZATION=f"Bearer {key}", REMOTE_ADDR=ip)
    assert response.status_code == 200


def test_with_redis_down_sign_in_fails_open(make_user, settings):
    """Redis unreachable: nobody is locked out (counted as degraded), sign-in still works."""
    make_user("jack")
    settings.REDIS_URL = "unix:///nonexistent/redis.sock"
    try:
        client = Client()
        assert sign_in(client, "jack", WRONG).status_code == 400
        assert sign_in(client, "jack").status_code == 302
        assert is_signed_in(client)
    finally:
        redis_guard.breaker.reset()


def test_lockout_wait_in_words():
    assert throttle.Lockout(scope="account", retry_after_s=900).wait == "15 minutes"
    assert throttle.Lockout(scope="account", retry_after_s=61).wait == "2 minutes"
    assert throttle.Lockout(scope="ip", retry_after_s=1).wait == "1 second"


# --- password strength ----------------------------------------------------------------------------


def signup(client: Client, username: str, password: str, email: str = ""):
    return client.post(
        "/accounts/signup/",
        {"username": username, "email": email, "password1": password, "password2": password},
    )


def test_signup_refuses_a_short_password():
    response = signup(Client(), "kate", "Xy7#kq2!pz")  # 10 characters
    assert response.status_code == 400
    assert "at least 12 characters" in response.content.decode()
    assert not get_user_model().objects.filter(username="kate").exists()


def test_signup_refuses_a_common_password():
    response = signup(Client(), "liam", "qwerty123456")
    assert response.status_code == 400
    assert "too common" in response.content.decode()


def test_signup_refuses_a_password_like_the_username():
    response = signup(Client(), "margaret.hamilton", "margaret.hamilton1")
    assert response.status_code == 400
    assert "too similar" in response.content.decode()


def test_signup_with_a_strong_password_and_email_creates_the_account():
    client = Client()
    response = signup(client, "nina", "plum-ladder-orbit-73", email="nina@example.org")
    assert response.status_code == 302
    user = get_user_model().objects.get(username="nina")
    assert user.email == "nina@example.org"
    assert not user.email_is_verified  # only a followed reset link (or OIDC) verifies it
    assert is_signed_in(client)


# --- CSRF on the account forms ----------------------------------------------------------------------


def test_sign_in_without_a_csrf_token_is_refused(make_user):
    make_user("oscar")
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, "oscar")
    assert response.status_code == 403
    assert not is_signed_in(client)


def test_sign_in_with_the_csrf_token_works(make_user):
    """The control for the test above: the same client, with the page's token, signs in."""
    make_user("oscar2")
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")
    response = client.post(
        "/accounts/login/",
        {"username": "oscar2", "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"].value},
    )
    assert response.status_code == 302


def test_signup_without_a_csrf_token_is_refused():
    response = signup(Client(enforce_csrf_checks=True), "pia", "plum-ladder-orbit-73")
    assert response.status_code == 403
    assert not get_user_model().objects.filter(username="pia").exists()


# --- pages for signed-in people only ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/settings/sessions/"),
        ("get", "/accounts/password_change/"),
        ("post", "/accounts/password_change/"),
        ("post", "/settings/sessions/end-others"),
        ("post", "/settings/sessions/end-all"),
        ("post", "/settings/sessions/1/end"),
    ],
)
def test_anonymous_visitors_are_sent_to_sign_in(method, path):
    response = getattr(Client(), method)(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_the_sign_in_page_links_to_password_reset():
    body = Client().get("/accounts/login/").content.decode()
    assert 'href="/accounts/password_reset/"' in body
