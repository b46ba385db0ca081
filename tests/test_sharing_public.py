"""The public page of a share link, /s/<token>/ (issue 8, sharing): everyone with the link reads
the conversation, with no referrer, noindex and no-store; malformed, unknown and revoked
tokens, deleted conversations and deactivated creators answer 404; an organisation member's
links stop answering the moment they are removed, or when the organisation turns to zero
retention.
"""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from accounts.models import Membership, Organisation
from conversations.models import Conversation
from sharing import services, tokens
from sharing.models import ShareLink
from tests.sharing_support import (
    client_for,
    continue_url,
    converse,
    manage_url,
    people,  # noqa: F401 - a fixture
    share,
    shared_url,
)

pytestmark = pytest.mark.django_db(transaction=True)


# --- the public page: /s/<token>/ -------------------------------------------------------------


@pytest.mark.parametrize("who", ["owner", "other", "anonymous"])
def test_everyone_with_the_link_reads_the_shared_conversation(people, who):
    """Given a working link, when the owner, another user or an anonymous visitor opens it,
    then 200 with the conversation's text."""
    owner, other, _, link = people
    client = client_for({"owner": owner, "other": other, "anonymous": None}[who])

    response = client.get(shared_url(link))

    assert response.status_code == 200
    html = response.content.decode()
    assert "Hello there" in html and "General Kenobi" in html


def test_shared_pages_send_no_referrer_noindex_and_no_store(people):
    """Given a working link and a revoked one, then both the page and the 404 say
    Referrer-Policy: no-referrer (the token must not leak to linked sites), X-Robots-Tag:
    noindex, and Cache-Control: no-store (a revoked page must not live on in a cache)."""
    owner, _, conversation, link = people
    dead = share(conversation)
    services.share_link_revoke(conversation=conversation, link=dead, user=owner)

    for url, status in [(shared_url(link), 200), (shared_url(dead), 404), (continue_url(dead), 404)]:
        response = client_for().get(url)
        assert response.status_code == status, url
        assert response["Referrer-Policy"] == "no-referrer"
        assert "noindex" in [v.strip() for v in response["X-Robots-Tag"].split(",")]
        assert "no-store" in response["Cache-Control"]


def test_pages_with_forms_never_send_no_referrer_and_the_shared_page_has_no_form(people):
    """Under Referrer-Policy: no-referrer a browser posts forms with ``Origin: null``, which
    Django's CSRF check refuses (403 in a real browser, tests/browser/test_sharing_ui.py). So:
    the shared page (no-referrer) has no form, for anonymous and signed-in viewers alike, and
    every sharing page with a form (the owner's share page, the shared-links page, the continue
    confirmation) keeps a same-origin policy; all of them are never cached."""
    owner, other, conversation, link = people

    for client in (client_for(), client_for(other)):
        assert "<form" not in client.get(shared_url(link)).content.decode()
    for url in (manage_url(conversation), reverse("shared-links"), continue_url(link)):
        response = client_for(owner).get(url)
        assert response.status_code == 200, url
        assert "<form" in response.content.decode(), url
        assert response["Referrer-Policy"] == "same-origin", url
        assert "no-store" in response["Cache-Control"], url


@pytest.mark.parametrize(
    "token",
    [
        "nonsense",
        "zzz" + "a" * 32,  # not a hex tag
        "fff" + "a" * 32,  # a tag of no region here
        "a" * 300,
        "%00",
    ],
)
def test_malformed_or_unknown_tokens_are_a_404_page(token):
    """Given no such link, when a visitor opens /s/<token>/, then 404 with a page that says the
    link does not work (never a 500)."""
    response = client_for().get(f"/s/{token}/")

    assert response.status_code == 404
    assert "This link does not work" in response.content.decode()


def test_a_well_formed_token_that_was_never_issued_is_a_404(people):
    """Given a token with a real region's tag and random characters never issued, then 404."""
    region = people[2].region

    response = client_for().get(f"/s/{tokens.token_new(region)}/")

    assert response.status_code == 404


