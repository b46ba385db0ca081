"""Share links: who may use which sharing URL (owner, another user, an anonymous visitor),
revoked links, deleted conversations, removed organisation members, the public pages'
headers, CSRF, and the tokens (issue 8, sharing).

Helpers here (``converse``, ``share``, ``client_for``) are imported by the other
tests/test_sharing*.py modules.
"""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import Membership, Organisation
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from sharing import selectors, services, tokens
from sharing.models import ShareLink

pytestmark = pytest.mark.django_db(transaction=True)


# --- helpers --------------------------------------------------------------------------------


def answer(conversation: Conversation, question: Turn, text: str, **fields) -> Turn:
    """Store the assistant's answer to ``question`` (as the write-back does)."""
    return conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=text, status=fields.pop("status", Turn.Status.COMPLETE), prompt_tokens=5,
        completion_tokens=2, **fields,
    )  # fmt: skip


def converse(owner, exchanges=(("Hello there", "General Kenobi"),), *, org=None) -> Conversation:
    """A conversation of ``owner`` with these (question, answer) exchanges stored, reloaded."""
    conversation = conversation_services.conversation_create(owner=owner, org=org)
    for question_text, answer_text in exchanges:
        question = conversation_services.turn_append_user(conversation=conversation, content=question_text)
        answer(conversation, question, answer_text)
    conversation.refresh_from_db()
    return conversation


def share(conversation: Conversation) -> ShareLink:
    """A link made by the conversation's owner, through the service."""
    return services.share_link_create(conversation=conversation, user=conversation.owner)


def client_for(user=None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def shared_url(link: ShareLink) -> str:
    return reverse("shared", args=[link.token])


def continue_url(link: ShareLink) -> str:
    return reverse("shared-continue", args=[link.token])


def manage_url(conversation: Conversation) -> str:
    return reverse("share-manage", args=[conversation.pk])


def update_url(link: ShareLink) -> str:
    return reverse("share-update", args=[link.conversation_id, link.pk])


def revoke_url(link: ShareLink) -> str:
    return reverse("share-revoke", args=[link.conversation_id, link.pk])


def is_login_redirect(response, next_path: str | None = None) -> bool:
    location = response.get("Location", "")
    ok = response.status_code == 302 and location.startswith(reverse("login"))
    if next_path is not None:
        from urllib.parse import parse_qs, urlsplit  # noqa: PLC0415

        ok = ok and parse_qs(urlsplit(location).query).get("next") == [next_path]
    return ok


@pytest.fixture
def people(make_user):
    """The cast: the owner of a shared conversation, another signed-up user, and the link."""
    owner = make_user("olive")
    other = make_user("otto")
    conversation = converse(owner)
    link = share(conversation)
    return owner, other, conversation, link


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


# --- tokens -----------------------------------------------------------------------------------


def test_a_token_names_its_region_and_carries_192_random_bits(settings):
    """Given each configured region, a new token starts with that region's 12-bit tag (three
    hex digits) and resolves back to it; the rest is 32 URL-safe characters (24 random
    bytes), and 1,000 tokens are all different."""
    for region in settings.CHAT_REGIONS:
        token = tokens.token_new(region)
        assert tokens.TOKEN_RE.fullmatch(token)
        assert len(token) == 3 + 32
        assert tokens.region_of_token(token) == region
    assert len({tokens.token_new(settings.CHAT_DEFAULT_REGION) for _ in range(1000)}) == 1000


def test_a_tokens_region_picks_that_regions_database_without_a_query(settings, django_assert_num_queries):
    """Given a deployment where us-east has a database of its own, a us-east token resolves to
    that database and a eu-west one to default, with no query at all (the tag decides)."""
    settings.CHAT_REGIONS = ("eu-west", "us-east")
    settings.CHAT_DEFAULT_REGION = "eu-west"
    settings.CHAT_REGION_DATABASES = {"us-east": "region_us-east", "eu-west": "default"}

    with django_assert_num_queries(0):
        assert tokens.db_for_token(tokens.token_new("us-east")) == "region_us-east"
        assert tokens.db_for_token(tokens.token_new("eu-west")) == "default"


def test_a_token_of_a_region_without_a_database_here_resolves_to_none(settings):
    settings.CHAT_REGIONS = ("eu-west", "us-east", "ap-south")
    settings.CHAT_REGION_DATABASES = {"us-east": "region_us-east", "eu-west": "default"}

    assert tokens.db_for_token(tokens.token_new("ap-south")) is None


def test_links_are_stored_with_their_conversations_region_tag(people):
    _, _, conversation, link = people

    assert tokens.region_of_token(link.token) == conversation.region


def test_snapshot_get_raises_404_alike_for_revoked_and_unknown(people):
    owner, _, conversation, link = people
    services.share_link_revoke(conversation=conversation, link=link, user=owner)

    for token in (link.token, tokens.token_new(conversation.region)):
        with pytest.raises(Exception) as caught:
            selectors.snapshot_get(token=token)
        assert caught.value.__class__.__name__ == "Http404"
        assert str(caught.value) == selectors.NOT_FOUND
