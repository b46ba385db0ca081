"""Data exports (issue 10): "Download my data" (``/settings/data/``), ``GET /v1/users/{id}/export``
and an organisation's export (``/orgs/<slug>/export/``): what the archive holds, that it holds
only the exporter's own data, who may export an organisation, CSRF and sign-in.

People: alice and bob, each with a conversation (an answer, an attached file, a share link, a
rating), a memory fact, a usage record and an API key; each one's text carries a word of their
own ("tangerine", "plum") so any leak of one into the other's archive is found by a search of
every file. Organisation exports: Acme (owner olga, admin adam, member mia), Globex (otto).
Deletion: tests/test_privacy_deletion.py; across two real region databases:
tests/integration/test_privacy_regions.py.
"""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.test import Client

from accounts.models import Membership, UserSession
from accounts.services import api_key_create
from attachments.files import file_read
from attachments.services import attachments_create, attachments_link
from audit.models import AuditEntry
from conversations import services
from conversations.models import Turn
from feedback.services import feedback_set
from inference.embeddings import embedding_dimension
from memory.models import UserMemory
from moderation.services import withdrawn_answer_keep
from privacy import export_sections
from sharing.services import share_link_create
from usage.models import UsageRecord
from workspaces import services as workspace_services

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    """Attachment files in a folder of this test's own."""
    settings.CHAT_ATTACHMENT_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "attachments")},
    }
    return tmp_path / "attachments"


def conversation_with_data(
    user, word: str, *, org=None, title: str | None = None
) -> SimpleNamespace:
    """A conversation of ``user`` holding ``word`` in its question, answer, file, rating and
    title, with a share link; plus a usage record for its answer."""
    conversation = services.conversation_create(
        owner=user, org=org, title=title or f"Plans about {word}"
    )
    question = services.turn_append_user(
        conversation=conversation, content=f"Remember {word} for me."
    )
    answer = services.turn_append_assistant(
        conversation_id=conversation.pk,
        turn_id=uuid.uuid4(),
        reply_to_id=question.turn_id,
        content=f"I will remember {word}.",
        status="complete",
        prompt_tokens=7,
        completion_tokens=4,
    )
    (attachment,) = attachments_create(
        conversation=conversation,
        uploads=[
            file_read(
                name=f"{word}.txt", data=f"the file says {word}\n".encode(), encode_text=str.split
            )
        ],
    )
    attachments_link(conversation=conversation, question=question, attachments=[attachment])
    conversation.refresh_from_db()
    link = share_link_create(conversation=conversation, user=user)
    feedback_set(
        conversation=conversation, answer=answer, user=user, rating="up", comment=f"good {word}"
    )
    UsageRecord.objects.create(
        user=user,
        org=org,
        turn_id=answer.turn_id,
        conversation_id=conversation.pk,
        pool="mini",
        model_version="1",
        tier=user.tier,
        prompt_tokens=7,
        completion_tokens=4,
        cost_usd=Decimal("0.00002325"),
    )
    return SimpleNamespace(
        conversation=conversation,
        question=question,
        answer=answer,
        attachment=attachment,
        link=link,
    )


def account_with_data(make_user, name: str, word: str) -> SimpleNamespace:
    """A user with :func:`conversation_with_data`, a memory fact, an API key and a session row."""
    user = make_user(name, email=f"{name}@example.com")
    data = conversation_with_data(user, word)
    UserMemory.objects.create(
        user=user, text=f"likes {word}", embedding=[0.0] * embedding_dimension()
    )
    data.key = api_key_create(user=user, name=f"{name}'s script")
    UserSession.objects.create(
        user=user, session_key=f"s-{name}-{uuid.uuid4().hex[:20]}", user_agent="Firefox"
    )
    data.user = user
    return data


def signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def body(response) -> bytes:
    """The whole body of a (streamed) response."""
    return b"".join(response)


def archive(response) -> zipfile.ZipFile:
    assert response.status_code == 200, (
        response.content[:300] if not response.streaming else response.status_code
    )
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"].startswith("attachment;")
    return zipfile.ZipFile(io.BytesIO(body(response)))


def data_json(zf: zipfile.ZipFile) -> dict:
    return json.loads(zf.read("data.json"))


