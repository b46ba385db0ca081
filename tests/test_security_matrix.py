"""Every URL tried by the wrong people (issue 10): anonymous, another user (bob, an owner of
another organisation), a removed member (carol), a plain member where a role is needed (dave),
another user's API key, a revoked key, alice's session cookie on ``/v1``, a revoked share
link, a withdrawn invitation. Each must get its refusal (tests/security_routes.py says which)
and the request must read nothing (no secret of alice's in the response) and write nothing
(every row of every table of ours the same before and after).

The table must cover every route the resolver knows: a new endpoint without a row fails
``test_every_route_has_a_row``. World and people: tests/security_world.py. CSRF:
tests/test_security_csrf.py.
"""

from __future__ import annotations

import pytest
from django.http import HttpResponse
from django.urls import get_resolver, path

from tests.security_outcomes import (
    ADMIN,
    ALLOWED,
    API_PUBLIC,
    API_SELF,
    PUBLIC,
    REVOKED_LINK,
    SELF,
    WITHDRAWN_INVITATION,
    Outcome,
    assert_outcome,
    send,
)
from tests.security_resolver import ADMIN_ROUTES, SiteRoute, admin_path, site_routes, uncovered
from tests.security_routes import ANY, BY_NAME, ROUTES, Route, no_params
from tests.security_world import (
    ORG_NAME,
    SECRET_ANSWER,
    SECRET_QUESTION,
    SECRET_TITLE,
    alice_fingerprint,
    body_text,
    changes,
    client_for,
    generation_refused,  # noqa: F401  (fixture)
    keep_test_connection,  # noqa: F401  (fixture)
    leaked,
    snapshot,
    world,  # noqa: F401  (the module's world fixture)
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _engine(engine_double, keep_test_connection):
    """No request here may reach a real engine (a route that would answer gets the double)."""
    return engine_double


# --- the resolver and the table -----------------------------------------------------------------


def test_every_route_has_a_row():
    """Given the site's URL patterns, then each is in the security table (or under admin/):
    a new endpoint needs a row in tests/security_routes.py saying who may use it."""
    missing = uncovered(site_routes())
    assert not missing, f"routes without a row in tests/security_routes.py: {missing}"


def test_a_new_route_is_caught():
    """Given the site's patterns plus one nobody described, then the coverage check names it
    (so test_every_route_has_a_row fails the day such a route is added)."""
    extra = path("brand-new/<int:pk>/", lambda request, pk: HttpResponse(), name="brand-new")
    unnamed = path("nameless/", lambda request: HttpResponse())

    found = uncovered(site_routes([*get_resolver().url_patterns, extra, unnamed]))

    assert found == [SiteRoute("brand-new/<int:pk>/", "brand-new"), SiteRoute("nameless/", None)]


def test_no_row_names_a_route_that_is_gone():
    names = {r.name for r in site_routes()}
    assert not [name for name in BY_NAME if name not in names]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_a_method_the_row_does_not_list_is_refused(world, generation_refused, route):
    """Given a row's methods, then every other of GET, POST, PUT, PATCH, DELETE gets 405 (as
    alice, who may use the route): the rows list every method a view answers, so the refusal
    tests below try each of them. A URL whose methods differ in who may use them has a row per
    access pattern (e.g. v1-project-files: members list, editors add)."""
    listed = {m for r in ROUTES if r.name == route.name for m in r.methods}
    for method in set(ANY) - listed:
        client = client_for(world, "alice_key" if route.api else "alice")
        response = send(client, method, route.path(world), None)
        assert response.status_code == 405, (method, response.status_code)


def test_every_public_row_says_why():
    """Public routes are an explicit, justified allowlist."""
    public = [r for r in ROUTES if r.access in (PUBLIC, API_PUBLIC)]
    assert public and all(r.why for r in public), [r.name for r in public if not r.why]


# --- refusals -----------------------------------------------------------------------------------


def _refusals() -> list[tuple[Route, str, str]]:
    return [
        (route, method, actor)
        for route in ROUTES
        for method in route.methods
        for actor, outcome in route.access.items()
        if outcome is not ALLOWED
    ]


def secrets_for(world, route: Route, actor: str) -> list[str]:
    found = world.secrets(member=actor == "dave")
    return [s for s in found if not (s == ORG_NAME and "org" in route.reveals)]


@pytest.mark.parametrize(
    ("route", "method", "actor"),
    _refusals(),
    ids=[f"{r.name}-{m}-{a}" for r, m, a in _refusals()],
)
def test_refused_and_nothing_read_or_written(world, generation_refused, route, method, actor):
    """Given alice's world, when ``actor`` sends ``method`` to the route filled with alice's
    objects (with the body that would do harm), then they get the table's refusal, no secret of
    alice's in the response, and no row of any table changed. (A request that got past the
    checks to the point of answering would get 409 from ``generation_refused`` instead.)"""
    client = client_for(world, actor)
    before = snapshot()

    response = send(client, method, route.path(world), route.body(world, method))

    assert_outcome(response, route.access[actor], api=route.api)
    assert not leaked(response, secrets_for(world, route, actor))
    assert changes(before, snapshot()) == {}


# --- what is let through, and that the table's ids are real ---------------------------------------


def _owner_checks() -> list[tuple[Route, str]]:
    """Rows whose refusals hinge on ids of alice's (the others have no parameters, or are
    checked with working links below)."""
    skip = (PUBLIC, API_PUBLIC, REVOKED_LINK, WITHDRAWN_INVITATION)
    return [
        (r, m)
        for r in ROUTES
        if r.access not in skip and r.kwargs is not no_params
        for m in r.methods
    ]


@pytest.mark.parametrize(
    ("route", "method"), _owner_checks(), ids=[f"{r.name}-{m}" for r, m in _owner_checks()]
)
def test_alice_gets_through(world, generation_refused, route, method):
    """Control: the same request as alice (her session; on /v1 her key) is not refused, so each
    refusal above comes from the access check, not from a wrong id in the table. A route that
    would start an answer stops there with 409 (``generation_refused``): past every check."""
    client = client_for(world, "alice_key" if route.api else "alice")

    response = send(client, method, route.path(world), route.body(world, method))

    assert response.status_code < 500, body_text(response)[:300]
    if route.generates:
        assert response.status_code == 409, body_text(response)[:300]
    assert response.status_code not in (401, 403, 404, 405, 410), body_text(response)[:300]


def _self_cases() -> list[tuple[Route, str, str]]:
    return [
        (r, m, actor)
        for r in ROUTES
        if r.access in (SELF, API_SELF)
        for m in r.methods
        if not (r.generates and m == "POST")
        for actor in (("bob_key",) if r.api else ("bob",))
    ]


@pytest.mark.parametrize(
    ("route", "method", "actor"),
    _self_cases(),
    ids=[f"{r.name}-{m}-{a}" for r, m, a in _self_cases()],
)
def test_own_account_pages_show_and_touch_only_the_callers_data(world, route, method, actor):
    """Given bob on a page of his own account (settings, memory, keys, search...), then he gets
    it, without any of alice's secrets, and alice's data is as it was."""
    client = client_for(world, actor)
    before = alice_fingerprint(world)

    response = send(client, method, route.path(world), route.body(world, method))

    assert response.status_code < 500
    assert response.status_code not in (401, 403, 404, 405)
    assert not leaked(response, world.secrets())
    assert alice_fingerprint(world) == before


@pytest.mark.parametrize(
    "name",
    [
        "conversation", "attachment-download", "org-overview", "org-conversations", "org-members",
        "project", "project-files",
    ],
)
def test_a_member_reads_what_the_workspace_shares(world, name):
    """Control for the ALLOWED cells: dave (a member of Acme) reads the workspace's pages and
    the conversation alice shared with it, while carol (removed) gets 404 above."""
    route = BY_NAME[name]
    response = client_for(world, "dave").get(route.path(world))
    assert response.status_code == 200


def test_a_member_reads_the_shared_conversation_and_nothing_more(world):
    """Dave's read-only page of alice's shared conversation shows its title and exchanges, not
    her system prompt, files' text, memory, ratings, email or credentials."""
    response = client_for(world, "dave").get(f"/c/{world.conversation.pk}/")

    assert set(leaked(response, world.secrets(member=True))) == {
        SECRET_TITLE, SECRET_QUESTION, SECRET_ANSWER,
    }  # fmt: skip


@pytest.mark.parametrize(
    "route", [r for r in ROUTES if r.access in (PUBLIC, API_PUBLIC)], ids=lambda r: r.name
)
def test_public_routes_read_and_write_nothing_of_alices(world, route):
    """Given an anonymous visitor on a public route (every method it takes), then no 5xx, no
    secret of alice's, no row changed (a bad sign-in, an empty sign-up, a bogus reset token)."""
    for method in route.methods:
        client = client_for(world, "anonymous")
        before = snapshot()

        response = send(client, method, route.path(world), route.body(world, method))

        assert response.status_code < 500 or route.name == "readyz", (method, response.status_code)
        assert not leaked(response, world.secrets()), method
        assert changes(before, snapshot()) == {}, method


def test_a_working_share_link_is_public_and_shows_only_its_snapshot(world):
    """The allowlisted /s/<token>/: a working link shows its snapshot to anyone signed out: the
    title and the exchanges (and its own URL), nothing else of alice's (no system prompt, file
    text, memory, ratings, email, organisation or credentials)."""
    response = client_for(world, "anonymous").get(f"/s/{world.raw['link']}/")

    assert response.status_code == 200
    assert set(leaked(response, world.secrets())) == {
        SECRET_TITLE, SECRET_QUESTION, SECRET_ANSWER, world.raw["link"],
    }  # fmt: skip


def test_a_working_invitation_shows_what_it_invites_to(world):
    """Control for invitation-accept: the pending link works for a signed-in holder."""
    response = client_for(world, "bob").get(f"/invitations/{world.raw['invitation']}/")
    assert response.status_code == 200
    assert ORG_NAME in body_text(response)


# --- the admin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=[r.pattern for r in ADMIN_ROUTES])
def test_the_admin_lets_in_staff_only(world, route):
    """Given any admin route, when anonymous, alice (an organisation's owner, not staff) or bob
    GET or POST it, then they are sent to the admin's sign-in and nothing is written; staff
    (sam) are let in (control)."""
    url = admin_path(route, world)
    for actor, outcome in ADMIN.items():
        for method in ("GET", "POST"):
            client = client_for(world, actor)
            before = snapshot()
            response = send(client, method, url, None)
            if route.name == "admin:logout":  # the admin sends non-staff to its index first
                outcome = Outcome(302, "/admin/")
            assert_outcome(response, outcome, api=False)
            assert not leaked(response, world.secrets()), (actor, method)
            assert changes(before, snapshot()) == {}, (actor, method)
    staff = client_for(world, "sam").get(url)
    assert staff.status_code < 500
    assert not staff.get("Location", "").startswith("/admin/login/")
