"""Alice's ids inside bob's own URLs and bodies, and refusals that do not tell whether an id
exists (issue 10).

The matrix (tests/test_security_matrix.py) fills every parameter of a URL with alice's objects.
Here bob keeps his own conversation (or organisation) in the URL and slips in one object of
alice's: a turn, a link, a file, an invitation, a member, a fact, or (on /v1) a turn to replace
or a file to attach. Each must be refused as if the object did not exist, with nothing read or
written. And for every refusal of an object route, bob cannot tell alice's real id from one that
names nothing: same status, same page.

World and people: tests/security_world.py.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import pytest

from core import regions
from tests.security_outcomes import (
    API_OWN,
    ORG_ADMINS_HIDDEN,
    ORG_MEMBERS,
    ORG_ROLE,
    OWN,
    WORKSPACE_READ,
    Body,
    send,
)
from tests.security_routes import BY_NAME, ROUTES, Route
from tests.security_world import (
    World,
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
def _engine(engine_double, keep_test_connection, generation_refused):
    """A request that got past the checks to the point of answering gets 409, never an engine."""
    return engine_double


# --- alice's objects in bob's URLs ----------------------------------------------------------------


@dataclass(frozen=True)
class Mixed:
    """Route ``name`` with bob's own container and one of alice's objects (``kwargs``);
    ``body``: instead of the table's; ``expected``: the statuses that mean "refused"."""

    label: str
    name: str
    kwargs: object
    body: object = None
    expected: tuple[int, ...] = (404,)


def bobs(w: World, **alices) -> dict:
    return {"conversation_id": w.bob_conversation.pk, **alices}


def globex(w: World, **alices) -> dict:
    return {"slug": w.globex.slug, **alices}