def everything(zf: zipfile.ZipFile) -> str:
    """Every entry of the archive as text, for searching."""
    return "\n".join(zf.read(name).decode("utf-8", "replace") for name in zf.namelist())


@pytest.fixture
def alice(make_user):
    return account_with_data(make_user, "alice", "tangerine")


@pytest.fixture
def bob(make_user):
    return account_with_data(make_user, "bob", "plum")


# --- what a person's archive holds ---------------------------------------------------------------


def test_the_archive_has_data_json_a_markdown_file_per_conversation_and_the_files(alice):
    """Given alice with a conversation and a file, when she downloads her data, then the zip
    holds data.json, her conversation as Markdown (question and answer) and the file's bytes."""
    zf = archive(signed_in(alice.user).post("/settings/data/export"))

    names = zf.namelist()
    markdown = [n for n in names if n.startswith("conversations/") and n.endswith(".md")]
    assert "data.json" in names and "README.txt" in names
    assert len(markdown) == 1
    text = zf.read(markdown[0]).decode()
    assert "Remember tangerine for me." in text and "I will remember tangerine." in text
    (conversation,) = data_json(zf)["conversations"]
    (attachment,) = conversation["attachments"]
    assert zf.read(attachment["file"]) == b"the file says tangerine\n"


def test_data_json_holds_the_conversation_turns_link_and_rating(alice):
    """Then data.json has the conversation with both turns (content, status, usage), its file,
    its share link and its rating with the comment."""
    data = data_json(archive(signed_in(alice.user).post("/settings/data/export")))

    (conversation,) = data["conversations"]
    assert conversation["conversation_id"] == str(alice.conversation.pk)
    assert [(t["role"], t["content"]) for t in conversation["turns"]] == [
        ("user", "Remember tangerine for me."),
        ("assistant", "I will remember tangerine."),
    ]
    assert conversation["turns"][1]["prompt_tokens"] == 7
    # Every field of a turn but its conversation's id (the links as reply_to / replaces /
    # continues / parent).
    fields = {f.attname for f in Turn._meta.concrete_fields} - {"conversation_id"}
    links = {"reply_to", "replaces", "continues", "parent"}
    renamed = (fields - {f"{name}_id" for name in links}) | links | {"held"}
    assert set(conversation["turns"][1]) == renamed
    assert conversation["turns"][1]["reply_to"] == conversation["turns"][0]["turn_id"]
    assert conversation["share_links"][0]["link_id"] == str(alice.link.pk)
    assert conversation["feedback"][0]["comment"] == "good tangerine"
    assert conversation["attachments"][0]["name"] == "tangerine.txt"


def test_data_json_holds_a_withdrawn_answer_kept_for_review(alice):
    """Issue 28: the text the output gate withdrew is the person's data too: it is in their
    archive with the categories that fired and whether a reviewer marked it fine."""
    answer = Turn.objects.get(conversation_id=alice.conversation.pk, role="assistant")
    withdrawn_answer_keep(
        conversation_id=alice.conversation.pk, turn_id=answer.turn_id, owner_id=alice.user.pk,
        org_id=None, text="I will remember tangerine.", window="remember tangerine",
        verdict={"flagged": True, "categories": ["indiscriminate_weapons"]}, zero_retention=False,
    )  # fmt: skip

    data = data_json(archive(signed_in(alice.user).post("/settings/data/export")))

    (conversation,) = data["conversations"]
    (kept,) = conversation["withdrawn_answers"]
    assert kept["turn_id"] == str(answer.turn_id) and kept["text"] == "I will remember tangerine."
    assert kept["categories"] == ["indiscriminate_weapons"] and kept["reviewed_as_fine"] is False


def test_data_json_holds_account_settings_memory_usage_keys_and_sessions(alice):
    data = data_json(archive(signed_in(alice.user).post("/settings/data/export")))

    assert data["format"] == "chatsite-export" and data["kind"] == "account"
    assert (
        data["account"]["username"] == "alice" and data["account"]["email"] == "alice@example.com"
    )
    assert data["settings"] == {
        "tier": "free",
        "region": alice.user.region,
        "memory_enabled": True,
        "training_opt_out": False,
        "feature_flags": [],
    }
    assert [m["text"] for m in data["memory"]] == ["likes tangerine"]
    assert [(u["prompt_tokens"], u["completion_tokens"], u["cost_usd"]) for u in data["usage"]] == [
        (7, 4, "0.00002325")
    ]
    assert [k["name"] for k in data["api_keys"]] == ["alice's script"]
    assert "Firefox" in [s["user_agent"] for s in data["sessions"]]


