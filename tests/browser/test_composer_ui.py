"""The composer in a real browser (issue 18 part 6): headless Debian Chromium at 1280x800 (the
default context), with the scripted engine double: the message box grows, Send becomes Stop
while an answer streams, Esc stops it, files dropped or pasted become removable chips that
upload with the message, and the keyboard shortcuts with their ``?`` dialog.
(static/chat/composer.js, static/attachments/attachments.js.)"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from attachments.models import Attachment
from conversations.models import Turn
from tests.browser.chat_ui_support import (  # noqa: F401 - fixtures
    ANSWER,
    COMPOSER_BOX,
    browser,
    new_page,
    send,
    ui_login,
)

pytestmark = pytest.mark.browser

SEND = "#composer button[data-send]"
CHIPS = "#composer [data-attachment-picked] li"
SLOW = ["one ", 8.0, "two"]  # an answer still being written when the test acts on it


@pytest.fixture(autouse=True)
def _patient_moderation(settings):
    """A slow input check on a busy machine must not refuse the turn (not what is tested)."""
    settings.CHAT_MODERATION_TIMEOUT_S = 10


def box_height(page: Page) -> float:
    return page.eval_on_selector(COMPOSER_BOX, "el => el.getBoundingClientRect().height")


def signed_in(new_page, live, name: str) -> Page:
    page = new_page()
    ui_login(page, live.url, name)
    return page


def stored_answer() -> Turn:
    return Turn.objects.get(role=Turn.Role.ASSISTANT)


# --- the box grows --------------------------------------------------------------------------


def test_message_box_grows_with_its_lines_up_to_a_cap_then_scrolls(live, engine_double, make_user, new_page):
    """Given the empty message box (one line), when four lines are typed it is taller; with 40
    lines it stops at its max-height and scrolls inside; once the message is sent it is one
    line high again."""
    make_user("greta")
    page = signed_in(new_page, live, "greta")
    empty = box_height(page)

    page.click(COMPOSER_BOX)
    page.keyboard.type("one")
    for line in ("two", "three", "four"):
        page.keyboard.press("Shift+Enter")
        page.keyboard.type(line)
    four = box_height(page)
    assert four > empty * 1.8, (empty, four)
    assert page.eval_on_selector(COMPOSER_BOX, "el => el.scrollHeight <= el.clientHeight + 1")

    page.fill(COMPOSER_BOX, "\n".join(f"line {i}" for i in range(40)))
    capped = box_height(page)
    cap = page.eval_on_selector(COMPOSER_BOX, "el => parseFloat(getComputedStyle(el).maxHeight)")
    assert capped == pytest.approx(cap, abs=1) and capped > four
    assert page.eval_on_selector(COMPOSER_BOX, "el => el.scrollHeight > el.clientHeight")
    assert page.eval_on_selector(COMPOSER_BOX, "el => getComputedStyle(el).overflowY") == "auto"

    page.press(COMPOSER_BOX, "Enter")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    page.wait_for_function("([sel, h]) => document.querySelector(sel).getBoundingClientRect().height <= h + 1",
                           arg=[COMPOSER_BOX, empty])


# --- Send, Stop, Esc ------------------------------------------------------------------------


def test_send_becomes_stop_while_the_answer_streams_and_stop_stores_it_stopped(
    live, engine_double, make_user, new_page
):
    """Given an answer that takes a while, when the message is sent the composer's Send reads
    Stop; Enter in the box then sends nothing; pressing Stop stops the answer (stored as
    cancelled, the engine request aborted) and the button reads Send again."""
    engine_double.scripts.append(SLOW)
    make_user("stella")
    page = signed_in(new_page, live, "stella")
    button = page.locator(SEND)
    expect(button).to_have_text("Send")
    posts: list[str] = []

    send(page, "Count slowly")
    expect(page.locator(f"{ANSWER} [data-stream-text]")).to_have_text("one ")
    expect(button).to_have_text("Stop")
    expect(button).to_have_attribute("aria-label", "Stop the answer")
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    send(page, "A second message while the first is answered")
    page.wait_for_timeout(300)
    assert posts == [] and page.input_value(COMPOSER_BOX).startswith("A second")

    button.click()

    expect(page.locator(f"{ANSWER} [data-stream-note]")).to_have_text("Stopped.")
    expect(button).to_have_text("Send")
    assert [p for p in posts if p.endswith("/stop")] and len(posts) == 1
    assert stored_answer().status == Turn.Status.CANCELLED
    assert len(engine_double.aborted) == 1


def test_esc_stops_the_streaming_answer(live, engine_double, make_user, new_page):
    """Given an answer being written, when the user presses Esc (the focus in the message box),
    then the answer stops: "Stopped." shows, it is stored as cancelled with what was written,
    and the engine request is aborted."""
    engine_double.scripts.append(SLOW)
    make_user("esther")
    page = signed_in(new_page, live, "esther")
    send(page, "Count slowly")
    expect(page.locator(f"{ANSWER} [data-stream-text]")).to_have_text("one ")

    page.keyboard.press("Escape")

    expect(page.locator(f"{ANSWER} [data-stream-note]")).to_have_text("Stopped.")
    expect(page.locator(ANSWER)).to_have_class(re.compile(r"\bcancelled\b"))
    answer = stored_answer()
    assert answer.status == Turn.Status.CANCELLED and answer.content == "one "
    assert len(engine_double.aborted) == 1
    expect(page.locator(SEND)).to_have_text("Send")


# --- files: drop, paste, chips --------------------------------------------------------------

# A DataTransfer with text files built in the page, as a drag from the desktop carries them.
MAKE_TRANSFER = """(files) => {
    const transfer = new DataTransfer();
    for (const [name, text] of files) transfer.items.add(new File([text], name, {type: 'text/plain'}));
    return transfer;
}"""

# Records every chip's upload progress (value / max) on each upload progress event, after
# attachments.js has updated them.
RECORD_PROGRESS = """() => {
    window.__progress = [];
    document.addEventListener('htmx:beforeSend', (e) => {
        e.detail.xhr.upload.addEventListener('progress', () => {
            window.__progress.push([...document.querySelectorAll('#composer [data-attachment-picked] progress')]
                .map((p) => p.hidden ? -1 : p.value / p.max));
        });
    });
}"""


def test_files_dropped_on_the_composer_become_chips_that_can_be_removed_and_upload(
    live, engine_double, make_user, new_page
):
    """Given the chat page, when two text files are dropped on the composer (a DataTransfer drop
    event), then two chips show their names; when one is removed, one chip is left and the
    form's file input holds only that file; when the message is sent, its chip showed upload
    progress up to 100%, the file is stored on the message (shown as its chip) and the composer
    has no chips left."""
    make_user("drew")
    page = signed_in(new_page, live, "drew")
    transfer = page.evaluate_handle(
        MAKE_TRANSFER, [["keep.txt", "The password is mango. " * 4000], ["drop.txt", "not this one"]]
    )

    page.dispatch_event("#composer", "dragover", {"dataTransfer": transfer})
    expect(page.locator("#composer")).to_have_class(re.compile(r"\bdrop-target\b"))
    page.dispatch_event("#composer textarea", "drop", {"dataTransfer": transfer})

    expect(page.locator(CHIPS)).to_have_count(2)
    expect(page.locator(CHIPS).nth(0)).to_contain_text("keep.txt")
    expect(page.locator(CHIPS).nth(1)).to_contain_text("drop.txt")
    expect(page.locator("#composer")).not_to_have_class(re.compile(r"\bdrop-target\b"))

    page.get_by_role("button", name="Remove drop.txt").click()

    expect(page.locator(CHIPS)).to_have_count(1)
    expect(page.locator(CHIPS)).to_contain_text("keep.txt")
    assert page.eval_on_selector("#composer input[type=file]", "i => [...i.files].map((f) => f.name)") == ["keep.txt"]

    page.evaluate(RECORD_PROGRESS)
    send(page, "What is the password?")

    expect(page.locator("#messages article.user .attachment-chip")).to_contain_text("keep.txt")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    assert [a.name for a in Attachment.objects.all()] == ["keep.txt"]
    progress = page.evaluate("window.__progress")
    assert progress and progress[-1] == [1], progress
    expect(page.locator(CHIPS)).to_have_count(0)
    assert page.eval_on_selector("#composer input[type=file]", "i => i.files.length") == 0


def test_a_file_pasted_into_the_message_box_becomes_a_chip_and_uploads(live, engine_double, make_user, new_page):
    """Given the chat page, when a file is pasted into the message box (a paste event whose
    clipboard carries a file), then it shows as a chip, no text is pasted, and sending the
    message stores the file on it."""
    make_user("pat")
    page = signed_in(new_page, live, "pat")
    transfer = page.evaluate_handle(MAKE_TRANSFER, [["pasted.md", "# Pasted\n\nHello."]])

    page.evaluate(
        "(t) => document.querySelector('#composer textarea').dispatchEvent("
        "new ClipboardEvent('paste', {clipboardData: t, bubbles: true, cancelable: true}))",
        transfer,
    )

    expect(page.locator(CHIPS)).to_have_count(1)
    expect(page.locator(CHIPS)).to_contain_text("pasted.md")
    assert page.input_value(COMPOSER_BOX) == ""
    send(page, "Read the pasted file")
    expect(page.locator("#messages article.user .attachment-chip")).to_contain_text("pasted.md")
    assert [a.name for a in Attachment.objects.all()] == ["pasted.md"]


# --- shortcuts --------------------------------------------------------------------------------


def test_question_mark_outside_a_text_field_opens_the_shortcuts_dialog(live, engine_double, make_user, new_page):
    """Given the chat page, when "?" is typed in the message box it is just text; when it is
    pressed with the focus outside a text field, the shortcuts dialog opens (modal) and lists
    new chat, focus the message box and copy the last answer with their keys; Esc closes it
    and the "Keyboard shortcuts" button opens it again."""
    make_user("quinn")
    page = signed_in(new_page, live, "quinn")
    dialog = page.locator("dialog#shortcuts")
    page.click(COMPOSER_BOX)
    page.keyboard.type("why?")
    assert page.input_value(COMPOSER_BOX) == "why?"
    expect(dialog).to_be_hidden()

    page.locator("#messages").click()  # the focus leaves the box
    page.keyboard.press("?")

    expect(dialog).to_be_visible()
    assert page.evaluate("document.querySelector('dialog#shortcuts').matches(':modal')")
    rows = dialog.locator("tbody tr")
    texts = [" ".join(t.split()) for t in rows.all_inner_texts()]
    assert "Ctrl + Shift + O New chat" in texts
    assert "Shift + Esc Focus the message box" in texts
    assert "Ctrl + Shift + C Copy the last answer" in texts
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    page.get_by_role("button", name="Keyboard shortcuts").click()
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()


def test_shift_esc_focuses_the_box_and_ctrl_shift_c_copies_the_last_answer(
    live, engine_double, make_user, new_page
):
    """Given a conversation with two answers, when the focus is elsewhere and Shift+Esc is
    pressed, the message box has the focus; when Ctrl+Shift+C is pressed, the clipboard holds
    the last answer's text (not the first's)."""
    engine_double.scripts += [["The first answer."], ["The **second** answer."]]
    make_user("cora")
    page = signed_in(new_page, live, "cora")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live.url)
    send(page, "first")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    send(page, "second")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(2)

    page.locator("#messages").click()
    assert page.evaluate("document.activeElement.tagName") != "TEXTAREA"
    page.keyboard.press("Shift+Escape")
    assert page.evaluate("document.activeElement.matches('#composer textarea')")

    page.locator("#messages").click()
    page.keyboard.press("Control+Shift+C")
    page.wait_for_function("() => navigator.clipboard.readText().then((t) => t.length > 0)")
    assert page.evaluate("navigator.clipboard.readText()") == "The **second** answer."


def test_ctrl_shift_o_opens_a_new_chat(live, engine_double, make_user, new_page):
    """Given a conversation's page, when Ctrl+Shift+O is pressed (also with the focus in the
    message box), the browser goes to a new, empty chat."""
    make_user("olga")
    page = signed_in(new_page, live, "olga")
    send(page, "hello")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    page.wait_for_url(f"{live.url}/c/**")

    page.click(COMPOSER_BOX)
    page.keyboard.press("Control+Shift+O")

    page.wait_for_url(f"{live.url}/")
    expect(page.locator("#messages article")).to_have_count(0)
