"""The fixture world of the security tests (tests/test_security_*.py, issue 10), the people who
try its URLs, and the checks that a refused request read and wrote nothing.

People:
- alice: owner of the organisation Acme. Her conversation in Acme's workspace (shared with
  it) holds a question, an answer, an attached file, a rating with a comment; she has a
  working and a revoked share link to it, a memory fact, an API key (and one revoked), a
  signed-in session row, and Acme has a pending and a withdrawn invitation.
- bob: someone else, owner of the organisation Globex (an owner elsewhere has no say in Acme),
  with a conversation of his own there (a question, an answer, a share link).
- carol: was a member of Acme and was removed.
- dave: a plain member of Acme now (reads what is shared with the workspace; no other role).
- mallory: her only API key is revoked.
- sam: staff (the admin site's CSRF checks need someone the admin lets in).

Every secret text of alice's (``World.secrets``) is a distinctive word, so a refused response that
leaks one is found by a plain search of its body.

The world is built once per test module inside an outer transaction that is rolled back at
the end; each test runs in a savepoint inside it (pytest-django's ``django_db``), so whatever a
test's request writes is undone before the next test.
"""

from __future__ import annotations

import json
import re
import uuid
import warnings
from dataclasses import dataclass, field

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, transaction
from django.test import Client, override_settings

from accounts.models import ApiKey, Membership, UserSession
from accounts.services import api_key_create, api_key_revoke
from attachments.files import file_read
from attachments.services import attachments_create, attachments_link
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from feedback.services import feedback_set
from inference.embeddings import embedding_dimension
from memory.models import MemoryUpdate, UserMemory
from moderation.models import WithdrawnAnswer
from projects import services as project_services
from projects.models import ProjectFile
from sharing.services import share_link_create, share_link_revoke
from tests.conftest import PASSWORD
from workspaces import selectors as workspace_selectors
from workspaces import invitations as workspace_invitations
from workspaces import services as workspace_services

SECRET_TITLE = "quokka-ALICE-TITLE"
SECRET_SYSTEM = "dugong-ALICE-SYSTEM"
SECRET_QUESTION = "narwhal-ALICE-QUESTION"
SECRET_ANSWER = "axolotl-ALICE-ANSWER"
SECRET_FILE = "okapi-ALICE-FILE"
SECRET_FILE_NAME = "okapi-plans.txt"
SECRET_FACT = "pangolin-ALICE-FACT"
SECRET_COMMENT = "tapir-ALICE-COMMENT"
SECRET_EMAIL = "alice.wombat@example.org"
ORG_NAME = "Acme Wombat Works"  # an outsider must not learn what "acme" is


@dataclass
class World:
    """Everything the security tests point at (see the module docstring)."""

    alice: object
    bob: object
    carol: object
    dave: object
    mallory: object
    sam: object
    acme: object
    globex: object
    conversation: Conversation
    question: Turn
    answer: Turn
    attachment: object
    link: object  # alice's working share link
    revoked_link: object
    fact: UserMemory
    memory_update: object  # alice's "Memory updated" (issue 28), for its Undo
    feedback: object
    alice_key: ApiKey
    alice_session: UserSession
    invitation: object  # pending, by link
    bob_conversation: Conversation  # in Globex: a question and its answer
    bob_answer: Turn
    project: object = None  # alice's project in acme's workspace (members open it, dave too)
    project_file: object = None  # a file of it
    personal_project: object = None  # alice's own project, outside acme
    raw: dict[str, str] = field(default_factory=dict)  # raw secrets: keys, tokens

    def secrets(self, *, member: bool = False) -> list[str]:
        """Alice's texts and credentials that no refused response may contain. ``member``: the
        organisation's name is no secret from its members (dave)."""
        found = [
            SECRET_TITLE, SECRET_SYSTEM, SECRET_QUESTION, SECRET_ANSWER, SECRET_FILE,
            SECRET_FILE_NAME, SECRET_FACT, SECRET_COMMENT, SECRET_EMAIL,
            self.raw["alice_key"], self.raw["link"], self.raw["invitation"],
        ]  # fmt: skip
        return found if member else [*found, ORG_NAME]


def _user(username: str, **fields):
    return get_user_model().objects.create_user(username=username, password=PASSWORD, **fields)