def test_every_version_is_in_data_json_and_the_markdown_shows_the_current_one(alice):
    """Given an edited question, then data.json has both versions and the Markdown file the
    newest only (the branch shown, marked as version 2 of 2)."""
    services.turn_append_user(
        conversation=alice.conversation,
        content="Remember tangerine twice.",
        replaces=alice.question,
    )
    zf = archive(signed_in(alice.user).post("/settings/data/export"))

    contents = [t["content"] for t in data_json(zf)["conversations"][0]["turns"]]
    assert "Remember tangerine for me." in contents and "Remember tangerine twice." in contents
    markdown = zf.read(data_json(zf)["conversations"][0]["markdown_file"]).decode()
    assert "Remember tangerine twice." in markdown and "Remember tangerine for me." not in markdown
    assert "(version 2 of 2)" in markdown


def test_another_users_data_never_appears(alice, bob):
    """Given alice and bob, each with everything, when alice downloads her data, then no entry
    of her archive mentions bob's word, conversation, file, memory, key or email."""
    zf = archive(signed_in(alice.user).post("/settings/data/export"))

    text = everything(zf)
    assert "plum" not in text
    assert str(bob.conversation.pk) not in text and str(bob.attachment.pk) not in text
    assert "bob@example.com" not in text and bob.key.api_key.prefix not in text
    assert "tangerine" in text  # the search sees her own


def test_credentials_are_left_out(alice):
    """Then the share link's token, the API key's hash and secret, and session keys appear
    nowhere (an archive is copied around; they would be working credentials)."""
    text = everything(archive(signed_in(alice.user).post("/settings/data/export")))

    assert alice.link.token not in text
    assert alice.key.api_key.key_hash not in text and alice.key.raw.partition(".")[2] not in text
    assert not any(s.session_key in text for s in UserSession.objects.filter(user=alice.user))


def test_conversations_beyond_one_batch_are_all_exported(make_user, monkeypatch):
    """Given 5 conversations read 2 at a time (keyset pages), then all 5 are exported once."""
    monkeypatch.setattr(export_sections, "BATCH", 2)
    user = make_user("carol")
    made = {str(services.conversation_create(owner=user, title=f"c{i}").pk) for i in range(5)}

    data = data_json(archive(signed_in(user).post("/settings/data/export")))

    exported = [c["conversation_id"] for c in data["conversations"]]
    assert sorted(exported) == sorted(made)


def test_the_export_is_recorded_in_the_audit_log(alice):
    signed_in(alice.user).post("/settings/data/export")

    entry = AuditEntry.objects.get(action="account.export")
    assert (entry.actor_id, entry.target_id, entry.org_id) == (
        alice.user.pk,
        str(alice.user.pk),
        None,
    )


def test_the_data_page_offers_the_download_form(alice):
    page = signed_in(alice.user).get("/settings/data/")

    assert page.status_code == 200
    assert b'id="data-export"' in page.content and b"csrfmiddlewaretoken" in page.content


