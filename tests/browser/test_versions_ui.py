"""Versions in a real browser (headless Debian Chromium, Playwright): Regenerate streams a new
answer shown as `< 2/2 >` and the arrows flip between the stored versions (real engine); Edit
puts the edited message and its new answer in the old one's place and starts a branch whose
`< 1/2 >` brings the old later turns back, kept across a reload; Regenerate is offered on the
last answer only (engine double). Fixtures and helpers come from chat_ui_support.py."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from conversations.models import Turn
from tests.browser.chat_ui_support import ANSWER, browser, new_page, send, ui_login  # noqa: F401

pytestmark = pytest.mark.browser

VERSION = f"{ANSWER} .version-index"


def wait_until(predicate, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


@pytest.mark.real_engine
def test_regenerate_streams_a_second_version_and_the_arrows_flip_between_them(
    live, new_page, make_user, settings  # noqa: F811
):
    """Given an answered message (real model), when the user presses Regenerate, then a new
    answer streams into the same place and ends as version 2/2 (a new turn that replaces the
    first, same question); when they press `<` the first version is shown as 1/2, `>` brings
    the second back, and after a reload the page shows the newest version, 2/2."""
    settings.CHAT_MAX_TOKENS = 24
    make_user("rita")
    page = new_page()
    ui_login(page, live.url, "rita")
    send(page, "Name one colour of the rainbow.")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1, timeout=60_000)
    first = Turn.objects.get(role="assistant")
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{first.turn_id}")
    expect(page.locator(VERSION)).to_have_count(0)  # one version: no `< 1/1 >`

    page.click(f"{ANSWER} button.regenerate")

    second = wait_until(lambda: Turn.objects.filter(role="assistant", replaces_id=first.turn_id).first())
    assert second.reply_to_id == first.reply_to_id
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{second.turn_id}")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator(VERSION)).to_be_visible()
    expect(page.locator(VERSION)).to_have_text("2/2")
    expect(page.locator(ANSWER)).to_have_count(1)

    page.click(f"{ANSWER} button.version-prev")
    expect(page.locator(VERSION)).to_have_text("1/2")
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{first.turn_id}")
    expect(page.locator(f"{ANSWER} button.version-prev")).to_be_disabled()

    page.click(f"{ANSWER} button.version-next")
    expect(page.locator(VERSION)).to_have_text("2/2")
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{second.turn_id}")

    page.reload()
    expect(page.locator(VERSION)).to_have_text("2/2")
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{second.turn_id}")
    assert Turn.objects.filter(role="assistant").count() == 2


def test_edit_puts_the_edited_message_and_a_new_answer_in_its_place(
    live, engine_double, make_user, new_page  # noqa: F811
):
    """Given an answered message, when the user opens Edit, changes the text and sends, then
    the exchange shows the edited message and its newly streamed answer in the same place
    (one exchange, not two), and the edit is stored as a new turn replacing the original."""
    engine_double.scripts = [["First answer."], ["Answer to the edit."]]
    make_user("eddie")
    page = new_page()
    ui_login(page, live.url, "eddie")
    send(page, "original question")
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("First answer.")

    page.click("#messages article.user details.edit summary")
    page.fill("#messages article.user details.edit textarea", "edited question")
    page.click("#messages article.user details.edit button[type=submit]")

    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("Answer to the edit.", timeout=20_000)
    expect(page.locator("#messages .exchange")).to_have_count(1)
    expect(page.locator("#messages article.user > .bubble")).to_have_text("edited question")
    original = Turn.objects.get(role="user", content="original question")
    assert Turn.objects.get(role="user", content="edited question").replaces_id == original.turn_id


QUESTION_VERSION = "#messages article.user .question-versions .version-index"


def test_edit_starts_a_branch_and_the_old_one_comes_back_after_a_reload(
    live, engine_double, make_user, new_page  # noqa: F811
):
    """Given two answered messages, when the first is edited, then the page shows the edit as
    2/2 with its new answer and without the second exchange (it stays on the old branch); `<`
    shows 1/2 with the old later turns; a reload (the branch is stored) still shows them; `>`
    goes back to the edit."""
    engine_double.scripts = [["First answer."], ["Second answer."], ["Answer to the edit."]]
    make_user("bran")
    page = new_page()
    ui_login(page, live.url, "bran")
    send(page, "first question")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    send(page, "second question")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(2)
    expect(page.locator(QUESTION_VERSION)).to_have_count(0)  # one version: no `< 1/1 >`

    first = page.locator("#messages .exchange").first
    first.locator("details.edit summary").click()
    first.locator("details.edit textarea").fill("first question, edited")
    # The conversation is free a moment after `done` (its lock goes once the event log is
    # flushed); until then an edit is refused with 409 and nothing stored, so send it again.
    for _ in range(50):
        with page.expect_response(lambda r: r.url.endswith("/edit")) as edited:
            first.locator("details.edit button[type=submit]").click()
        if edited.value.status != 409:
            break
        page.wait_for_timeout(100)
    assert edited.value.status == 200

    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("Answer to the edit.", timeout=20_000)
    expect(page.locator("#messages .exchange")).to_have_count(1)
    expect(page.locator(QUESTION_VERSION)).to_have_text("2/2")
    expect(page.locator("#messages article.user > .bubble")).to_have_text("first question, edited")

    page.click("#messages article.user .question-versions button.version-prev")

    expect(page.locator(QUESTION_VERSION)).to_have_text("1/2")
    expect(page.locator("#messages article.user > .bubble")).to_have_text(["first question", "second question"])
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text(["First answer.", "Second answer."])
    page.reload()
    expect(page.locator("#messages article.user > .bubble")).to_have_text(["first question", "second question"])
    expect(page.locator(QUESTION_VERSION)).to_have_text("1/2")

    page.click("#messages article.user .question-versions button.version-next")
    expect(page.locator(QUESTION_VERSION)).to_have_text("2/2")
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text(["Answer to the edit."])


def test_regenerate_is_offered_on_the_last_answer_only(live, engine_double, make_user, new_page):  # noqa: F811
    """Given two answered messages (the second sent after the first answer was shown with its
    Regenerate button), then only the last answer offers Regenerate."""
    make_user("lena")
    page = new_page()
    ui_login(page, live.url, "lena")
    send(page, "one")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator(f"{ANSWER} button.regenerate")).to_be_visible()

    send(page, "two")

    expect(page.locator(f"{ANSWER}.complete")).to_have_count(2)
    regenerate = page.locator(f"{ANSWER} button.regenerate")
    expect(regenerate.nth(0)).to_be_hidden()
    expect(regenerate.nth(1)).to_be_visible()
