"""Share links show a snapshot (later turns, edits, regenerations and renames appear only once
the owner updates the link), "Continue this conversation" copies the snapshot into the
viewer's account and leaves the original alone, and nothing in a shared conversation can run
script on the viewer's page (PF-X1). Issue 8, sharing."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import Membership, Organisation
from conversations import selectors as conversation_selectors
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from memory.extraction import conversation_memory_extract
from memory.extraction_models import ExtractionMarker
from sharing import services
from sharing.models import ShareLink
from tests.conftest import PASSWORD
from tests.html_checks import dangerous_markup
from tests.sharing_support import (
    answer,
    client_for,
    continue_url,
    converse,
    manage_url,
    share,
    shared_url,
    update_url,
)

pytestmark = pytest.mark.django_db(transaction=True)


def page(link: ShareLink, client: Client | None = None) -> str:
    response = (client or client_for()).get(shared_url(link))
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def snapshot_of(html: str) -> str:
    """The shared page's conversation (its exchanges, without the title)."""
    return re.search(r'<section id="snapshot".*?</section>', html, re.S).group(0)


def main_of(html: str) -> str:
    """The page's <main> element (the shared conversation and its controls; base.html's own
    <script src> tags are outside it)."""
    return re.search(r"<main\b.*?</main>", html, re.S).group(0)


# --- snapshot semantics -------------------------------------------------------------------------


def test_turns_after_the_link_was_made_are_hidden_until_the_owner_updates_it(make_user):
    """Given a link made after the first exchange, when a second exchange follows, then the
    shared page still shows only the first; when the owner presses Update, the same URL shows
    both."""
    owner = make_user("olive")
    conversation = converse(owner, [("First question", "First answer")])
    link = share(conversation)
    question = conversation_services.turn_append_user(conversation=conversation, content="Second question")
    answer(conversation, question, "Second answer")

    before = page(link)
    response = client_for(owner).post(update_url(link))
    after = page(link)

    assert "First answer" in before and "Second question" not in before and "Second answer" not in before
    assert response.status_code == 302
    assert "Second question" in after and "Second answer" in after
    assert ShareLink.objects.get(pk=link.pk).token == link.token


def test_an_answer_regenerated_after_sharing_is_not_shown_until_update(make_user):
    """Given a shared exchange, when its answer is regenerated (a new version, append-only),
    then the shared page keeps the version current at share time; after Update it shows the
    new one (and only one version of the answer)."""
    owner = make_user()
    conversation = converse(owner, [("Pick a colour", "Red")])
    link = share(conversation)
    first = Turn.objects.get(role="assistant")
    answer(conversation, Turn.objects.get(role="user"), "Blue", replaces_id=first.turn_id)

    before = snapshot_of(page(link))
    services.share_link_update(conversation=conversation, link=link, user=owner)
    after = snapshot_of(page(link))

    assert "Red" in before and "Blue" not in before
    assert "Blue" in after and "Red" not in after


def test_a_message_edited_after_sharing_shows_as_it_was_until_update(make_user):
    """Given a shared exchange, when the owner edits the message (a new turn replacing it) and
    it is answered, then the shared page shows the original message and answer; after Update,
    the edited ones in its place."""
    owner = make_user()
    conversation = converse(owner, [("Original wording", "Original reply")])
    link = share(conversation)
    original = Turn.objects.get(role="user")
    edited = conversation_services.turn_append_user(
        conversation=conversation, content="Edited wording", replaces=original
    )
    answer(conversation, edited, "Reply to the edit")

    before = snapshot_of(page(link))
    services.share_link_update(conversation=conversation, link=link, user=owner)
    after = snapshot_of(page(link))

    assert "Original wording" in before and "Original reply" in before and "Edited" not in before
    assert "Edited wording" in after and "Reply to the edit" in after and "Original" not in after