def build_world() -> World:
    """Create the world (module docstring). Call inside a transaction that is rolled back."""
    alice = _user("alice", email=SECRET_EMAIL)
    bob, carol, dave, mallory = (_user(n) for n in ("bob", "carol", "dave", "mallory"))
    sam = _user("sam", is_staff=True, is_superuser=True)

    acme = workspace_services.organisation_create(creator=alice, name=ORG_NAME, slug="acme")
    globex = workspace_services.organisation_create(creator=bob, name="Globex", slug="globex")
    Membership.objects.create(organisation=acme, user=dave, role=Membership.Role.MEMBER)
    carol_seat = Membership.objects.create(
        organisation=acme, user=carol, role=Membership.Role.MEMBER
    )
    alice_seat = workspace_selectors.seat_get(slug="acme", user=alice)

    conversation = conversation_services.conversation_create(
        owner=alice, org=acme, title=SECRET_TITLE, system_prompt=SECRET_SYSTEM
    )
    question = conversation_services.turn_append_user(
        conversation=conversation, content=f"Remember {SECRET_QUESTION} for me."
    )
    answer = conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=f"I will remember {SECRET_ANSWER}.", status=Turn.Status.COMPLETE,
        prompt_tokens=7, completion_tokens=4,
    )  # fmt: skip
    (attachment,) = attachments_create(
        conversation=conversation,
        uploads=[
            file_read(
                name=SECRET_FILE_NAME,
                data=f"the file says {SECRET_FILE}\n".encode(),
                encode_text=str.split,
            )  # fmt: skip
        ],
    )
    attachments_link(conversation=conversation, question=question, attachments=[attachment])
    # An answer of alice's the output gate withdrew, for acme's admins to review (issue 28).
    WithdrawnAnswer.objects.create(
        conversation=conversation, turn_id=uuid.uuid4(), owner=alice, org=acme,
        text=f"About {SECRET_ANSWER}", window=f"About {SECRET_ANSWER}",
        verdict={"flagged": True, "categories": ["indiscriminate_weapons"], "gate": "output"},
    )  # fmt: skip
    workspace_services.conversation_share_set(conversation=conversation, user=alice, shared=True)
    conversation.refresh_from_db()
    link = share_link_create(conversation=conversation, user=alice)
    revoked_link = share_link_create(conversation=conversation, user=alice)
    share_link_revoke(conversation=conversation, link=revoked_link, user=alice)
    feedback = feedback_set(
        conversation=conversation, answer=answer, user=alice, rating="up", comment=SECRET_COMMENT
    )
    project = project_services.project_create(owner=alice, name=SECRET_TITLE, instructions=SECRET_SYSTEM, org=acme)
    project_file = ProjectFile.objects.create(
        project=project, uploaded_by=alice, name=SECRET_FILE_NAME, kind=ProjectFile.Kind.TEXT, size=10,
        sha256="0" * 64, storage_name=f"{project.pk}/secret", status=ProjectFile.Status.READY,
    )  # fmt: skip
    personal_project = project_services.project_create(
        owner=alice, name=SECRET_TITLE, instructions=SECRET_SYSTEM, personal=True
    )
    fact = UserMemory.objects.create(
        user=alice, text=SECRET_FACT, embedding=[0.0] * embedding_dimension()
    )
    memory_update = MemoryUpdate.objects.create(
        user=alice, conversation_id=conversation.pk, turn_id=question.turn_id, summary="Remembered: x"
    )
    alice_key = api_key_create(user=alice, name="alice's script")
    alice_revoked = api_key_create(user=alice, name="alice's old script")
    api_key_revoke(api_key=alice_revoked.api_key)
    mallory_key = api_key_create(user=mallory, name="mallory's script")
    api_key_revoke(api_key=mallory_key.api_key)
    keys = {
        name: api_key_create(user=u, name="k")
        for name, u in (("bob", bob), ("carol", carol), ("dave", dave))
    }
    alice_session = UserSession.objects.create(
        user=alice, session_key=f"alice-{uuid.uuid4().hex[:24]}", user_agent="Firefox"
    )
    invitation = workspace_invitations.invitation_create(seat=alice_seat)
    withdrawn = workspace_invitations.invitation_create(seat=alice_seat)
    workspace_invitations.invitation_revoke(seat=alice_seat, invitation=withdrawn.invitation)
    bob_conversation = conversation_services.conversation_create(
        owner=bob, org=globex, title="Bob's"
    )
    bob_question = conversation_services.turn_append_user(
        conversation=bob_conversation, content="Hi"
    )
    bob_answer = conversation_services.turn_append_assistant(
        conversation_id=bob_conversation.pk, turn_id=uuid.uuid4(), reply_to_id=bob_question.turn_id,
        content="Hello", status=Turn.Status.COMPLETE, prompt_tokens=3, completion_tokens=1,
    )  # fmt: skip
    share_link_create(conversation=bob_conversation, user=bob)
    # carol is removed last: by then she had been a member while all of this was made.
    workspace_services.member_remove(seat=alice_seat, membership=carol_seat)

    return World(
        alice=alice, bob=bob, carol=carol, dave=dave, mallory=mallory, sam=sam,
        acme=acme, globex=globex, conversation=conversation, question=question, answer=answer,
        attachment=attachment, link=link, revoked_link=revoked_link, fact=fact,
        memory_update=memory_update,
        feedback=feedback, alice_key=alice_key.api_key, alice_session=alice_session,
        invitation=invitation.invitation, bob_conversation=bob_conversation, bob_answer=bob_answer,
        project=project, project_file=project_file, personal_project=personal_project,
        raw={
            "alice_key": alice_key.raw, "alice_revoked": alice_revoked.raw,
            "mallory_revoked": mallory_key.raw, "bob_key": keys["bob"].raw,
            "carol_key": keys["carol"].raw, "dave_key": keys["dave"].raw,
            "link": link.token, "revoked_link": revoked_link.token,
            "invitation": invitation.token, "withdrawn_invitation": withdrawn.token,
        },
    )  # fmt: skip


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """The world, built once per module in a transaction rolled back after its last test;
    attachment files in a folder of the module's own."""
    storage = override_settings(
        CHAT_ATTACHMENT_STORAGE={
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path_factory.mktemp("attachments"))},
        },
        CHAT_PROJECT_FILE_STORAGE={
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path_factory.mktemp("project-files"))},
        },
    )
    storage.enable()
    try:
        with django_db_blocker.unblock(), transaction.atomic():
            try:
                yield build_world()
            finally:
                transaction.set_rollback(True)
    finally:
        storage.disable()


