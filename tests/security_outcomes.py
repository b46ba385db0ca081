"""What each kind of caller must get from a URL of the security table (tests/security_routes.py,
issue 10), checked by :func:`assert_outcome`; the access tables the table's rows use; and the
request bodies a harmful request would send.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from django.core.files.uploadedfile import SimpleUploadedFile

from tests.security_world import World, body_text

# --- what a caller gets -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """``status`` and, for a redirect, where it must point (the start of its Location)."""

    status: int
    location: str = ""
    label: str = ""

    def __str__(self) -> str:
        return self.label or str(self.status)


LOGIN = Outcome(302, "/accounts/login/?next=", "sign-in")
ADMIN_LOGIN = Outcome(302, "/admin/login/?next=", "admin sign-in")
NOT_FOUND = Outcome(404)
FORBIDDEN = Outcome(403)
GONE = Outcome(410)
UNAUTHORIZED = Outcome(401)  # /v1: the JSON error shape and WWW-Authenticate
# Not a refusal: the caller may use the route (their own data, or read access by design).
ALLOWED = Outcome(0, label="allowed")


HTML_ACTORS = ("anonymous", "bob", "carol", "dave")
API_ACTORS = (
    "anonymous", "alice_session", "alice_session_csrf", "alice_revoked", "mallory_revoked",
    "bob_key", "carol_key", "dave_key",
)  # fmt: skip
ADMIN_ACTORS = ("anonymous", "alice", "bob")


def _access(anonymous: Outcome, bob: Outcome, carol: Outcome, dave: Outcome) -> dict:
    return {"anonymous": anonymous, "bob": bob, "carol": carol, "dave": dave}


# Alice's own objects: nobody else's business, and an id never tells that it exists.
OWN = _access(LOGIN, NOT_FOUND, NOT_FOUND, NOT_FOUND)
# Read by the members of the workspace it is shared with (dave; carol no longer).
WORKSPACE_READ = _access(LOGIN, NOT_FOUND, NOT_FOUND, ALLOWED)
# An organisation's pages for any member; others (bob, an owner elsewhere; carol) 404.
ORG_MEMBERS = _access(LOGIN, NOT_FOUND, NOT_FOUND, ALLOWED)
# Owners' and admins' pages that do not even tell a plain member they exist (usage, moderation).
ORG_ADMINS_HIDDEN = _access(LOGIN, NOT_FOUND, NOT_FOUND, NOT_FOUND)
# Owners' (and admins') pages: a plain member is told they lack the role (403, deliberate).
ORG_ROLE = _access(LOGIN, NOT_FOUND, NOT_FOUND, FORBIDDEN)
# The caller's own account: anonymous visitors sign in; anyone else sees only their own.
SELF = _access(LOGIN, ALLOWED, ALLOWED, ALLOWED)
# A revoked share link: 404 for everyone, signed in or not, its owner too.
REVOKED_LINK = {**_access(NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND), "alice": NOT_FOUND}
# A withdrawn invitation: sign in first; then 410 for everyone.
WITHDRAWN_INVITATION = _access(LOGIN, GONE, GONE, GONE)
PUBLIC = {actor: ALLOWED for actor in HTML_ACTORS}

_API_REFUSED = {
    "anonymous": UNAUTHORIZED,
    # The API never acts on a session cookie, with or without a CSRF token (bearer only).
    "alice_session": UNAUTHORIZED,
    "alice_session_csrf": UNAUTHORIZED,
    "alice_revoked": UNAUTHORIZED,
    "mallory_revoked": UNAUTHORIZED,
}
API_OWN = {**_API_REFUSED, "bob_key": NOT_FOUND, "carol_key": NOT_FOUND, "dave_key": NOT_FOUND}
# A workspace's project over /v1: dave (a member) may open it, only its owner and acme's
# owners/admins change it.
API_ORG_MEMBERS = {**_API_REFUSED, "bob_key": NOT_FOUND, "carol_key": NOT_FOUND, "dave_key": ALLOWED}
API_ORG_ROLE = {**_API_REFUSED, "bob_key": NOT_FOUND, "carol_key": NOT_FOUND, "dave_key": FORBIDDEN}
API_SELF = {**_API_REFUSED, "bob_key": ALLOWED, "carol_key": ALLOWED, "dave_key": ALLOWED}
API_PUBLIC = {actor: ALLOWED for actor in API_ACTORS}
ADMIN = {actor: ADMIN_LOGIN for actor in ADMIN_ACTORS}


def assert_outcome(response, expected: Outcome, *, api: bool) -> None:
    assert response.status_code == expected.status, (
        f"expected {expected}, got {response.status_code}: {body_text(response)[:300]}"
    )
    if expected.location:
        assert response["Location"].startswith(expected.location), response["Location"]
    if api:
        error = response.json()["error"]
        assert error["message"]
        assert error["type"] == {401: "authentication", 403: "permission_denied", 404: "not_found"}[expected.status]
    if api and expected is UNAUTHORIZED:
        assert response["WWW-Authenticate"].startswith("Bearer")


# --- request bodies ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """A request body: ``kind`` "form" (urlencoded/multipart form fields), "json" or "file"
    (multipart with one file in ``field``)."""

    kind: str
    data: dict

    def send(self, client, method: str, path: str):
        if self.kind == "json":
            return client.generic(
                method, path, json.dumps(self.data), content_type="application/json"
            )
        if self.kind == "file":
            upload = SimpleUploadedFile("pwned.txt", b"pwned\n", content_type="text/plain")
            return client.post(path, {self.data["field"]: upload})
        assert method == "POST", "form bodies are POSTed"
        return client.post(path, self.data)


def form(**fields) -> Callable[[World], Body]:
    return lambda w: Body("form", {k: v(w) if callable(v) else v for k, v in fields.items()})


def js(**fields) -> Callable[[World], Body]:
    return lambda w: Body("json", {k: v(w) if callable(v) else v for k, v in fields.items()})


def send(client, method: str, path: str, body: Body | None):
    """Send one request; ``body`` None: none (GET, DELETE, a bare POST)."""
    if body is not None:
        return body.send(client, method, path)
    return client.generic(method, path)