def test_a_rename_after_sharing_shows_only_after_update(make_user):
    owner = make_user()
    conversation = converse(owner, [("Q", "A")])
    conversation_services.conversation_rename(conversation=conversation, title="Old title")
    link = share(conversation)
    conversation_services.conversation_rename(conversation=conversation, title="New title")

    before = page(link)
    services.share_link_update(conversation=conversation, link=link, user=owner)
    after = page(link)

    assert "Old title" in before and "New title" not in before
    assert "New title" in after


def test_the_share_page_says_when_a_link_misses_newer_messages(make_user):
    """Given a link and a later exchange, the owner's share page marks the link as not showing
    newer messages; after Update it does not."""
    owner = make_user()
    conversation = converse(owner, [("Q1", "A1")])
    link = share(conversation)
    question = conversation_services.turn_append_user(conversation=conversation, content="Q2")
    answer(conversation, question, "A2")

    stale = client_for(owner).get(manage_url(conversation)).content.decode()
    services.share_link_update(conversation=conversation, link=link, user=owner)
    fresh = client_for(owner).get(manage_url(conversation)).content.decode()

    assert "newer messages not shown" in stale
    assert "newer messages not shown" not in fresh


def test_a_question_unanswered_at_share_time_shows_no_later_answer(make_user):
    """Given a link made while the last message was still being answered, when the answer is
    written afterwards, then the shared page shows the message with a note and not the
    answer."""
    owner = make_user()
    conversation = converse(owner, [("Q1", "A1")])
    question = conversation_services.turn_append_user(conversation=conversation, content="Pending question")
    link = share(conversation)
    answer(conversation, question, "Late answer")

    html = snapshot_of(page(link))

    assert "Pending question" in html and "Late answer" not in html
    assert "No answer had been written yet" in html


def test_a_blocked_message_is_left_out_and_a_withdrawn_answer_shows_only_a_note(make_user):
    """Given a conversation with a message the input gate blocked and an answer the output gate
    withdrew, then the shared page shows neither text: the blocked message is left out, the
    withdrawn answer is a note."""
    owner = make_user()
    conversation = converse(owner, [("Fine question", "Fine answer")])
    conversation_services.turn_append_user(conversation=conversation, content="Flagged words here", blocked=True)
    question = conversation_services.turn_append_user(conversation=conversation, content="Another question")
    answer(conversation, question, "", status=Turn.Status.BLOCKED)
    link = share(conversation)

    html = main_of(page(link))

    assert "Fine answer" in html and "Another question" in html
    assert "Flagged words here" not in html
    assert "withdrawn by moderation" in html


def test_an_empty_conversation_cannot_be_shared(make_user):
    """Given a conversation with no turns, when its owner posts Create, then 400 with the
    reason on the page, and no link."""
    owner = make_user()
    conversation = conversation_services.conversation_create(owner=owner)

    response = client_for(owner).post(manage_url(conversation))

    assert response.status_code == 400
    assert "Nothing to share yet" in response.content.decode()
    assert not ShareLink.objects.exists()


def test_a_zero_retention_organisations_conversation_cannot_be_shared(make_user):
    """Given a conversation of an organisation that keeps no history, when its owner posts
    Create, then 400 with the reason and no link (its turns may not outlive minutes in Redis,
    let alone be published)."""
    owner = make_user()
    conversation = converse(owner, [("Q", "A")])
    org = Organisation.objects.create(name="ZDR", slug=f"zdr-{uuid.uuid4().hex[:6]}", zero_retention=True)
    Conversation.objects.filter(pk=conversation.pk).update(org=org)
    Membership.objects.create(organisation=org, user=owner)

    response = client_for(owner).post(manage_url(conversation))

    assert response.status_code == 400
    assert "keeps no conversation history" in response.content.decode()
    assert not ShareLink.objects.exists()


