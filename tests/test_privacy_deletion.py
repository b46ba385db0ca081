"""Account and organisation deletion (issue 10), in one database: what goes (every row of the
person's, their files, their sessions and keys), what stays anonymised (usage totals), the
password confirmation (throttled like sign-in), the last-owner rule, CSRF and sign-in. Across
two real region databases: tests/integration/test_privacy_regions.py.

Transactional: attachment files are deleted once the deletion commits (on_commit).
"""

from __future__ import annotations

from decimal import Decimal
from importlib import import_module

import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.db.models import Sum
from django.test import Client

from accounts.models import ApiKey, Membership, Organisation, User, UserSession
from attachments.models import Attachment
from audit.models import AuditEntry
from core import redis_guard
from conversations.models import Conversation, Turn
from feedback.models import Feedback
from memory.models import UserMemory
from privacy import services
from sharing.models import ShareLink
from tests.conftest import PASSWORD
from tests.test_privacy import account_with_data, conversation_with_data
from usage.models import UsageRecord
from workspaces import invitations as workspace_invitations
from workspaces import services as workspace_services
from workspaces.models import Invitation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_throttle_counters():
    """No failed sign-in counters before or after (wrong passwords here count as sign-ins)."""

    def clear():
        client = redis_guard.sync_client()
        for key in client.scan_iter(match="chat:login:*"):
            client.delete(key)

    clear()
    yield
    clear()


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    """Attachment files in a folder of this test's own."""
    settings.CHAT_ATTACHMENT_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "attachments")},
    }
    return tmp_path / "attachments"


@pytest.fixture
def alice(make_user):
    return account_with_data(make_user, "alice", "tangerine")


@pytest.fixture
def bob(make_user):
    return account_with_data(make_user, "bob", "plum")


def signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def delete(client: Client, password: str = PASSWORD):
    return client.post("/settings/delete-account/", {"password": password})


def rows_of(user_id: int) -> dict[str, int]:
    """Every row that names ``user_id``, by kind (the regional ones in the one database here)."""
    conversation_ids = list(
        Conversation.objects.filter(owner_id=user_id).values_list("pk", flat=True)
    )
    return {
        "user": User.objects.filter(pk=user_id).count(),
        "conversations": len(conversation_ids),
        "turns": Turn.objects.filter(conversation_id__in=conversation_ids).count(),
        "attachments": Attachment.objects.filter(conversation_id__in=conversation_ids).count(),
        "share_links": ShareLink.objects.filter(created_by_id=user_id).count(),
        "feedback": Feedback.objects.filter(user_id=user_id).count(),
        "memory": UserMemory.objects.filter(user_id=user_id).count(),
        "api_keys": ApiKey.objects.filter(user_id=user_id).count(),
        "sessions": UserSession.objects.filter(user_id=user_id).count(),
        "memberships": Membership.objects.filter(user_id=user_id).count(),
        "usage": UsageRecord.objects.filter(user_id=user_id).count(),
    }


def files(media) -> list:
    return sorted(p.name for p in media.rglob("*") if p.is_file()) if media.exists() else []


# --- what goes, what stays ----------------------------------------------------------------------


def test_deletion_leaves_no_row_of_the_person(alice, bob):
    """Given alice and bob with everything, when alice deletes her account, then no row of
    hers is left anywhere, and bob's are all still there."""
    before_bob = rows_of(bob.user.pk)

    response = delete(signed_in(alice.user))

    assert response.status_code == 302 and response["Location"] == "/account-deleted/"
    assert set(rows_of(alice.user.pk).values()) == {0}
    assert rows_of(bob.user.pk) == before_bob and before_bob["conversations"] == 1


def test_the_attachment_files_are_removed_from_storage(alice, bob, media):
    assert len(files(media)) == 2

    delete(signed_in(alice.user))

    assert files(media) == [bob.attachment.storage_name.rpartition("/")[2]]


def test_usage_totals_still_add_up_with_no_one_named(alice, bob):
    """Given usage records of alice and bob, when alice is deleted, then the ledger's totals
    are unchanged, her rows name no user and no conversation, and bob's still name him."""
    totals = UsageRecord.objects.aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens"), usd=Sum("cost_usd")
    )
    count = UsageRecord.objects.count()

    delete(signed_in(alice.user))

    assert (
        UsageRecord.objects.aggregate(
            p=Sum("prompt_tokens"), c=Sum("completion_tokens"), usd=Sum("cost_usd")
        )
        == totals
    )
    assert totals["usd"] == Decimal("0.00004650") and UsageRecord.objects.count() == count
    anonymous = UsageRecord.objects.get(user__isnull=True)
    assert anonymous.conversation_id is None and anonymous.prompt_tokens == 7
    assert UsageRecord.objects.filter(user=bob.user).count() == 1