@pytest.fixture
def keep_test_connection(monkeypatch):
    """Streaming views close their database connection before they stream (core/db.py
    ``release_db_connection``: pool hygiene). Here that connection holds the world's uncommitted
    transaction, so closing it is skipped (nothing under test depends on it)."""
    from core import db  # noqa: PLC0415

    monkeypatch.setattr(db, "_close_connection", lambda: None)


@pytest.fixture
def generation_refused(monkeypatch):
    """Stop a request where it would start generating, as if the conversation (or the engine)
    were busy (409):
    reaching that point shows the access checks let it through, and no generation task (whose
    database calls run on other connections, outside the world's transaction) is started."""
    from api import completions  # noqa: PLC0415
    from core.errors import ApiError  # noqa: PLC0415
    from conversations import locks, submit  # noqa: PLC0415

    async def busy(**kwargs):
        raise locks.ConversationBusy("(test) generation is not started here")

    async def admit_busy(*args, **kwargs):
        raise ApiError(409, "conflict", "(test) generation is not started here")

    monkeypatch.setattr(submit, "turn_submit", busy)
    monkeypatch.setattr(submit, "answer_regenerate", busy)
    monkeypatch.setattr(submit, "answer_continue", busy)
    monkeypatch.setattr(completions, "_admit", admit_busy)


# --- who knocks ----------------------------------------------------------------------------------

# Signed-in people of the HTML pages; each gets a session of their own.
PEOPLE = ("alice", "bob", "carol", "dave", "sam")
# Bearer credentials of /v1, by actor name.
KEYS = ("alice_key", "alice_revoked", "mallory_revoked", "bob_key", "carol_key", "dave_key")


def client_for(world: World, actor: str, *, enforce_csrf_checks: bool = False) -> Client:
    """A test client acting as ``actor``: "anonymous"; a person's name (a signed-in session);
    a key's name (``KEYS``: ``Authorization: Bearer``, no cookie); "alice_session" (alice's
    session cookie, no bearer token); "alice_session_csrf" (the same plus a valid CSRF token,
    as a script on one of our pages could send)."""
    if actor in KEYS:
        return Client(
            enforce_csrf_checks=enforce_csrf_checks,
            headers={"Authorization": f"Bearer {world.raw[actor]}"},
        )
    client = Client(enforce_csrf_checks=enforce_csrf_checks or actor.startswith("alice_session"))
    if actor == "anonymous":
        return client
    person = "alice" if actor.startswith("alice_session") else actor
    client.force_login(getattr(world, person))
    if actor == "alice_session_csrf":
        client.defaults["HTTP_X_CSRFTOKEN"] = csrf_token_of(client)
    return client