def test_a_conversation_has_at_most_the_configured_number_of_working_links(make_user, monkeypatch):
    """Given the cap at 2 and two working links, a third is refused with 400 and the reason;
    after revoking one, a new one can be made."""
    monkeypatch.setattr(services, "MAX_ACTIVE_LINKS_PER_CONVERSATION", 2)
    owner = make_user()
    conversation = converse(owner)
    first, _ = share(conversation), share(conversation)

    refused = client_for(owner).post(manage_url(conversation))
    services.share_link_revoke(conversation=conversation, link=first, user=owner)
    allowed = client_for(owner).post(manage_url(conversation))

    assert refused.status_code == 400 and "revoke one" in refused.content.decode()
    assert allowed.status_code == 302
    assert ShareLink.objects.filter(revoked_at__isnull=True).count() == 2


# --- continue this conversation -----------------------------------------------------------------


def copied_turns(conversation: Conversation) -> list[tuple[str, str]]:
    return list(
        Turn.objects.filter(conversation=conversation).order_by("created_at", "turn_id").values_list("role", "content")
    )


def test_continue_copies_the_snapshot_into_a_new_conversation_of_the_viewer(make_user):
    """Given olive's link to two exchanges, when otto presses Continue, then he lands on a new
    conversation of his own, titled like the snapshot, with the same exchanges as his turns in
    order, each answer replying to its copied question; the copy is in his list."""
    owner, viewer = make_user("olive"), make_user("otto")
    conversation = converse(owner, [("Q one", "A one"), ("Q two", "A two")])
    conversation_services.conversation_rename(conversation=conversation, title="Trip plan")
    link = share(conversation)

    response = client_for(viewer).post(continue_url(link))

    copy = Conversation.objects.get(owner=viewer)
    assert response.status_code == 302 and response["Location"] == reverse("conversation", args=[copy.pk])
    assert copy.title == "Trip plan"
    assert copied_turns(copy) == [("user", "Q one"), ("assistant", "A one"), ("user", "Q two"), ("assistant", "A two")]
    for reply in Turn.objects.filter(conversation=copy, role="assistant"):
        assert Turn.objects.get(pk=reply.reply_to_id).conversation_id == copy.pk
    assert copy.last_turn_at == Turn.objects.filter(conversation=copy).latest("created_at").created_at
    assert copy.pk in [c.pk for c in conversation_selectors.conversation_list(user=viewer)]


def test_continue_leaves_the_original_untouched(make_user):
    """Given a shared conversation, when another user continues it, then the original's turns
    (ids, text), owner, title and last activity are exactly as before, and the link still
    works."""
    owner, viewer = make_user(), make_user()
    conversation = converse(owner, [("Q", "A")])
    link = share(conversation)
    before = (
        list(Turn.objects.filter(conversation=conversation).values_list("turn_id", "content").order_by("turn_id")),
        Conversation.objects.filter(pk=conversation.pk).values_list("owner_id", "title", "last_turn_at").get(),
    )

    client_for(viewer).post(continue_url(link))

    after = (
        list(Turn.objects.filter(conversation=conversation).values_list("turn_id", "content").order_by("turn_id")),
        Conversation.objects.filter(pk=conversation.pk).values_list("owner_id", "title", "last_turn_at").get(),
    )
    assert after == before
    assert Conversation.objects.filter(owner=owner).count() == 1
    assert client_for().get(shared_url(link)).status_code == 200


def test_continue_copies_only_the_snapshot_not_what_came_after(make_user):
    """Given a link, then a regenerated answer and a new exchange, when a viewer continues,
    then the copy holds the snapshot's answer and not the later turns."""
    owner, viewer = make_user(), make_user()
    conversation = converse(owner, [("Q", "Snapshot answer")])
    link = share(conversation)
    first = Turn.objects.get(role="assistant")
    answer(conversation, Turn.objects.get(role="user"), "Regenerated", replaces_id=first.turn_id)
    question = conversation_services.turn_append_user(conversation=conversation, content="Later question")
    answer(conversation, question, "Later answer")

    client_for(viewer).post(continue_url(link))

    assert copied_turns(Conversation.objects.get(owner=viewer)) == [("user", "Q"), ("assistant", "Snapshot answer")]