def test_every_session_ends(alice):
    """Given alice signed in on two browsers, when she deletes her account on one, then the
    other is signed out too (sent to sign in)."""
    other_browser = signed_in(alice.user)
    assert other_browser.get("/settings/data/").status_code == 200
    other_key = other_browser.session.session_key

    delete(signed_in(alice.user))

    assert not import_module(settings.SESSION_ENGINE).SessionStore().exists(other_key)
    response = other_browser.get("/settings/data/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_api_key_stops_working(alice):
    delete(signed_in(alice.user))

    response = Client().get("/v1/conversations", HTTP_AUTHORIZATION=f"Bearer {alice.key.raw}")

    assert response.status_code == 401


def test_the_deletion_is_in_the_audit_log_without_personal_data(alice):
    """Then the log says account #id deleted itself and what went, and no audit row holds her
    username, email or words (the log needs no update: it never held them)."""
    user_id = alice.user.pk

    delete(signed_in(alice.user))

    entry = AuditEntry.objects.get(action="account.delete")
    assert (entry.actor_id, entry.target_id) == (user_id, str(user_id))
    assert entry.details["conversations"] == 1 and entry.details["by"] == "self"
    with connection.cursor() as cursor:
        cursor.execute("SELECT string_agg(row_to_json(a)::text, ' ') FROM audit_auditentry a")
        everything = cursor.fetchone()[0]
    assert "alice" not in everything and "tangerine" not in everything


def test_the_admin_log_loses_the_persons_name(alice, make_user):
    staff = make_user("root", is_staff=True)
    LogEntry.objects.log_actions(staff.pk, [alice.user], CHANGE, "[]", single_object=True)

    delete(signed_in(alice.user))

    entry = LogEntry.objects.get(content_type=ContentType.objects.get_for_model(User))
    assert entry.object_repr == f"deleted account #{alice.user.pk}"


def test_invitations_accepted_lose_the_address(make_user):
    olga, nina = make_user("olga"), make_user("nina", email="nina@example.com")
    org = workspace_services.organisation_create(creator=olga, name="Acme", slug="acme")
    seat = workspace_services.Seat(org=org, membership=Membership.objects.get(user=olga))
    issued = workspace_invitations.invitation_create(seat=seat, email="nina@example.com")
    workspace_invitations.invitation_accept(token=issued.token, user=nina)

    delete(signed_in(nina))

    invitation = Invitation.objects.get(pk=issued.invitation.pk)
    assert invitation.email == "" and invitation.accepted_by_id is None


def test_the_goodbye_page_needs_no_account():
    response = Client().get("/account-deleted/")

    assert response.status_code == 200 and b"deleted" in response.content


# --- confirming -------------------------------------------------------------------------------


def test_a_wrong_password_deletes_nothing(alice):
    response = delete(signed_in(alice.user), password="not-my-password")

    assert response.status_code == 400 and b"That is not your password." in response.content
    assert (
        rows_of(alice.user.pk)["conversations"] == 1
        and User.objects.get(pk=alice.user.pk).is_active
    )


def test_wrong_passwords_are_limited_like_sign_ins(alice, settings):
    """Given the sign-in limit of 5 failures per account, when a signed-in session guesses the
    password 5 times, then the next try is refused with 429 and Retry-After, even with the
    right password (as on the sign-in page)."""
    client = signed_in(alice.user)
    for _ in range(settings.CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT):
        delete(client, password="guess")

    response = delete(client)

    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert User.objects.filter(pk=alice.user.pk).exists()


def test_an_account_without_a_password_confirms_with_its_username(make_user):
    user = make_user("sso-user")
    user.set_unusable_password()
    user.save()
    client = signed_in(user)

    page = client.get("/settings/delete-account/")
    wrong = client.post("/settings/delete-account/", {"username": "someone-else"})
    right = client.post("/settings/delete-account/", {"username": "sso-user"})

    assert b'name="username"' in page.content and b'name="password"' not in page.content
    assert wrong.status_code == 400 and right.status_code == 302
    assert not User.objects.filter(pk=user.pk).exists()


def test_the_form_needs_the_csrf_token(alice):
    client = signed_in(alice.user, enforce_csrf_checks=True)

    refused = delete(client)
    client.get("/settings/delete-account/")
    allowed = client.post(
        "/settings/delete-account/",
        {"password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"].value},
    )

    assert refused.status_code == 403
    assert allowed.status_code == 302


@pytest.mark.parametrize("method", ["get", "post"])
def test_an_anonymous_visitor_is_sent_to_sign_in(method):
    response = getattr(Client(), method)("/settings/delete-account/")

    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


# --- the last owner of an organisation ----------------------------------------------------------


@pytest.fixture
def acme(make_user):
    olga, mia = make_user("olga"), make_user("mia")
    org = workspace_services.organisation_create(creator=olga, name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=mia, role="member")
    return org, olga, mia


def test_the_last_owner_is_told_to_hand_over_or_delete_the_organisation(acme):
    _, olga, _ = acme

    page = signed_in(olga).get("/settings/delete-account/")
    response = delete(signed_in(olga))

    assert b"/orgs/acme/members/" in page.content and b"/orgs/acme/delete/" in page.content
    assert b'id="account-delete"' not in page.content
    assert response.status_code == 409
    assert b"You are the only owner of <strong>Acme</strong>" in response.content
    assert User.objects.get(pk=olga.pk).is_active and Membership.objects.filter(user=olga).exists()


