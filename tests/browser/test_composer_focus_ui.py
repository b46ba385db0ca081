"""The message box's focus and limit in a real browser (issue 29, items 4-5): headless Debian
Chromium at 1280x800 with the scripted engine double. The box has the focus when the chat opens
and keeps it through a new chat's first send; "Skip to message box" is the first Tab stop; text
pasted past the box's limit becomes an attached text file, and typing up to the limit says so.
(static/chat/composer.js, static/chat/chat.js, static/attachments/attachments.js.)"""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from playwright.sync_api import Page, expect

from attachments.models import Attachment
from conversations.models import Conversation, Turn
from tests.browser.chat_ui_support import ANSWER, COMPOSER_BOX, browser, new_page, send, ui_login  # noqa: F401

pytestmark = pytest.mark.browser

CHIPS = "#composer [data-attachment-picked] li"
# The focus, and where the next Tab starts, back at the top of the page (blur() alone leaves
# Chromium's sequential focus starting point at the element that had it).
FOCUS_TO_TOP = (
    "() => { document.activeElement.blur(); document.body.tabIndex = -1; document.body.focus();"
    " document.body.removeAttribute('tabindex'); }"
)
NOTE = "#composer-note"


@pytest.fixture(autouse=True)
def _patient_moderation(settings):
    """A slow input check on a busy machine must not refuse the turn (not what is tested)."""
    settings.CHAT_MODERATION_TIMEOUT_S = 10


def signed_in(new_page, live, name: str) -> Page:
    page = new_page()
    ui_login(page, live.url, name)
    return page


def test_the_first_send_of_a_new_chat_keeps_the_focus_and_a_follow_up_in_the_box(
    live, engine_double, make_user, new_page
):
    """Given a new chat, when the first message is sent with Enter and the page takes the new
    conversation's address (its composer is swapped in), then the message box still has the
    focus, so text typed next lands in it."""
    make_user("fiona")
    page = signed_in(new_page, live, "fiona")
    page.click(COMPOSER_BOX)
    send(page, "hello")
    page.wait_for_url(f"{live.url}/c/**")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)

    expect(page.locator(COMPOSER_BOX)).to_be_focused()
    page.keyboard.type("and then?")
    expect(page.locator(COMPOSER_BOX)).to_have_value("and then?")


def test_the_message_box_has_the_focus_when_the_chat_opens(live, engine_double, make_user, new_page):
    """Given a signed-in user, when a new chat opens and when a conversation's page opens, then
    the message box has the focus (nothing else was focused)."""
    make_user("opal")
    page = signed_in(new_page, live, "opal")
    expect(page.locator(COMPOSER_BOX)).to_be_focused()
    send(page, "hi")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)

    page.goto(f"{live.url}/c/{Conversation.objects.get().conversation_id}/")

    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator(COMPOSER_BOX)).to_be_focused()


def test_the_first_tab_stop_is_a_visible_skip_link_to_the_message_box(live, engine_double, make_user, new_page):
    """Given a conversation's page with many chats in the sidebar and the focus at the top,
    when Tab is pressed, then the focus is on a visible "Skip to message box" link; when it is
    followed with Enter, then the message box has the focus."""
    user = make_user("tabby")
    for n in range(12):
        Conversation.objects.create(owner=user, title=f"chat {n}")
    page = signed_in(new_page, live, "tabby")
    expect(page.locator(".skip-link")).not_to_be_in_viewport()
    page.evaluate(FOCUS_TO_TOP)

    page.keyboard.press("Tab")

    skip = page.locator(":focus")
    expect(skip).to_have_text("Skip to message box")
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    expect(page.locator(COMPOSER_BOX)).to_be_focused()


def test_text_pasted_past_the_box_limit_becomes_an_attached_file_that_uploads(
    live, engine_double, make_user, new_page
):
    """Given the chat page, when 50,000 characters are pasted into the message box (it holds
    CHAT_MAX_MESSAGE_CHARS), then nothing is cut: the text becomes a chip, "Pasted text.txt",
    the box stays as it was, and a note says the paste was attached as a file; sending the
    message uploads it with the message, whole."""
    make_user("paste")
    page = signed_in(new_page, live, "paste")
    text = "cumulus " * 6_250  # 50,000 characters
    assert len(text) > django_settings.CHAT_MAX_MESSAGE_CHARS
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("(t) => navigator.clipboard.writeText(t)", text)
    page.click(COMPOSER_BOX)

    page.keyboard.press("Control+V")

    expect(page.locator(CHIPS)).to_have_count(1)
    expect(page.locator(CHIPS)).to_contain_text("Pasted text.txt")
    expect(page.locator(COMPOSER_BOX)).to_have_value("")
    expect(page.locator(NOTE)).to_be_visible()
    expect(page.locator(NOTE)).to_contain_text("attached as a file")
    send(page, "Summarise the pasted text.")
    expect(page.locator("#messages article.user .attachment-chip")).to_contain_text("Pasted text.txt")
    attachment = Attachment.objects.get()
    assert attachment.name == "Pasted text.txt"
    assert attachment.size == len(text)
    assert Turn.objects.get(role=Turn.Role.USER).content == "Summarise the pasted text."


def test_a_short_paste_goes_into_the_box(live, engine_double, make_user, new_page):
    """Given the chat page, when text that fits is pasted, then it is in the box and no chip or
    note appears."""
    make_user("short")
    page = signed_in(new_page, live, "short")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("(t) => navigator.clipboard.writeText(t)", "a few words")
    page.click(COMPOSER_BOX)

    page.keyboard.press("Control+V")

    expect(page.locator(COMPOSER_BOX)).to_have_value("a few words")
    expect(page.locator(CHIPS)).to_have_count(0)
    expect(page.locator(NOTE)).to_be_hidden()


def test_typing_up_to_the_box_limit_says_so(live, engine_double, make_user, new_page, settings):
    """Given a message box one character short of its limit, when two more are typed, then the
    box holds exactly the limit and a visible note says how much it holds; when a character is
    deleted, the note goes."""
    limit = django_settings.CHAT_MAX_MESSAGE_CHARS
    make_user("typist")
    page = signed_in(new_page, live, "typist")
    page.fill(COMPOSER_BOX, "x" * (limit - 1))
    expect(page.locator(NOTE)).to_be_hidden()

    page.keyboard.type("yz")

    expect(page.locator(NOTE)).to_be_visible()
    expect(page.locator(NOTE)).to_contain_text(f"holds at most {limit:,} characters")
    assert len(page.input_value(COMPOSER_BOX)) == limit
    page.keyboard.press("Backspace")
    expect(page.locator(NOTE)).to_be_hidden()