def test_the_copy_opens_as_a_finished_conversation_and_prompts_with_the_copied_history(make_user):
    """Given a copy made by Continue (the snapshot's last message had no answer yet), when the
    viewer opens it, then no exchange is waiting for an answer (nothing would be generated on
    their account by opening it), and their next message is prompted with the copied
    exchanges."""
    owner, viewer = make_user(), make_user()
    conversation = converse(owner, [("Capital of France?", "Paris.")])
    conversation_services.turn_append_user(conversation=conversation, content="Unanswered")
    link = share(conversation)
    client_for(viewer).post(continue_url(link))
    copy = Conversation.objects.get(owner=viewer)

    html = client_for(viewer).get(reverse("conversation", args=[copy.pk])).content.decode()
    question = conversation_services.turn_append_user(conversation=copy, content="And of Italy?")
    context = conversation_selectors.prompt_context(conversation_id=copy.pk, question=question)

    assert "Paris." in html and "sse-connect" not in html and "Unanswered" not in html
    assert context.exchanges == [("Capital of France?", "Paris.")]


def test_copied_turns_never_become_the_viewers_memory(make_user):
    """Given a copy made by Continue, then its memory-extraction marker already covers the
    copied turns, so extraction (even once idle) finds nothing of someone else's to mine."""
    owner, viewer = make_user(), make_user()
    link = share(converse(owner, [("I live in Lisbon", "Noted.")]))
    client_for(viewer).post(continue_url(link))
    copy = Conversation.objects.get(owner=viewer)

    marker = ExtractionMarker.objects.get(pk=copy.pk)
    result = conversation_memory_extract(conversation_id=copy.pk, now=copy.last_turn_at + timedelta(days=1))

    assert marker.user_id == viewer.pk and marker.extracted_through == copy.last_turn_at
    assert result.status == "done"


def test_an_anonymous_viewer_signs_in_then_continues(make_user):
    """Given an anonymous visitor on a shared page, when they follow Continue, then they are
    sent to sign in with a way back; after signing in through the real form they land on a page
    asking to confirm, and posting it copies the conversation into their account."""
    owner, viewer = make_user("olive"), make_user("vera")
    link = share(converse(owner, [("Q", "A")]))
    client = Client()
    shared_html = client.get(shared_url(link)).content.decode()
    assert f'href="{continue_url(link)}"' in shared_html

    to_login = client.get(continue_url(link))
    next_path = parse_qs(urlsplit(to_login["Location"]).query)["next"][0]
    signed_in = client.post(reverse("login"), {"username": "vera", "password": PASSWORD, "next": next_path})
    confirm = client.get(signed_in["Location"])
    done = client.post(continue_url(link))

    assert to_login.status_code == 302 and next_path == continue_url(link)
    assert signed_in.status_code == 302 and signed_in["Location"] == continue_url(link)
    assert confirm.status_code == 200 and 'id="continue-form"' in confirm.content.decode()
    copy = Conversation.objects.get(owner=viewer)
    assert done.status_code == 302 and done["Location"] == reverse("conversation", args=[copy.pk])


def test_the_continue_confirmation_names_the_snapshot_and_shows_none_of_its_text(make_user):
    """Given a signed-in viewer, the confirmation page (same-origin Referer policy, so it may
    hold a form) names the title and the number of exchanges, and shows no conversation text
    (nothing of the conversation's own links on a page that sends a Referer)."""
    owner, viewer = make_user(), make_user()
    conversation = converse(owner, [("Secret question", "See https://example.com/x"), ("Q2", "A2")])
    conversation_services.conversation_rename(conversation=conversation, title="Shared title")
    link = share(conversation)

    html = client_for(viewer).get(continue_url(link)).content.decode()

    assert "Shared title" in html and "2 exchanges" in html
    assert "Secret question" not in html and "example.com" not in html
    assert not Conversation.objects.filter(owner=viewer).exists()  # a GET copies nothing


