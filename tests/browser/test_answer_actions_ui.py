"""An answer's action row in a real browser (issue 29, items 1-3): headless Debian Chromium at
1280x800 with the scripted engine double. An answer followed again after a reload mid-stream
ends with the same row a freshly sent one gets (Copy, Continue when cut off, Regenerate, the
thumbs); Continue is offered only under a cut-off answer; the answer version chosen with `<`
is the one a reload shows. Fixtures and helpers come from chat_ui_support.py."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from conversations.models import Conversation, Turn
from tests.browser.chat_ui_support import ANSWER, browser, new_page, send, ui_login  # noqa: F401

pytestmark = pytest.mark.browser

ACTIONS = f"{ANSWER} .turn-actions"
VERSION = f"{ANSWER} .version-index"


@pytest.fixture(autouse=True)
def _patient_moderation(settings):
    """A slow input check on a busy machine must not refuse the turn (not what is tested)."""
    settings.CHAT_MODERATION_TIMEOUT_S = 10


def signed_in(new_page, live, name: str) -> Page:
    page = new_page()
    ui_login(page, live.url, name)
    return page


def press_until_accepted(page: Page, selector: str, path_end: str) -> None:
    """Click ``selector`` until its request is not refused with 409: the conversation is free a
    moment after `done` (its lock goes once the event log is flushed)."""
    for _ in range(50):
        with page.expect_response(lambda r: r.url.endswith(path_end)) as response:
            page.click(selector)
        if response.value.status != 409:
            break
        page.wait_for_timeout(100)
    assert response.value.status == 200, response.value.status


def test_an_answer_followed_after_a_reload_mid_stream_ends_with_its_actions(
    live, engine_double, make_user, new_page, settings
):
    """Given an answer being written that will be cut off at its token budget, when the page is
    reloaded mid-stream and the stream ends, then the answer shows the same actions a freshly
    sent one gets, without another reload: Copy (with the whole text), Continue, Regenerate and
    the thumbs, under "Cut off at 3 tokens."."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 30
    settings.CHAT_MAX_TOKENS = 3
    engine_double.scripts = [["Clouds ", 1.5, "drift ", 1.0, "slowly ", "by."]]
    make_user("cirrus")
    page = signed_in(new_page, live, "cirrus")
    send(page, "Write a short paragraph about clouds.")
    expect(page.locator(f"{ANSWER} [data-stream-text]")).to_have_text("Clouds ")

    page.reload()

    expect(page.locator(f"{ANSWER}.complete [data-cut-off]")).to_have_text("Cut off at 3 tokens.", timeout=15_000)
    expect(page.locator(f"{ACTIONS} button.copy-answer")).to_be_visible()
    expect(page.locator(f"{ACTIONS} button.copy-answer")).to_have_attribute("data-copy-text", "Clouds drift slowly ")
    expect(page.locator(f"{ACTIONS} button.continue")).to_be_visible()
    expect(page.locator(f"{ACTIONS} button.regenerate")).to_be_visible()
    expect(page.locator(f"{ACTIONS} button.feedback-up")).to_be_visible()
    expect(page.locator(f"{ACTIONS} button.feedback-down")).to_be_visible()
    answer = Turn.objects.get(role=Turn.Role.ASSISTANT)
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{answer.turn_id}")


def test_continue_shows_only_under_a_cut_off_answer(live, engine_double, make_user, new_page, settings):
    """Given a freshly streamed answer that ended by itself, then it offers Regenerate but no
    Continue (its button stays hidden); given one cut off at its token budget, then Continue is
    shown."""
    engine_double.scripts = [["A whole answer."], ["They ", "help", "s ", "never"]]
    make_user("nimbus")
    page = signed_in(new_page, live, "nimbus")
    send(page, "say something")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator(f"{ACTIONS} button.regenerate")).to_be_visible()
    expect(page.locator(f"{ACTIONS} button.continue")).to_be_hidden()

    settings.CHAT_MAX_TOKENS = 3
    press_until_accepted(page, f"{ANSWER} button.regenerate", "/regenerate")

    expect(page.locator(f"{ANSWER}.complete [data-cut-off]")).to_have_text("Cut off at 3 tokens.")
    expect(page.locator(f"{ACTIONS} button.continue")).to_be_visible()


def test_the_answer_version_chosen_is_kept_across_a_reload_until_the_next_regenerate(
    live, engine_double, make_user, new_page
):
    """Given an answer regenerated once (2/2), when `<` shows 1/2 and the page is reloaded,
    then 1/2 (the first answer) is still shown, and the choice is stored on the conversation;
    when that answer is regenerated, the new one (3/3) is shown, also after a reload."""
    engine_double.scripts = [["First answer."], ["Second answer."], ["Third answer."]]
    make_user("stratus")
    page = signed_in(new_page, live, "stratus")
    send(page, "pick one")
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("First answer.")
    press_until_accepted(page, f"{ANSWER} button.regenerate", "/regenerate")
    expect(page.locator(VERSION)).to_have_text("2/2")
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("Second answer.")
    first = Turn.objects.get(role=Turn.Role.ASSISTANT, content="First answer.")

    page.click(f"{ANSWER} button.version-prev")
    expect(page.locator(VERSION)).to_have_text("1/2")
    page.reload()

    expect(page.locator(VERSION)).to_have_text("1/2")
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text("First answer.")
    expect(page.locator(ANSWER)).to_have_attribute("id", f"turn-{first.turn_id}")
    assert Conversation.objects.get().answer_choices == {str(first.reply_to_id): str(first.turn_id)}

    press_until_accepted(page, f"{ANSWER} button.regenerate", "/regenerate")
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("Third answer.")
    expect(page.locator(VERSION)).to_have_text("3/3")
    page.reload()
    expect(page.locator(VERSION)).to_have_text("3/3")
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text("Third answer.")