def test_a_link_to_a_deleted_conversation_answers_404(people):
    """Given a working link, when its owner deletes the conversation (through the chat's Delete),
    then the link answers 404 and its row is gone with the conversation."""
    owner, _, conversation, link = people

    response = client_for(owner).post(reverse("conversation-delete", args=[conversation.pk]))

    assert response.status_code in (200, 204, 302)
    assert client_for().get(shared_url(link)).status_code == 404
    assert not ShareLink.objects.filter(pk=link.pk).exists()


def test_a_link_whose_creator_was_deactivated_answers_404(people):
    """Given a working link, when its creator's account is deactivated, then 404."""
    owner, _, _, link = people
    owner.is_active = False
    owner.save(update_fields=["is_active"])

    assert client_for().get(shared_url(link)).status_code == 404


# --- organisations: removing a member ---------------------------------------------------------


@pytest.fixture
def org_link(make_user):
    """A member of Acme who shared one of Acme's conversations."""
    org = Organisation.objects.create(name="Acme", slug=f"acme-{uuid.uuid4().hex[:6]}")
    member = make_user("mia")
    Membership.objects.create(organisation=org, user=member, role=Membership.Role.MEMBER)
    conversation = converse(member, [("Acme's roadmap?", "Ship it.")], org=org)
    assert conversation.org_id == org.pk
    return org, member, conversation, share(conversation)


def test_an_org_members_link_answers_404_the_moment_they_are_removed(org_link):
    """Given a member's working link to an organisation's conversation, when their membership
    is deleted (nothing else done: no hook called), then the very next request is a 404, and
    the link no longer shows on their shared-links page."""
    org, member, _, link = org_link
    assert client_for().get(shared_url(link)).status_code == 200

    Membership.objects.filter(organisation=org, user=member).delete()

    assert client_for().get(shared_url(link)).status_code == 404
    assert link.token not in client_for(member).get(reverse("shared-links")).content.decode()


def test_a_link_answers_404_once_its_organisation_switches_to_zero_retention(org_link):
    """Given a working link to an organisation's conversation, when the organisation turns on
    zero retention, then the link answers 404 (an organisation that keeps no history publishes
    none)."""
    org, _, _, link = org_link

    Organisation.objects.filter(pk=org.pk).update(zero_retention=True)

    assert client_for().get(shared_url(link)).status_code == 404


def test_continue_from_a_removed_members_link_answers_404(org_link, make_user):
    org, member, _, link = org_link
    viewer = make_user("vic")
    Membership.objects.filter(organisation=org, user=member).delete()
    before = Conversation.objects.filter(owner=viewer).count()

    response = client_for(viewer).post(continue_url(link))

    assert response.status_code == 404
    assert Conversation.objects.filter(owner=viewer).count() == before


def test_share_links_revoke_for_revokes_that_members_links_to_that_org_only(org_link, make_user):
    """Given mia's links to an Acme conversation and to one of another organisation's, and a
    colleague's link to another Acme conversation, when share_links_revoke_for(user=mia,
    org=Acme) runs (the workspaces app calls it on removal), then only mia's Acme link is
    revoked (count 1), for good: it stays 404 even after she rejoins."""
    org, member, _, link = org_link
    beta = Organisation.objects.create(name="Beta", slug=f"beta-{uuid.uuid4().hex[:6]}")
    Membership.objects.create(organisation=beta, user=member)
    personal = share(converse(member, [("Beta's plan", "note")], org=beta))
    colleague = make_user("cole")
    Membership.objects.create(organisation=org, user=colleague)
    colleagues = share(converse(colleague, [("Other", "work")], org=org))

    revoked = services.share_links_revoke_for(user=member, org=org)

    assert revoked == 1
    assert ShareLink.objects.get(pk=link.pk).revoked_at is not None
    assert ShareLink.objects.get(pk=personal.pk).revoked_at is None
    assert ShareLink.objects.get(pk=colleagues.pk).revoked_at is None
    Membership.objects.filter(organisation=org, user=member).delete()
    Membership.objects.create(organisation=org, user=member)  # rejoins
    assert client_for().get(shared_url(link)).status_code == 404
    assert client_for().get(shared_url(colleagues)).status_code == 200


def test_share_links_revoke_for_takes_primary_keys_too(org_link):
    org, member, _, link = org_link

    assert services.share_links_revoke_for(user=member.pk, org=org.pk) == 1
    assert services.share_links_revoke_for(user=member.pk, org=org.pk) == 0  # already revoked