def test_an_anonymous_post_to_continue_copies_nothing(make_user):
    link = share(converse(make_user(), [("Q", "A")]))
    before = Conversation.objects.count()

    response = client_for().post(continue_url(link))

    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert Conversation.objects.count() == before


def test_continue_of_a_revoked_link_answers_404_and_copies_nothing(make_user):
    owner, viewer = make_user(), make_user()
    conversation = converse(owner)
    link = share(conversation)
    services.share_link_revoke(conversation=conversation, link=link, user=owner)

    responses = [client_for(viewer).get(continue_url(link)), client_for(viewer).post(continue_url(link))]

    assert [r.status_code for r in responses] == [404, 404]
    assert not Conversation.objects.filter(owner=viewer).exists()


def test_a_viewer_in_a_zero_retention_organisation_is_told_why_they_cannot_continue(make_user):
    """Given a viewer whose organisation keeps no history, when they press Continue, then 400
    with the reason on the shared page, and no conversation is created for them."""
    owner, viewer = make_user(), make_user()
    link = share(converse(owner, [("Q", "A")]))
    org = Organisation.objects.create(name="ZDR", slug=f"zdr-{uuid.uuid4().hex[:6]}", zero_retention=True)
    Membership.objects.create(organisation=org, user=viewer)

    response = client_for(viewer).post(continue_url(link))

    assert response.status_code == 400
    assert "keeps no conversation history" in response.content.decode()
    assert not Conversation.objects.filter(owner=viewer).exists()


# --- PF-X1: nothing in a shared conversation runs script -----------------------------------------

PAYLOADS = [
    "<script>alert('x1')</script>",
    '<img src=x onerror="alert(\'x2\')">',
    "[click me](javascript:alert('x3'))",
    '<svg onload="alert(\'x4\')"></svg>',
    "![pic](javascript:alert('x5'))",
    '<a href="javascript:alert(\'x6\')">raw link</a>',
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_model_output_renders_inert_on_the_shared_page(make_user, payload):
    """PF-X1. Given an answer containing ``payload``, when an anonymous viewer opens the shared
    page, then the page's <main> has no script element, no event-handler attribute and no
    javascript: URL (checked with an HTML parser), and the answer's text is still there."""
    conversation = converse(make_user(), [("Show me something", f"Here you go: {payload}")])
    link = share(conversation)

    html = main_of(page(link))

    assert dangerous_markup(html) == []
    assert "Here you go:" in html


def test_a_hostile_title_and_message_render_inert_on_the_shared_page(make_user):
    """PF-X1. Given a conversation titled and opened with script payloads, then the shared
    page shows them as text: escaped in <title> and <h1>, the message escaped, and nothing
    dangerous in <main>."""
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>"
    owner = make_user()
    conversation = converse(owner, [(hostile, "ok")])
    conversation_services.conversation_rename(conversation=conversation, title=hostile)
    link = share(conversation)

    html = page(link)

    title = re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    assert "<" not in title and "&lt;script&gt;" in title
    assert dangerous_markup(main_of(html)) == []
    assert "&lt;img src=x onerror=alert(2)&gt;" in main_of(html)


def test_a_hostile_title_renders_inert_on_the_owners_pages(make_user):
    """PF-X1. The owner's share page, shared-links page and the continue confirmation show a
    hostile title as text (their only markup besides it is their own CSRF forms)."""
    hostile = "<img src=x onerror=alert(1)><script>alert(2)</script>"
    owner = make_user()
    conversation = converse(owner, [("Q", "A")])
    conversation_services.conversation_rename(conversation=conversation, title=hostile)
    link = share(conversation)

    for url in (manage_url(conversation), reverse("shared-links"), continue_url(link)):
        html = main_of(client_for(owner).get(url).content.decode())
        problems = [p for p in dangerous_markup(html) if p != "<form> element"]
        assert problems == [], url
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