MIXED = [
    Mixed("alice's question", "turn-events", lambda w: bobs(w, turn_id=w.question.pk)),
    Mixed("alice's question", "turn-edit", lambda w: bobs(w, turn_id=w.question.pk)),
    Mixed("alice's answer", "answer-regenerate", lambda w: bobs(w, turn_id=w.answer.pk)),
    Mixed("alice's answer", "answer-version", lambda w: bobs(w, turn_id=w.answer.pk)),
    Mixed("alice's question", "question-select", lambda w: bobs(w, turn_id=w.question.pk)),
    Mixed("alice's answer", "answer-feedback", lambda w: bobs(w, turn_id=w.answer.pk)),
    Mixed("alice's link", "share-update", lambda w: bobs(w, link_id=w.link.pk)),
    Mixed("alice's link", "share-revoke", lambda w: bobs(w, link_id=w.link.pk)),
    Mixed("alice's file", "attachment-download", lambda w: bobs(w, attachment_id=w.attachment.pk)),
    Mixed("an Acme member", "org-member-remove", lambda w: globex(w, user_id=w.dave.pk)),
    Mixed("alice", "org-member-remove", lambda w: globex(w, user_id=w.alice.pk)),
    Mixed("an Acme member", "org-member-role", lambda w: globex(w, user_id=w.dave.pk)),
    Mixed(
        "Acme's invitation",
        "org-invitation-revoke",
        lambda w: globex(w, invitation_id=w.invitation.pk),
    ),
    Mixed("alice's answer", "v1-turn-events", lambda w: bobs(w, turn_id=w.answer.pk)),
    Mixed("alice's answer", "v1-turn-regenerate", lambda w: bobs(w, turn_id=w.answer.pk)),
    Mixed("alice's answer", "v1-answer-feedback", lambda w: bobs(w, turn_id=w.answer.pk)),
    Mixed(
        "alice's question replaced",
        "v1-turns",
        bobs,
        lambda w: Body("json", {"role": "user", "content": "x", "replaces": str(w.question.pk)}),
        (400,),
    ),  # fmt: skip
    Mixed(
        "alice's file attached",
        "v1-turns",
        bobs,
        lambda w: Body(
            "json", {"role": "user", "content": "x", "attachments": [str(w.attachment.pk)]}
        ),
        (400, 404),
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", MIXED, ids=[f"{c.name}-{c.label}" for c in MIXED])
def test_alices_object_in_bobs_url_is_not_found(world, case):
    """Given bob's own conversation or organisation in the URL, when he names one of alice's
    objects in it, then it is refused as missing, with none of alice's secrets in the answer and
    no row changed (her file's text never reaches his prompt: nothing is generated)."""
    route = BY_NAME[case.name]
    client = client_for(world, "bob_key" if route.api else "bob")
    method = route.methods[-1]
    body = case.body(world) if case.body else route.body(world, method)
    before = snapshot()

    response = send(client, method, route_path(route, case.kwargs(world)), body)

    assert response.status_code in case.expected, body_text(response)[:300]
    assert not leaked(response, world.secrets())
    assert changes(before, snapshot()) == {}


def test_alices_fact_in_bobs_memory_patch_is_ignored(world):
    """PATCH /v1/users/<bob>/memory removing alice's fact id: bob's call succeeds (there is
    nothing of his to remove) and alice's fact is still there."""
    before = alice_fingerprint(world)

    response = client_for(world, "bob_key").patch(
        f"/v1/users/{world.bob.pk}/memory", f'{{"remove": ["{world.fact.pk}"]}}',
        content_type="application/json",
    )  # fmt: skip

    assert response.status_code == 200
    assert alice_fingerprint(world) == before


def route_path(route: Route, kwargs: dict) -> str:
    from django.urls import reverse  # noqa: PLC0415

    return reverse(route.name, kwargs=kwargs)


# --- a refusal says nothing about existence ------------------------------------------------------


def missing_kwargs(world: World, kwargs: dict) -> dict:
    """``kwargs`` with every id replaced by a well-formed one that names nothing (a conversation
    id of the same region, so the region tag cannot tell them apart either)."""
    fake = {}
    for key, value in kwargs.items():
        if key == "conversation_id":
            fake[key] = regions.new_conversation_id(world.conversation.region)
        elif isinstance(value, uuid.UUID):
            fake[key] = uuid.uuid4()
        elif isinstance(value, int):
            fake[key] = 2_000_000_000 + len(fake)
        else:
            fake[key] = "no-such-org"
    return fake


TOKENS = re.compile(r'(csrfmiddlewaretoken" value="|X-CSRFToken": ")[^"]+')


def normalised(response, kwargs: dict) -> str:
    """The body with the ids of the request and the per-request CSRF tokens blanked out. A
    small integer id also occurs in a page's own markup (an icon's path data, the htmx config),
    so one is blanked only where it names something: as a segment of a path."""
    text = TOKENS.sub(r"\1TOKEN", body_text(response))
    for value in kwargs.values():
        if str(value).isdigit():
            text = re.sub(rf"(?<=/){value}(?=[/?#\"]|$)", "ID", text)
        else:
            text = re.sub(rf"(?<![\w-]){re.escape(str(value))}(?![\w-])", "ID", text)
    return text


OBJECT_ROWS = (OWN, API_OWN, ORG_MEMBERS, ORG_ADMINS_HIDDEN, ORG_ROLE, WORKSPACE_READ)


def _existence_cases() -> list[tuple[Route, str]]:
    return [(r, m) for r in ROUTES if r.access in OBJECT_ROWS for m in r.methods]


@pytest.mark.parametrize(
    ("route", "method"), _existence_cases(), ids=[f"{r.name}-{m}" for r, m in _existence_cases()]
)
def test_a_refusal_does_not_tell_whether_the_id_exists(world, route, method):
    """Given bob (his key on /v1), when he tries the route with alice's ids and with ids that
    name nothing, then both answers are the same status and the same page."""
    client = client_for(world, "bob_key" if route.api else "bob")
    real = route.kwargs(world)
    fake = missing_kwargs(world, real)
    body = route.body(world, method)

    on_real = send(client, method, route_path(route, real), body)
    on_fake = send(client, method, route_path(route, fake), body)

    assert on_real.status_code == on_fake.status_code
    assert normalised(on_real, real) == normalised(on_fake, fake)
