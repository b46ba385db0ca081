"""CSRF (issue 10): every state-changing request outside ``/v1`` (POST, PUT, PATCH, DELETE on
any route of tests/security_routes.py, and every admin route) is refused without the CSRF
token and nothing is written; with the token, sent as htmx sends it (``X-CSRFToken`` from the
page), it gets through. The ``/v1`` bearer API is exempt by design (no cookies are used) and
never acts on a session cookie: that is a row of the matrix (``alice_session`` and
``alice_session_csrf`` get 401 on every /v1 route, tests/test_security_matrix.py). Safe methods
change nothing, so guarding the unsafe ones is enough.

World and people: tests/security_world.py.
"""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.security_outcomes import API_PUBLIC, PUBLIC, send
from tests.security_resolver import ADMIN_ROUTES, admin_path
from tests.security_routes import ROUTES, Route
from tests.security_world import (
    body_text,
    changes,
    client_for,
    csrf_token_of,
    generation_refused,  # noqa: F401  (fixture)
    keep_test_connection,  # noqa: F401  (fixture)
    snapshot,
    world,  # noqa: F401  (the module's world fixture)
)

pytestmark = pytest.mark.django_db

UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
CSRF_PAGE = "This form has expired"  # templates/403_csrf.html: the CSRF refusal, not another 403


@pytest.fixture(autouse=True)
def _engine(engine_double, keep_test_connection, generation_refused):
    """A request let through stops where it would start an answer (409), never in an engine."""
    return engine_double


def _html_unsafe() -> list[tuple[Route, str]]:
    return [(r, m) for r in ROUTES if not r.api for m in r.methods if m in UNSAFE]


def _signed_in_as(route: Route) -> tuple[str, str]:
    """Who sends it, and the page their token comes from: public forms are sent signed out
    (the sign-in page's token), everything else by alice (the chat page's)."""
    return ("anonymous", "/accounts/login/") if route.access is PUBLIC else ("alice", "/")


@pytest.mark.parametrize(
    ("route", "method"), _html_unsafe(), ids=[f"{r.name}-{m}" for r, m in _html_unsafe()]
)
def test_without_the_token_it_is_refused_and_nothing_is_written(world, route, method):
    """Given a client that checks CSRF as a browser's request is checked, when alice (signed in;
    signed out for public forms) sends the state-changing request without a token, then 403
    with the CSRF page and no row changed."""
    actor, _ = _signed_in_as(route)
    client = client_for(world, actor, enforce_csrf_checks=True)
    before = snapshot()

    response = send(client, method, route.path(world), route.body(world, method))

    assert response.status_code == 403
    assert CSRF_PAGE in body_text(response)
    assert changes(before, snapshot()) == {}


@pytest.mark.parametrize(
    ("route", "method"), _html_unsafe(), ids=[f"{r.name}-{m}" for r, m in _html_unsafe()]
)
def test_with_the_token_from_the_page_it_gets_through(world, route, method):
    """The same request with the token htmx sends (``X-CSRFToken``, from the page's
    ``hx-headers``) is not refused for CSRF (whatever the view then decides)."""
    actor, page = _signed_in_as(route)
    client = client_for(world, actor, enforce_csrf_checks=True)
    client.defaults["HTTP_X_CSRFTOKEN"] = csrf_token_of(client, page)

    response = send(client, method, route.path(world), route.body(world, method))

    assert response.status_code != 403 or CSRF_PAGE not in body_text(response)
    assert response.status_code < 500, body_text(response)[:300]


def test_a_token_from_another_session_is_refused(world):
    """The token is bound to the browser's cookie: bob's token in alice's request is refused."""
    thief = client_for(world, "bob", enforce_csrf_checks=True)
    stolen = csrf_token_of(thief)
    client = client_for(world, "alice", enforce_csrf_checks=True)
    client.defaults["HTTP_X_CSRFTOKEN"] = stolen
    client.cookies[settings.CSRF_COOKIE_NAME] = "x" * 32  # her own cookie, not bob's
    before = snapshot()

    response = client.post(f"/c/{world.conversation.pk}/rename", {"title": "pwned"})

    assert response.status_code == 403
    assert changes(before, snapshot()) == {}


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=[r.pattern for r in ADMIN_ROUTES])
def test_the_admin_checks_csrf_too(world, route):
    """Given staff (sam) in the admin, a POST without the token is refused with nothing
    written; with the token (from the cookie) it is not refused for CSRF."""
    url = admin_path(route, world)
    client = client_for(world, "sam", enforce_csrf_checks=True)
    before = snapshot()

    refused = client.post(url)

    assert refused.status_code == 403
    assert CSRF_PAGE in body_text(refused)
    assert changes(before, snapshot()) == {}
    client.get("/admin/")  # sets the cookie
    client.defaults["HTTP_X_CSRFTOKEN"] = client.cookies[settings.CSRF_COOKIE_NAME].value
    allowed = client.post(url)
    assert allowed.status_code != 403 or CSRF_PAGE not in body_text(allowed)


# --- the /v1 bearer API ---------------------------------------------------------------------------


def _api_unsafe() -> list[tuple[Route, str]]:
    return [(r, m) for r in ROUTES if r.api for m in r.methods if m in UNSAFE]


@pytest.mark.parametrize(
    ("route", "method"), _api_unsafe(), ids=[f"{r.name}-{m}" for r, m in _api_unsafe()]
)
def test_the_bearer_api_needs_no_csrf_token(world, route, method):
    """Given alice's API key on a client that enforces CSRF, a state-changing /v1 request with no
    CSRF token is served (exempt by design: a bearer token is not sent by browsers on their own,
    so it cannot be ridden). A request that would answer stops with 409 past every check."""
    client = client_for(world, "alice_key", enforce_csrf_checks=True)

    response = send(client, method, route.path(world), route.body(world, method))

    assert response.status_code < 500, body_text(response)[:300]
    assert response.status_code not in (401, 403, 404), body_text(response)[:300]
    if route.generates:
        assert response.status_code == 409


# --- safe methods are safe ------------------------------------------------------------------------

# GETs that write by design, and why that is no CSRF risk.
WRITING_GETS = {
    # The sessions page forgets rows of sessions that have already ended (housekeeping of the
    # caller's own list; an ended session cannot be revived by it).
    "sessions": {"accounts.usersession"},
}


def _html_gets() -> list[Route]:
    return [r for r in ROUTES if not r.api and r.access is not API_PUBLIC and "GET" in r.methods]


@pytest.mark.parametrize("route", _html_gets(), ids=[r.name for r in _html_gets()])
def test_a_get_changes_nothing(world, route):
    """Given alice (signed out for public pages), when she GETs any page, then no row changes
    (CSRF protection covers only unsafe methods, so a page a link can open must not write)."""
    actor, _ = _signed_in_as(route)
    client = client_for(world, actor)
    before = snapshot()

    response = client.get(route.path(world))

    assert response.status_code < 500 or route.name == "readyz"
    changed = set(changes(before, snapshot()))
    assert changed <= WRITING_GETS.get(route.name, set()), changed