def test_after_handing_over_the_last_owner_can_delete(acme):
    org, olga, mia = acme
    Membership.objects.filter(organisation=org, user=mia).update(role="owner")

    response = delete(signed_in(olga))

    assert response.status_code == 302
    assert (
        not User.objects.filter(pk=olga.pk).exists()
        and Membership.objects.filter(organisation=org).count() == 1
    )
    left = AuditEntry.objects.get(action="org.member_leave", org_id=org.pk)
    assert left.details == {"role": "owner", "reason": "account_deleted"}


def test_the_service_refuses_the_last_owner_and_changes_nothing(acme):
    _, olga, _ = acme

    with pytest.raises(services.DeletionBlocked) as refused:
        services.account_delete(user=olga)

    assert [o.slug for o in refused.value.orgs] == ["acme"]
    assert "make another member an owner" in refused.value.messages[0]
    assert User.objects.get(pk=olga.pk).has_usable_password()


# --- deletions that stopped part way; staff -----------------------------------------------------


def test_a_closed_account_is_finished_later(alice):
    """Given an account closed (step 1) whose deletion then stopped, when
    account_deletions_finish runs, then the account and its data are gone."""
    services.account_close(user=alice.user)
    assert not User.objects.get(pk=alice.user.pk).is_active

    done = services.account_deletions_finish()

    assert done == 1 and set(rows_of(alice.user.pk).values()) == {0}


def test_staff_delete_an_account_with_the_command(alice, make_user):
    staff = make_user("root", is_staff=True)

    call_command("account_delete", "alice", "--by", "root")

    assert set(rows_of(alice.user.pk).values()) == {0}
    entry = AuditEntry.objects.get(action="account.delete")
    assert entry.actor_id == staff.pk and entry.details["by"] == "staff"


# --- an organisation ------------------------------------------------------------------------------


@pytest.fixture
def acme_with_conversations(make_user):
    olga, adam, mia = make_user("olga"), make_user("adam"), make_user("mia")
    mia_personal = conversation_with_data(mia, "personal-fig")
    org = workspace_services.organisation_create(creator=olga, name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=adam, role="admin")
    Membership.objects.create(organisation=org, user=mia, role="member")
    in_org = [conversation_with_data(u, f"acme-{u.username}", org=org) for u in (olga, mia)]
    return org, olga, adam, mia, mia_personal, in_org


def test_the_owner_deletes_the_organisation_and_its_conversations(acme_with_conversations, media):
    """When Acme's owner deletes it (URL name and password), then Acme's conversations of
    every member are gone with their files, members keep their accounts and personal
    conversations, and the deletion is in the audit log."""
    org, olga, _, mia, mia_personal, in_org = acme_with_conversations

    response = signed_in(olga).post("/orgs/acme/delete/", {"slug": "acme", "password": PASSWORD})

    assert response.status_code == 303 and response["Location"] == "/orgs/"
    assert not Organisation.objects.filter(pk=org.pk).exists()
    assert not Conversation.objects.filter(pk__in=[c.conversation.pk for c in in_org]).exists()
    assert list(Conversation.objects.filter(owner=mia)) == [mia_personal.conversation]
    assert files(media) == [mia_personal.attachment.storage_name.rpartition("/")[2]]
    entry = AuditEntry.objects.get(action="org.delete")
    assert (entry.actor_id, entry.org_id, entry.details["conversations"]) == (olga.pk, org.pk, 2)


def test_a_wrong_url_name_deletes_nothing(acme_with_conversations):
    org, olga, *_ = acme_with_conversations

    response = signed_in(olga).post("/orgs/acme/delete/", {"slug": "acm", "password": PASSWORD})

    assert response.status_code == 400 and b"Type the organisation" in response.content
    assert Organisation.objects.filter(pk=org.pk).exists()


@pytest.mark.parametrize(("who", "status"), [("adam", 403), ("mia", 403), ("stranger", 404)])
def test_only_owners_delete_the_organisation(acme_with_conversations, make_user, who, status):
    org, _, adam, mia, *_ = acme_with_conversations
    user = {"adam": adam, "mia": mia}.get(who) or make_user(who)

    response = signed_in(user).post("/orgs/acme/delete/", {"slug": "acme", "password": PASSWORD})

    assert response.status_code == status and Organisation.objects.filter(pk=org.pk).exists()


def test_the_delete_page_says_what_goes(acme_with_conversations):
    """Given Acme with 3 members and 2 conversations (of two members), the owner's delete page
    counts both, and offers the export first."""
    _, olga, *_ = acme_with_conversations

    page = signed_in(olga).get("/orgs/acme/delete/").content.decode()

    assert 'id="org-delete-conversations">2<' in page and 'id="org-delete-members">3<' in page
    assert "/orgs/acme/export/" in page and 'name="slug"' in page
