"""Share links (issue 8, sharing): who may use the owner's sharing URLs (the owner, another user,
an anonymous visitor): the share page, creating, updating and revoking links, the CSRF token,
and the owner's list of links. Reading through a link: test_sharing_public.py; the tokens:
test_sharing_tokens.py. Helpers: tests/sharing_support.py.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from conversations.models import Conversation
from sharing import services
from sharing.models import ShareLink
from tests.sharing_support import (
    client_for,
    continue_url,
    converse,
    is_login_redirect,
    manage_url,
    people,  # noqa: F401 - a fixture
    revoke_url,
    share,
    shared_url,
    update_url,
)

pytestmark = pytest.mark.django_db(transaction=True)


# --- the owner's share page: /c/<id>/share/ -------------------------------------------------


def test_owner_sees_their_conversations_share_page_with_its_links(people):
    """Given a conversation with one link, when its owner opens the share page, then 200 and
    the link's full URL is on it, with Update and Revoke."""
    owner, _, conversation, link = people

    response = client_for(owner).get(manage_url(conversation))

    assert response.status_code == 200
    html = response.content.decode()
    assert f"http://testserver/s/{link.token}/" in html
    assert update_url(link) in html and revoke_url(link) in html


def test_another_user_gets_404_for_someone_elses_share_page(people):
    """Given olive's conversation, when otto opens its share page, then 404 and no token of
    olive's appears."""
    _, other, conversation, link = people

    response = client_for(other).get(manage_url(conversation))

    assert response.status_code == 404
    assert link.token not in response.content.decode()


def test_anonymous_visitor_is_sent_to_sign_in_from_a_share_page(people):
    _, _, conversation, _ = people

    response = client_for().get(manage_url(conversation))

    assert is_login_redirect(response, manage_url(conversation))


def test_owner_creates_a_link_from_the_share_page(people):
    """Given a conversation with one link, when its owner posts the create form, then a second
    working link exists (another token) and they are taken back to the share page."""
    owner, _, conversation, link = people

    response = client_for(owner).post(manage_url(conversation))

    assert response.status_code == 302 and response["Location"] == manage_url(conversation)
    tokens_now = set(ShareLink.objects.filter(conversation=conversation).values_list("token", flat=True))
    assert len(tokens_now) == 2 and link.token in tokens_now


@pytest.mark.parametrize("who", ["other", "anonymous"])
def test_nobody_but_the_owner_can_create_a_link(people, who):
    """Given olive's conversation, when otto (404) or an anonymous visitor (sign in) posts its
    create form, then no link is made."""
    _, other, conversation, _ = people
    client = client_for(other if who == "other" else None)

    response = client.post(manage_url(conversation))

    if who == "other":
        assert response.status_code == 404
    else:
        assert is_login_redirect(response)
    assert ShareLink.objects.filter(conversation=conversation).count() == 1


def test_owner_revokes_a_link_and_it_answers_404_at_once(people):
    """Given a working link, when its owner revokes it, then the very next request for it is
    a 404, the owner's page no longer lists it, and the row records when."""
    owner, _, conversation, link = people
    assert client_for().get(shared_url(link)).status_code == 200

    response = client_for(owner).post(revoke_url(link))

    assert response.status_code == 302
    assert client_for().get(shared_url(link)).status_code == 404
    assert link.token not in client_for(owner).get(manage_url(conversation)).content.decode()
    link.refresh_from_db()
    assert link.revoked_at is not None


@pytest.mark.parametrize("action", ["revoke", "update"])
def test_another_user_cannot_revoke_or_update_someone_elses_link(people, action):
    """Given olive's link, when otto posts its revoke or update URL, then 404 and the link is
    unchanged and still works."""
    _, other, conversation, link = people
    url = revoke_url(link) if action == "revoke" else update_url(link)
    before = ShareLink.objects.get(pk=link.pk)

    response = client_for(other).post(url)

    assert response.status_code == 404
    after = ShareLink.objects.get(pk=link.pk)
    assert (after.revoked_at, after.through_at, after.updated_at) == (None, before.through_at, before.updated_at)
    assert client_for().get(shared_url(link)).status_code == 200


@pytest.mark.parametrize("action", ["revoke", "update"])
def test_an_anonymous_visitor_cannot_revoke_or_update_a_link(people, action):
    _, _, _, link = people
    url = revoke_url(link) if action == "revoke" else update_url(link)

    response = client_for().post(url)

    assert is_login_redirect(response)
    assert ShareLink.objects.get(pk=link.pk).revoked_at is None


def test_a_link_cannot_be_revoked_through_another_conversations_url(people, make_user):
    """Given olive's link to conversation A and her conversation B, when she posts B's revoke
    URL with A's link id, then 404: a link is found only under its own conversation."""
    owner, _, _, link = people
    other_conversation = converse(owner, [("Another", "one")])
    url = reverse("share-revoke", args=[other_conversation.pk, link.pk])

    response = client_for(owner).post(url)

    assert response.status_code == 404
    assert ShareLink.objects.get(pk=link.pk).revoked_at is None


@pytest.mark.parametrize("name", ["share-update", "share-revoke"])
def test_link_actions_refuse_get(people, name):
    """Given the owner, when they GET an update or revoke URL (a prefetch, a crawler), then 405
    and nothing changes."""
    owner, _, _, link = people

    response = client_for(owner).get(reverse(name, args=[link.conversation_id, link.pk]))

    assert response.status_code == 405
    assert ShareLink.objects.get(pk=link.pk).revoked_at is None


@pytest.mark.parametrize("url_of", [manage_url, revoke_url, update_url, continue_url])
def test_sharing_forms_need_the_csrf_token(people, url_of):
    """Given a signed-in owner whose client enforces CSRF, when a sharing form is posted
    without the token, then 403 and nothing is created, revoked, updated or copied."""
    owner, _, conversation, link = people
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    target = conversation if url_of is manage_url else link
    conversations_before = Conversation.objects.count()

    response = client.post(url_of(target))

    assert response.status_code == 403
    assert ShareLink.objects.count() == 1 and ShareLink.objects.get().revoked_at is None
    assert Conversation.objects.count() == conversations_before


# --- the owner's list of all links: /settings/shared-links/ ----------------------------------


def test_shared_links_page_lists_only_the_users_own_working_links(people, make_user):
    """Given olive's two links (one revoked) and otto's own link, when olive opens her shared
    links, then only her working link is listed; otto's page lists only his."""
    owner, other, conversation, link = people
    revoked = share(conversation)
    services.share_link_revoke(conversation=conversation, link=revoked, user=owner)
    ottos = share(converse(other, [("Mine", "yes")]))

    olive_page = client_for(owner).get(reverse("shared-links")).content.decode()
    otto_page = client_for(other).get(reverse("shared-links")).content.decode()

    assert link.token in olive_page
    assert revoked.token not in olive_page and ottos.token not in olive_page
    assert ottos.token in otto_page and link.token not in otto_page


def test_revoking_from_the_shared_links_page_returns_there(people):
    owner, _, _, link = people

    response = client_for(owner).post(revoke_url(link), {"back": "all"})

    assert response.status_code == 302 and response["Location"] == reverse("shared-links")
    assert ShareLink.objects.get(pk=link.pk).revoked_at is not None


def test_anonymous_visitor_is_sent_to_sign_in_from_the_shared_links_page():
    assert is_login_redirect(client_for().get(reverse("shared-links")))