@pytest.mark.parametrize(
    ("method", "path"), [("get", "/settings/data/"), ("post", "/settings/data/export")]
)
def test_an_anonymous_visitor_is_sent_to_sign_in(method, path):
    response = getattr(Client(), method)(path)

    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_download_needs_the_csrf_token(alice):
    """Given a client that enforces CSRF, a POST without the token is refused (403) and builds
    nothing; with the page's token it downloads."""
    client = signed_in(alice.user, enforce_csrf_checks=True)

    refused = client.post("/settings/data/export")
    exported_before = AuditEntry.objects.filter(action="account.export").exists()
    client.get("/settings/data/")
    allowed = client.post(
        "/settings/data/export", {"csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    )

    assert refused.status_code == 403 and not exported_before
    assert allowed.status_code == 200


def test_a_get_does_not_download(alice):
    assert signed_in(alice.user).get("/settings/data/export").status_code == 405


# --- the API ----------------------------------------------------------------------------------


def test_the_api_returns_the_callers_archive(alice):
    response = Client().get(
        f"/v1/users/{alice.user.pk}/export", HTTP_AUTHORIZATION=f"Bearer {alice.key.raw}"
    )

    data = data_json(archive(response))
    assert data["account"]["username"] == "alice"
    assert AuditEntry.objects.get(action="account.export").details["via"] == "api"


def test_the_api_answers_404_for_another_users_id(alice, bob):
    response = Client().get(
        f"/v1/users/{bob.user.pk}/export", HTTP_AUTHORIZATION=f"Bearer {alice.key.raw}"
    )

    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_the_api_needs_a_key(alice):
    response = Client().get(f"/v1/users/{alice.user.pk}/export")

    assert response.status_code == 401


# --- an organisation's export ------------------------------------------------------------------


@pytest.fixture
def acme(make_user) -> SimpleNamespace:
    """Acme: olga (owner), adam (admin), mia (member), each with a conversation in Acme; mia
    also has a personal one (created before she joined). Globex: otto, with one of its own."""
    olga, adam, mia, otto = (
        make_user(n, email=f"{n}@example.com") for n in ("olga", "adam", "mia", "otto")
    )
    mia_personal = conversation_with_data(mia, "personal-fig")
    org = workspace_services.organisation_create(creator=olga, name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=adam, role="admin")
    Membership.objects.create(organisation=org, user=mia, role="member")
    globex = workspace_services.organisation_create(creator=otto, name="Globex", slug="globex")
    return SimpleNamespace(
        org=org,
        globex=globex,
        owner=olga,
        admin=adam,
        member=mia,
        other=otto,
        owner_conv=conversation_with_data(olga, "acme-olive", org=org),
        member_conv=conversation_with_data(mia, "acme-melon", org=org),
        mia_personal=mia_personal,
        globex_conv=conversation_with_data(otto, "globex-grape", org=globex),
    )


def test_the_owner_exports_every_conversation_of_the_organisation(acme):
    """Given conversations of the owner and of a member in Acme, when the owner exports Acme,
    then both are in it (with their owners' names) as JSON and Markdown."""
    zf = archive(signed_in(acme.owner).post("/orgs/acme/export/"))

    data = data_json(zf)
    exported = {c["conversation_id"]: c["owner"] for c in data["conversations"]}
    assert exported == {
        str(acme.owner_conv.conversation.pk): "olga",
        str(acme.member_conv.conversation.pk): "mia",
    }
    assert "I will remember acme-melon." in everything(zf)


def test_the_organisation_export_holds_members_and_policies(acme):
    data = data_json(archive(signed_in(acme.owner).post("/orgs/acme/export/")))

    assert data["kind"] == "organisation" and data["organisation"]["slug"] == "acme"
    assert {(m["username"], m["role"]) for m in data["members"]} == {
        ("olga", "owner"),
        ("adam", "admin"),
        ("mia", "member"),
    }
    assert set(data["policies"]) >= {
        "retention_days",
        "zero_retention",
        "pinned_pool",
        "not_for_training",
        "blocked_terms",
    }


def test_the_organisation_export_leaves_out_personal_and_other_organisations_conversations(acme):
    text = everything(archive(signed_in(acme.owner).post("/orgs/acme/export/")))

    assert "personal-fig" not in text and "globex-grape" not in text


def test_the_organisation_export_is_in_its_audit_log(acme):
    signed_in(acme.owner).post("/orgs/acme/export/")

    entry = AuditEntry.objects.get(action="org.export")
    assert (entry.actor_id, entry.org_id) == (acme.owner.pk, acme.org.pk)


@pytest.mark.parametrize(
    ("who", "status"),
    [("owner", 200), ("admin", 403), ("member", 403), ("other", 404), (None, 302)],
)
@pytest.mark.parametrize("method", ["get", "post"])
def test_only_owners_export_the_organisation(acme, who, status, method):
    """Owners may; admins and members get 403 (saying who may); another organisation's owner
    404 (existence not revealed); anonymous visitors are sent to sign in."""
    client = signed_in(getattr(acme, who)) if who else Client()

    response = getattr(client, method)("/orgs/acme/export/")

    assert response.status_code == status
    if status == 302:
        assert response["Location"].startswith("/accounts/login/")
    if status == 403:
        assert b"owners" in response.content
    if status != 200:
        assert not AuditEntry.objects.filter(action="org.export").exists()
