"""Share links in a real browser (headless Debian Chromium, Playwright) against daphne serving
the real app (``live``): the owner shares from the conversation's header, an anonymous visitor
in a fresh browser context reads it (and its hostile model output stays inert, PF-X1), the
owner revokes it and the visitor's reload is a 404; an anonymous visitor continues a shared
conversation after signing in. Fixtures and helpers come from chat_ui_support.py."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import expect

from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from sharing import services
from tests.browser.chat_ui_support import browser, new_page, ui_login  # noqa: F401
from tests.conftest import PASSWORD

pytestmark = pytest.mark.browser

HOSTILE_ANSWER = (
    "Safe text. <img src=x onerror=\"window.__pwned='img'\"> "
    "<svg onload=\"window.__pwned='svg'\"></svg> <script>window.__pwned='script'</script> "
    "[a link](javascript:window.__pwned='link')"
)


def conversation_of(owner, title: str, exchanges) -> Conversation:
    """A conversation with stored exchanges (no engine needed to share one)."""
    conversation = conversation_services.conversation_create(owner=owner)
    for question_text, answer_text in exchanges:
        question = conversation_services.turn_append_user(conversation=conversation, content=question_text)
        conversation_services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
            content=answer_text, status=Turn.Status.COMPLETE, prompt_tokens=3, completion_tokens=3,
        )  # fmt: skip
    conversation_services.conversation_rename(conversation=conversation, title=title)
    return conversation


def test_share_open_anonymously_revoke_then_404(live, new_page, make_user):  # noqa: F811
    """Given sara's conversation whose answer holds script payloads, when she presses Share in
    its header and then "Create a link", then the page lists the link; a visitor in a fresh
    context (no cookies) opens it and reads the conversation without signing in, no payload
    ran and no dialog opened; the Copy button beside the link puts it on the clipboard; when sara presses Revoke, the visitor's reload answers 404 with a
    page saying the link does not work."""
    owner = make_user("sara")
    conversation = conversation_of(owner, "Holiday ideas", [("Where to go?", HOSTILE_ANSWER)])
    page = new_page()
    ui_login(page, live.url, "sara")
    page.goto(f"{live.url}/c/{conversation.pk}/")

    page.click("header.chat-header a.share-link")
    expect(page).to_have_url(f"{live.url}/c/{conversation.pk}/share/")
    page.click("#share-create button[type=submit]")
    link_field = page.locator("#share-links input.share-url")
    expect(link_field).to_have_count(1)
    url = link_field.input_value()
    assert url.startswith(f"{live.url}/s/")

    visitor = new_page()
    dialogs: list[str] = []
    visitor.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    response = visitor.goto(url)
    assert response.status == 200
    assert response.headers["referrer-policy"] == "no-referrer"
    expect(visitor.locator("#shared-title")).to_have_text("Holiday ideas")
    expect(visitor.locator("#snapshot article.user")).to_have_text("Where to go?")
    expect(visitor.locator("#snapshot article.assistant")).to_contain_text("Safe text.")
    expect(visitor.locator("#continue-link")).to_be_visible()
    assert visitor.evaluate("window.__pwned === undefined"), visitor.evaluate("window.__pwned")
    hostile = "#snapshot script, #snapshot svg, #snapshot img, #snapshot [onerror], #snapshot [href^='javascript']"
    assert visitor.locator(hostile).count() == 0
    assert dialogs == []

    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live.url)
    page.click("#share-links button.share-copy")
    expect(page.locator("#share-links button.share-copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == url
    expect(page.locator("#share-links [data-copy-status]")).to_have_text("Link copied.")

    page.click("#share-links button.share-revoke")
    expect(page.locator("#share-links input.share-url")).to_have_count(0)

    gone = visitor.reload()
    assert gone.status == 404
    expect(visitor.locator("#not-found")).to_contain_text("no longer shared")
    expect(visitor.locator("#snapshot")).to_have_count(0)


def test_an_anonymous_visitor_signs_in_and_continues_the_conversation(live, new_page, make_user):  # noqa: F811
    """Given a shared conversation, when an anonymous visitor presses Continue, signs in on the
    login page and confirms, then they are on a new conversation of their own showing the
    shared exchange, and the original's owner still has only the original."""
    owner = make_user("sam")
    make_user("vince")
    conversation = conversation_of(owner, "Recipes", [("Best pancake tip?", "Rest the batter.")])
    link = services.share_link_create(conversation=conversation, user=owner)
    visitor = new_page()
    visitor.goto(f"{live.url}/s/{link.token}/")

    visitor.click("#continue-link")
    visitor.fill("input[name=username]", "vince")
    visitor.fill("input[name=password]", PASSWORD)
    visitor.click("main.auth button[type=submit]")
    expect(visitor.locator("#continue-form")).to_contain_text("Continue this conversation")
    visitor.click("#continue-form button[type=submit]")

    expect(visitor.locator("#messages article.assistant .bubble")).to_have_text("Rest the batter.")
    copy = Conversation.objects.get(owner__username="vince")
    assert visitor.url == f"{live.url}/c/{copy.pk}/"
    assert Conversation.objects.filter(owner=owner).count() == 1
