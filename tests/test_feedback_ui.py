"""The rating buttons in a real browser (headless Debian Chromium, Playwright, engine double):
they appear under an answer once it has streamed, a click stores the rating and shows it
pressed, a comment is added and kept when the rating changes, and the state survives a reload.
Fixtures and helpers come from tests/browser/chat_ui_support.py."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from feedback.models import Feedback
from tests.browser.chat_ui_support import ANSWER, browser, new_page, send, ui_login  # noqa: F401

pytestmark = pytest.mark.browser

UP, DOWN = f"{ANSWER} button.feedback-up", f"{ANSWER} button.feedback-down"


def stored(timeout_s: float = 10) -> Feedback:
    """The one rating, once written (the click's request runs in the server's thread)."""
    deadline = time.monotonic() + timeout_s
    while (row := Feedback.objects.first()) is None:
        assert time.monotonic() < deadline, "no rating was stored"
        time.sleep(0.1)
    return row


def test_rating_a_streamed_answer_shows_it_pressed_and_keeps_the_comment(
    live, engine_double, make_user, new_page  # noqa: F811
):
    """Given an answer that has just streamed in, when the user clicks thumbs up, then it is
    pressed and stored; when they add a comment and then switch to thumbs down, the comment is
    kept with the new rating; after a reload the page shows thumbs down pressed and the
    comment."""
    engine_double.scripts = [["Lisbon ", "is the capital."]]
    make_user("rae")
    page = new_page()
    ui_login(page, live.url, "rae")
    send(page, "Capital of Portugal?")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1, timeout=30_000)
    expect(page.locator(UP)).to_be_visible()
    expect(page.locator(UP)).to_have_attribute("aria-pressed", "false")

    page.click(UP)

    expect(page.locator(UP)).to_have_attribute("aria-pressed", "true")
    expect(page.locator(DOWN)).to_have_attribute("aria-pressed", "false")
    assert stored().rating == "up"

    page.click(f"{ANSWER} .feedback-comment summary")
    page.fill(f"{ANSWER} .feedback-comment textarea", "Short and right.")
    page.click(f"{ANSWER} button.feedback-save")
    expect(page.locator(f"{ANSWER} .feedback-status")).to_be_visible()
    page.click(DOWN)
    expect(page.locator(DOWN)).to_have_attribute("aria-pressed", "true")

    row = stored()
    row.refresh_from_db()
    assert (row.rating, row.comment) == ("down", "Short and right.")
    page.reload()
    expect(page.locator(DOWN)).to_have_attribute("aria-pressed", "true")
    expect(page.locator(UP)).to_have_attribute("aria-pressed", "false")
    expect(page.locator(f"{ANSWER} .feedback-comment textarea")).to_have_value("Short and right.")
    assert Feedback.objects.count() == 1
