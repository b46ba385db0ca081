"""Share links in the admin (sharing/admin.py): listed, searched, viewed read-only, revoked by
an action; staff only."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from sharing.models import ShareLink
from tests.test_sharing_access import client_for, converse, share, shared_url

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:sharing_sharelink_changelist")


@pytest.fixture
def admin_client(django_user_model) -> Client:
    admin = django_user_model.objects.create_superuser(username="root", password="x", email="root@example.com")
    return client_for(admin)


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


def test_the_admin_is_for_staff_only(make_user):
    link = share(converse(make_user("plain")))

    response = client_for(link.created_by).get(CHANGELIST)

    assert response.status_code == 302 and reverse("admin:login") in response["Location"]
