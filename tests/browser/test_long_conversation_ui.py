"""A 3,000-turn conversation in a real browser (issue 29): headless Debian Chromium at its
default 1280x720 against the shared server (``live``). The page opens with one page of
exchanges (page_selectors.EXCHANGES_PAGE) and a ready message box, loads earlier pages as the reader
scrolls up until the first message, and keeps the exchange the reader looks at in place while
a page goes in above it (static/chat/follow.js). Conversations come from
tests/long_conversation.py; fixtures and helpers from chat_ui_support.py."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from conversations.page_selectors import EXCHANGES_PAGE
from tests.browser.chat_ui_support import COMPOSER_BOX, browser, new_page, ui_login  # noqa: F401
from tests.long_conversation import long_conversation_seed, question_text

pytestmark = pytest.mark.browser

TURNS = "#messages article.turn"
QUESTIONS = "#messages article.turn.user"


def opened(new_page, live, user, conversation) -> Page:
    page = new_page()
    ui_login(page, live.url, user.username)
    page.goto(f"{live.url}/c/{conversation.pk}/")
    return page


def scroll_to_top(page: Page) -> None:
    """The reader's wheel, up to the top of what is loaded (as a person scrolls, so the page
    knows the reader moved: follow.js stops keeping the place of a page that goes in)."""
    box = page.locator("#messages").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for _ in range(200):
        if page.evaluate("document.getElementById('messages').scrollTop") <= 0:
            return
        page.mouse.wheel(0, -20_000)
        page.wait_for_timeout(20)


def test_a_3000_turn_conversation_opens_with_one_page_and_a_ready_box(live, make_user, new_page):
    """Given 3,000 turns with 20 branches, when the conversation opens, then the box takes
    typing at once, the newest exchange is in view, and the page holds one page of turns."""
    user = make_user("longreader")
    seeded = long_conversation_seed(owner=user, turns=3000, branches=20)
    page = opened(new_page, live, user, seeded.conversation)

    page.fill(COMPOSER_BOX, "typed at once")

    expect(page.locator(COMPOSER_BOX)).to_have_value("typed at once")
    newest = page.locator(f"#turn-{seeded.questions[-1]}")
    expect(newest).to_be_in_viewport()
    page.wait_for_timeout(500)  # a sentinel in view would have loaded a page by now
    assert page.locator(TURNS).count() == 2 * EXCHANGES_PAGE


def test_scrolling_up_loads_earlier_pages_until_the_first_message(live, make_user, new_page):
    """Given 3,000 turns (1,460 exchanges on the branch shown), when the reader keeps scrolling
    to the top, then earlier pages come in, in order, until the first message shows and no
    sentinel is left."""
    user = make_user("scroller")
    seeded = long_conversation_seed(owner=user, turns=3000, branches=20)
    page = opened(new_page, live, user, seeded.conversation)
    first = page.locator(f"#turn-{seeded.questions[0]}")

    for _ in range(len(seeded.questions) // EXCHANGES_PAGE + 2):
        if first.count():
            break
        count = page.locator(QUESTIONS).count()
        scroll_to_top(page)
        page.wait_for_function(
            f"document.querySelectorAll('{QUESTIONS}').length > {count}", timeout=20_000
        )

    expect(first).to_have_count(1)
    assert page.locator("[data-earlier]").count() == 0
    # textContent: exchanges out of view are not drawn (content-visibility), so innerText is "".
    texts = [t.strip() for t in page.locator(f"{QUESTIONS} .bubble").all_text_contents()]
    expect(page.locator(f"{QUESTIONS} .bubble").first).to_be_visible()  # drawn where the reader is
    assert texts == [question_text(i) for i in range(len(seeded.questions))]


def test_the_view_stays_put_when_a_page_goes_in_above(live, make_user, new_page):
    """Given the reader scrolled to the top of the first page, when the page before it goes
    in above, then the exchange they were looking at stays where it was on the screen."""
    user = make_user("steady")
    seeded = long_conversation_seed(owner=user, turns=3000, branches=20)
    page = opened(new_page, live, user, seeded.conversation)
    oldest = page.locator(f"#turn-{seeded.questions[-EXCHANGES_PAGE]}")
    expect(oldest).to_have_count(1)

    held = []  # the page's request for the page before, answered once the view is measured
    page.route("**/earlier?*", lambda route: held.append(route))
    scroll_to_top(page)
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    top_before = oldest.bounding_box()["y"]

    held[0].continue_()
    expect(page.locator(QUESTIONS)).to_have_count(2 * EXCHANGES_PAGE)
    page.wait_for_timeout(100)  # a frame after the insertion

    assert page.locator(f"#turn-{seeded.questions[-2 * EXCHANGES_PAGE]}").count() == 1
    assert abs(oldest.bounding_box()["y"] - top_before) <= 1
    assert page.evaluate("document.getElementById('messages').scrollTop") > 0