HX_HEADERS = re.compile(r"""hx-headers='(\{[^']*\})'""")


def csrf_token_of(client: Client, page: str = "/") -> str:
    """The CSRF token htmx sends (``X-CSRFToken`` from ``<body hx-headers=...>``, which
    templates/base.html fills from the same secret as the ``csrftoken`` cookie): read from the
    page as the browser would. Anonymous visitors' pages: pass e.g. the sign-in page."""
    response = client.get(page)
    assert response.status_code == 200, (page, response.status_code)
    found = HX_HEADERS.search(response.content.decode())
    if found is not None:
        token = json.loads(found.group(1))["X-CSRFToken"]
    else:  # a page without the htmx body (sign-in): the form's hidden field
        token = re.search(
            r'name="csrfmiddlewaretoken" value="([^"]+)"', response.content.decode()
        ).group(1)
    assert settings.CSRF_COOKIE_NAME in client.cookies
    return token


# --- nothing read, nothing written ----------------------------------------------------------------

# Columns a request may change without writing anything of anyone's: when a key or a session was
# last used (refreshed on any authenticated request, refused or not) and a session's address.
VOLATILE = {
    "accounts.user": {"last_login"},
    "accounts.apikey": {"last_used_at"},
    "accounts.usersession": {"last_seen_at", "ip", "user_agent"},
}


def watched_models() -> list:
    """Every concrete model of the project's own apps (so a new app's tables are watched
    without a change here), plus the admin's log: what a refused request must leave alone."""
    base = str(settings.BASE_DIR)
    models = [
        model
        for config in apps.get_app_configs()
        if str(config.path).startswith(base) and "/.venv/" not in str(config.path)
        for model in config.get_models()
        if not model._meta.proxy
    ]
    return [*models, apps.get_model("admin", "LogEntry")]


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else value  # pgvector's numpy arrays


def snapshot() -> dict[str, list[str]]:
    """Every row of :func:`watched_models` (minus ``VOLATILE`` columns), by model label."""
    state = {}
    for model in watched_models():
        label = model._meta.label_lower
        names = [
            f.attname
            for f in model._meta.concrete_fields
            if f.attname not in VOLATILE.get(label, ())
        ]
        rows = model._base_manager.using(DEFAULT_DB_ALIAS).order_by("pk").values_list(*names)
        # Rows as JSON text: comparable as sets (JSON fields hold lists and dicts).
        state[label] = [json.dumps([_plain(v) for v in row], default=str) for row in rows]
    return state


def changes(before: dict, after: dict) -> dict[str, str]:
    """What differs between two snapshots, per model: rows added, removed or changed."""
    found = {}
    for label in before.keys() | after.keys():
        old, new = set(before.get(label, ())), set(after.get(label, ()))
        if old != new:
            found[label] = f"{len(new - old)} new/changed row(s), {len(old - new)} gone/changed"
    return found


def body_text(response) -> str:
    """The response's body as text (a streamed one read whole; binary bodies as Latin-1, which
    keeps ASCII secrets findable)."""
    if not response.streaming:
        return response.content.decode("latin-1")
    with warnings.catch_warnings():  # an async stream read by the sync test client: expected
        warnings.simplefilter("ignore")
        return b"".join(response).decode("latin-1")


def leaked(response, secrets: list[str]) -> list[str]:
    """The secrets found in the response's body or headers."""
    text = body_text(response) + "\n" + "\n".join(f"{k}: {v}" for k, v in response.items())
    return [s for s in secrets if s in text]


def alice_fingerprint(world: World) -> dict:
    """Alice's data as it stands: what someone acting on their own account (their own memory,
    keys, sessions, organisations) must not touch."""
    label_of = {
        "conversations": Conversation.objects.filter(owner=world.alice),
        "turns": Turn.objects.filter(conversation__owner=world.alice),
        "facts": UserMemory.objects.filter(user=world.alice),
        "keys": ApiKey.objects.filter(user=world.alice),
        "sessions": UserSession.objects.filter(user=world.alice),
        "acme members": Membership.objects.filter(organisation=world.acme),
    }
    state = {}
    for label, query in label_of.items():
        rows = query.order_by("pk").values()
        state[label] = [
            {
                k: _plain(v)
                for k, v in row.items()
                if k not in {"last_used_at", "last_seen_at", "ip", "user_agent"}
            }
            for row in rows
        ]
    state["user"] = (
        get_user_model()
        .objects.filter(pk=world.alice.pk)
        .values("password", "email", "memory_enabled", "session_salt", "is_active")[0]
    )
    return state
