"""Finish behind the peers (issue 29, item 7) in a real browser: headless Debian Chromium with
stored conversations (no engine needed). Editing a message opens an editor in place of the
bubble with Cancel and Send at its right, not a full-width box; a thumbs-up leaves the action
row where it was; files sent with a message sit under its bubble at the right; the sign-up
button is above the fold of a 1280x800 window. (The share link's Copy button is tested in
test_sharing_ui.py, the Markdown download's file name in tests/test_conversation_export.py.)
Fixtures and helpers come from chat_ui_support.py."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.chat_ui_support import browser, new_page, ui_login  # noqa: F401
from tests.browser.test_sharing_ui import conversation_of
from tests.test_attachments import stored_attachment

pytestmark = pytest.mark.browser

USER_TURN = "#messages article.user"


def box(page: Page, selector: str) -> dict:
    """The bounding box of the first match of ``selector``: {"x", "y", "width", "height"} in CSS
    px. Fails when it is not rendered."""
    found = page.locator(selector).first.bounding_box()
    assert found is not None, f"{selector} is not rendered"
    return found


def opened(new_page, live, name: str, conversation) -> Page:
    page = new_page()
    ui_login(page, live.url, name)
    page.goto(f"{live.url}/c/{conversation.pk}/")
    return page


def test_editing_a_message_replaces_its_bubble_with_an_editor_that_cancels(live, new_page, make_user):
    """Given a stored exchange, when the pencil under the question is pressed, then the bubble
    gives way to an editor holding the text, focused, narrower than the message column, with
    Cancel and Send side by side at its right (not a full-width "Save and send"); when the text
    is changed and Cancel pressed, the bubble is back and a new editor holds the original text;
    Escape closes it too."""
    owner = make_user("editor")
    conversation = conversation_of(owner, "Edits", [("Tell me about tides.", "Tides follow the moon.")])
    page = opened(new_page, live, "editor", conversation)
    column = box(page, "#messages")

    page.click(f"{USER_TURN} details.edit summary")

    editor = page.locator(f"{USER_TURN} details.edit textarea")
    expect(editor).to_be_focused()
    expect(editor).to_have_value("Tell me about tides.")
    expect(page.locator(f"{USER_TURN} .bubble")).to_be_hidden()
    form = box(page, f"{USER_TURN} details.edit form")
    assert form["width"] < column["width"] * 0.9, (form, column)
    cancel, send = box(page, f"{USER_TURN} .edit-cancel"), box(page, f"{USER_TURN} .edit-send")
    assert abs(cancel["y"] - send["y"]) < 2 and cancel["x"] < send["x"], (cancel, send)
    assert send["width"] < form["width"] / 2, (send, form)
    assert send["x"] + send["width"] > form["x"] + form["width"] - 24, (send, form)

    editor.fill("Something else entirely")
    page.click(f"{USER_TURN} .edit-cancel")
    expect(page.locator(f"{USER_TURN} .bubble")).to_be_visible()
    expect(editor).to_be_hidden()
    page.click(f"{USER_TURN} details.edit summary")
    expect(editor).to_have_value("Tell me about tides.")
    page.keyboard.press("Escape")
    expect(editor).to_be_hidden()
    expect(page.locator(f"{USER_TURN} .bubble")).to_be_visible()


def test_a_thumbs_up_leaves_the_action_row_where_it_was(live, new_page, make_user):
    """Given a stored answer, when its thumbs-up is pressed, then it is pressed and it, the
    thumbs-down and Copy stay where they were (the row does not reflow under the pointer)."""
    owner = make_user("rater")
    conversation = conversation_of(owner, "Ratings", [("Name a river.", "The Danube.")])
    page = opened(new_page, live, "rater", conversation)
    selectors = ["button.feedback-up", "button.feedback-down", "button.copy-answer"]
    before = [box(page, f"#messages article.assistant {s}") for s in selectors]

    page.click("#messages article.assistant button.feedback-up")

    expect(page.locator("#messages article.assistant button.feedback-up")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#messages article.assistant .feedback-status")).to_be_visible()
    after = [box(page, f"#messages article.assistant {s}") for s in selectors]
    for name, was, now in zip(selectors, before, after, strict=True):
        assert (round(now["x"]), round(now["y"])) == (round(was["x"]), round(was["y"])), (name, was, now)


def test_files_sent_with_a_message_sit_under_its_bubble_at_the_right(live, new_page, make_user):
    """Given a message sent with a file, then the file's chip is under the right-aligned bubble,
    its right edge with the bubble's (not at the column's left), and shows no list bullet."""
    owner = make_user("filer")
    conversation, _ = stored_attachment(owner, name="notes.txt")
    page = opened(new_page, live, "filer", conversation)

    bubble = box(page, f"{USER_TURN} .bubble")
    chip = box(page, f"{USER_TURN} .attachment-chip")

    assert chip["y"] >= bubble["y"] + bubble["height"] - 1, (chip, bubble)
    assert abs((chip["x"] + chip["width"]) - (bubble["x"] + bubble["width"])) < 4, (chip, bubble)
    style = page.locator(f"{USER_TURN} .attachment-chip").first.evaluate("e => getComputedStyle(e).display")
    assert style != "list-item", style


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_the_sign_up_button_is_above_the_fold(live, browser, width, height):  # noqa: F811
    """Given the sign-up page at 1280x800 (and a phone's 390x844), then the Sign up button is
    wholly inside the first screen, and the password rules are one line of text, not a list."""
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        page.goto(f"{live.url}/accounts/signup/")
        button = box(page, "main form button[type=submit]")
        assert button["y"] + button["height"] <= height, (button, height)
        assert page.locator("main form ul").count() == 0
        expect(page.locator("main form")).to_contain_text("At least 12 characters")
    finally:
        context.close()


def test_the_title_is_renamed_in_place_with_a_pencil_enter_and_escape(live, new_page, make_user):  # noqa: F811
    """Given an open conversation, then its title shows a pencil and no Save button; when the
    title is clicked, Save shows; Esc puts the saved title back; a new title and Enter save it
    (the sidebar row shows it) and Save goes away."""
    owner = make_user("renamer")
    conversation = conversation_of(owner, "Old title", [("Hi", "Hello.")])
    page = opened(new_page, live, "renamer", conversation)
    title, save = page.locator("#conversation-title"), page.locator(".chat-header .rename-save")
    expect(page.locator(".chat-header .rename-hint")).to_be_visible()
    expect(save).to_be_hidden()

    page.click(".chat-header .rename-hint")
    expect(title).to_be_focused()
    expect(save).to_be_visible()
    title.fill("Something else")
    page.keyboard.press("Escape")
    expect(title).to_have_value("Old title")
    expect(save).to_be_hidden()

    title.click()
    title.fill("Lisbon trip")
    with page.expect_response(lambda r: r.url.endswith("/rename")):
        page.keyboard.press("Enter")
    expect(page.locator("#sidebar")).to_contain_text("Lisbon trip")
    expect(save).to_be_hidden()
    title.click()
    title.fill("x")
    page.keyboard.press("Escape")  # the saved title is the one Esc puts back now
    expect(title).to_have_value("Lisbon trip")
