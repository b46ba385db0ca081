"""Share links in the admin (sharing/admin.py): listed, searched, viewed read-only, revoked by
an action; staff only."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.admin import site
from django.contrib.admin.models import LogEntry
from django.test import Client, RequestFactory
from django.urls import reverse

from audit.models import AuditDetail, AuditEntry
from audit.services import with_region_details
from conversations.models import Conversation
from sharing.models import ShareLink
from tests.sharing_support import client_for, converse, share, shared_url

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:sharing_sharelink_changelist")


@pytest.fixture
def admin_client(django_user_model) -> Client:
    admin = django_user_model.objects.create_superuser(username="root", password="x", email="root@example.com")
    client = client_for(admin)
    client.staff = admin
    return client


def test_the_list_shows_links_and_searches_by_token_and_creator(admin_client, make_user):
    """Given two users' links, the list shows both; a search by one token, or by its creator's
    username, shows that link only."""
    ann, bob = make_user("ann"), make_user("bob")
    anns, bobs = share(converse(ann)), share(converse(bob))

    everything = admin_client.get(CHANGELIST).content.decode()
    by_token = admin_client.get(CHANGELIST, {"q": anns.token}).content.decode()
    by_user = admin_client.get(CHANGELIST, {"q": "bob"}).content.decode()

    assert anns.token[:7] in everything and bobs.token[:7] in everything
    assert anns.token[:7] in by_token and bobs.token[:7] not in by_token
    assert bobs.token[:7] in by_user and anns.token[:7] not in by_user


def test_a_link_is_viewed_read_only(admin_client, make_user):
    link = share(converse(make_user()))

    response = admin_client.get(reverse("admin:sharing_sharelink_change", args=[link.pk]))

    assert response.status_code == 200
    assert link.token in response.content.decode()
    assert 'name="_save"' not in response.content.decode()
    assert admin_client.get(reverse("admin:sharing_sharelink_add")).status_code == 403


def test_the_revoke_action_stops_the_selected_links(admin_client, make_user):
    """Given two working links, when staff revoke one with the action, then it answers 404 and
    the other still works; the state filter lists each where it belongs."""
    owner = make_user()
    conversation = converse(owner)
    bad, good = share(conversation), share(conversation)

    response = admin_client.post(
        CHANGELIST, {"action": "revoke", "_selected_action": [str(bad.pk)], "index": "0"}
    )

    assert response.status_code == 302
    assert client_for().get(shared_url(bad)).status_code == 404
    assert client_for().get(shared_url(good)).status_code == 200
    revoked_list = admin_client.get(CHANGELIST, {"state": "revoked"}).content.decode()
    assert bad.token[:7] in revoked_list and good.token[:7] not in revoked_list
    assert ShareLink.objects.get(pk=good.pk).revoked_at is None


def test_a_revoke_action_is_audited_with_the_links_id_in_its_region_only(admin_client, make_user):
    """Given a link revoked with the admin action, the audit entry in the global log names the
    region and not the link (issue 20: no id of a region's data outside it); the link's id is
    in the region's database and shown on the audit log's admin page."""
    link = share(converse(make_user()))

    admin_client.post(
        CHANGELIST, {"action": "revoke", "_selected_action": [str(link.pk)], "index": "0"}
    )

    (entry,) = AuditEntry.objects.filter(action="admin.action.revoke")
    assert (entry.target_type, entry.target_id, entry.region) == (
        "sharing.sharelink", "", settings.CHAT_DEFAULT_REGION,
    )  # fmt: skip
    assert AuditDetail.objects.get(entry_id=entry.pk).target_id == str(link.pk)
    page = admin_client.get(reverse("admin:audit_auditentry_changelist")).content.decode()
    assert str(link.pk) in page


def test_a_change_in_a_regional_admin_writes_no_global_admin_log(admin_client, make_user):
    """Given a conversation changed on its admin page, Django's global LogEntry (which would
    hold its id and title outside its region) is not written; the audit entry's id and changed
    fields are in the region's database."""
    conversation = converse(make_user())
    admin = site._registry[Conversation]
    request = RequestFactory().post("/")
    request.user = admin_client.staff

    admin.log_change(request, conversation, [{"changed": {"fields": ["Title"]}}])

    assert not LogEntry.objects.exists()
    (entry,) = AuditEntry.objects.filter(action="admin.change")
    assert (entry.target_type, entry.target_id, entry.region) == (
        "conversations.conversation", "", conversation.region,
    )  # fmt: skip
    (shown,) = with_region_details([entry])
    assert (shown.target_id, shown.details) == (
        str(conversation.pk), {"via": "admin", "fields": ["Title"]}
    )


def test_the_admin_is_for_staff_only(make_user):
    link = share(converse(make_user("plain")))

    response = client_for(link.created_by).get(CHANGELIST)

    assert response.status_code == 302 and reverse("admin:login") in response["Location"]
