"""The sidebar and the phone header menu in real Chromium (issue 29 items 6 and 8): a chat's
row menu by keyboard, pinning that survives a reload, date group headings, and the chat
header's actions behind one menu button on a 390x844 touch phone. The scripted engine double
(``engine_double``) stands in for the model; conversations are made with the services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from conversations import services as conversation_services
from conversations.models import Conversation
from conversations.sidebar import MONTHS
from tests.browser.chat_ui_support import assert_scripts_loaded, browser  # noqa: F401 - fixture
from tests.browser.layout_support import DESKTOP, PHONE, open_context

pytestmark = pytest.mark.browser

ROWS = "#sidebar li.conversation-row"


def chat(user, title: str, days_ago: float = 0) -> Conversation:
    conversation = conversation_services.conversation_create(owner=user, title=title)
    conversation_services.turn_append_user(conversation=conversation, content=f"About {title}")
    Conversation.objects.filter(pk=conversation.pk).update(
        last_turn_at=timezone.now() - timedelta(days=days_ago)
    )
    return conversation


def row_titles(page) -> list[str]:
    return page.locator(f"{ROWS} .row-title").all_inner_texts()


def test_a_rows_menu_opens_and_moves_by_keyboard(live, engine_double, make_user, browser):  # noqa: F811
    """Given a chat in the sidebar, when its menu button has the focus and Enter is pressed,
    then the menu opens (aria-expanded=true) with the focus on its first item, Rename;
    ArrowDown moves to Pin and ArrowUp back; Esc closes it and the focus is on the button."""
    user = make_user("keya")
    conversation = chat(user, "Keyboard trip")
    context = open_context(browser, DESKTOP, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/c/{conversation.pk}/")
        assert_scripts_loaded(page)
        button = page.locator(f"#row-menu-button-{conversation.pk}")
        menu = page.locator(f"#row-menu-{conversation.pk}")
        expect(button).to_have_attribute("aria-haspopup", "menu")
        expect(menu).to_be_hidden()

        button.focus()
        page.keyboard.press("Enter")

        expect(menu).to_be_visible()
        expect(button).to_have_attribute("aria-expanded", "true")
        expect(menu.get_by_role("menuitem", name="Rename")).to_be_focused()
        page.keyboard.press("ArrowDown")
        expect(menu.get_by_role("menuitem", name="Pin")).to_be_focused()
        page.keyboard.press("ArrowUp")
        expect(menu.get_by_role("menuitem", name="Rename")).to_be_focused()
        page.keyboard.press("Escape")
        expect(menu).to_be_hidden()
        expect(button).to_be_focused()
        expect(button).to_have_attribute("aria-expanded", "false")
    finally:
        context.close()


def test_renaming_from_the_row_menu_by_keyboard(live, engine_double, make_user, browser):  # noqa: F811
    """Given a chat, when Rename is chosen in its row menu, a new title typed and Enter
    pressed, then the sidebar shows the new title and it is stored."""
    user = make_user("rena")
    conversation = chat(user, "Old title")
    context = open_context(browser, DESKTOP, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")
        assert_scripts_loaded(page)
        page.locator(f"#row-menu-button-{conversation.pk}").focus()
        page.keyboard.press("Enter")
        page.keyboard.press("Enter")  # on Rename
        field = page.locator(f"#row-rename-{conversation.pk} input[name=title]")
        expect(field).to_be_focused()
        field.fill("New title")
        page.keyboard.press("Enter")

        expect(page.locator(f"{ROWS} .row-title")).to_have_text(["New title"])
        conversation.refresh_from_db()
        assert conversation.title == "New title"
        expect(page.locator(f"#row-menu-button-{conversation.pk}")).to_be_focused()
    finally:
        context.close()


def test_a_pinned_chat_is_listed_first_and_stays_first_after_a_reload(
    live, engine_double, make_user, browser  # noqa: F811
):
    """Given three chats, the oldest last, when Pin is chosen in the oldest one's menu, then
    the sidebar shows a Pinned heading with it first, without a reload; after a reload it is
    still first under Pinned; its menu now says Unpin."""
    user = make_user("pia")
    chat(user, "Newest", 0)
    chat(user, "Middle", 1)
    oldest = chat(user, "Oldest", 3)
    context = open_context(browser, DESKTOP, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")
        assert_scripts_loaded(page)
        assert row_titles(page) == ["Newest", "Middle", "Oldest"]

        page.click(f"#row-menu-button-{oldest.pk}")
        page.locator(f"#row-menu-{oldest.pk}").get_by_role("menuitem", name="Pin").click()

        expect(page.locator("#sidebar .conversation-group .group-heading").first).to_have_text("Pinned")
        expect(page.locator(f"{ROWS} .row-title").first).to_have_text("Oldest")
        page.reload()
        expect(page.locator("#sidebar .conversation-group .group-heading").first).to_have_text("Pinned")
        assert row_titles(page) == ["Oldest", "Newest", "Middle"]
        page.click(f"#row-menu-button-{oldest.pk}")
        expect(page.locator(f"#row-menu-{oldest.pk}").get_by_role("menuitem", name="Unpin")).to_be_visible()
    finally:
        context.close()


def test_the_date_groups_have_headings(live, engine_double, make_user, browser):  # noqa: F811
    """Given chats from today, yesterday, 4 days ago and 60 days ago, the sidebar shows the
    headings Today, Yesterday, Previous 7 days and the month of the oldest, in that order."""
    user = make_user("gus")
    chat(user, "A", 0)
    chat(user, "B", 1)
    chat(user, "C", 4)
    chat(user, "D", 60)
    context = open_context(browser, DESKTOP, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")  # sets the tz cookie (UTC here) for the next load
        page.reload()
        month = timezone.now() - timedelta(days=60)
        expect(page.locator("#sidebar .conversation-group .group-heading")).to_have_text(
            ["Today", "Yesterday", "Previous 7 days", f"{MONTHS[month.month - 1]} {month.year}"]
        )
    finally:
        context.close()


def test_the_phone_header_menu_opens_closes_and_its_actions_work(
    live, engine_double, make_user, browser  # noqa: F811
):
    """Given a conversation on a 390x844 touch phone, the header's actions are hidden behind
    one menu button (aria-expanded=false); pressed, it shows Share, Export, Instructions and
    Delete inside the window; Esc closes it and gives the button the focus back; a tap outside
    closes it; Export shows its download links; Share opens the share page."""
    user = make_user("phoebe")
    conversation = chat(user, "A trip to Oslo with a long title")
    context = open_context(browser, PHONE, user=user, url=live.url, touch=True)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/c/{conversation.pk}/")
        assert_scripts_loaded(page)
        button = page.locator("[data-header-menu-button]")
        share = page.locator(".chat-header a.share-link")
        expect(button).to_be_visible()
        expect(button).to_have_attribute("aria-expanded", "false")
        expect(share).to_be_hidden()
        title = page.locator(".chat-header .rename input").bounding_box()
        assert title["width"] >= 150, title  # the title has the room the actions took

        button.click()
        expect(button).to_have_attribute("aria-expanded", "true")
        for control in (share, page.locator(".chat-header .export-menu > summary"),
                        page.locator(".chat-header .instructions-menu > summary"),
                        page.locator(".chat-header button.danger")):  # fmt: skip
            expect(control).to_be_visible()
            box = control.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        page.keyboard.press("Escape")
        expect(share).to_be_hidden()
        expect(button).to_be_focused()

        button.click()
        expect(share).to_be_visible()
        page.mouse.click(200, 500)  # the messages, outside the menu
        expect(share).to_be_hidden()

        button.click()
        page.locator(".chat-header .export-menu > summary").click()
        expect(page.get_by_role("link", name="Markdown (the branch shown)")).to_be_visible()
        share.click()
        page.wait_for_url(f"{live.url}/c/{conversation.pk}/share/")
    finally:
        context.close()
