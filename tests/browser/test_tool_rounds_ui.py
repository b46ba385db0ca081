"""Tool rounds in a real browser (issue 30): "Used N tools" above an answer written after tool
calls is closed at first, opens without script (a <details>), shows each call and its result, a
long result opens in full in place, and nothing scrolls the page sideways at 390 px or takes a
target under 44x44 CSS px on a touch phone.

With ``CHAT_SCREENSHOTS_DIR`` set, the last test writes PNGs of a chat with a tool round open at
390x844 and 1280x800 in both schemes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conversations import services
from tests.browser.chat_ui_support import browser  # noqa: F401
from tests.browser.layout_support import PHONE, SCHEMES, SIZES, open_context, small_touch_targets
from tests.tool_rounds import tool_round_seed

pytestmark = pytest.mark.browser

LONG_RESULT = json.dumps(
    {"city": "Paris", "hourly": [{"hour": h, "temp_c": 14 + h % 9, "sky": "clear" if h % 3 else "cloudy"} for h in range(24)]},
    indent=2,
)
CALLS = (
    ("get_weather", json.dumps({"city": "Paris", "units": "metric", "hours": 24, "include": ["temp", "sky", "wind"]}), LONG_RESULT),
    ("get_time", json.dumps({"tz": "Europe/Paris"}), "14:05"),
)


def chat_with_round(user):
    conversation = services.conversation_create(owner=user, title="Weather in Paris")
    tool_round_seed(conversation, question="Hi there", calls=(), answer="Hello! Ask me anything.")
    tool_round_seed(
        conversation, question="What is the weather in Paris today, hour by hour?", calls=CALLS,
        answer="It is **21 °C** and clear now; clouds come at 15:00, and it stays dry until evening.",
    )  # fmt: skip
    return conversation


def _open_round(page):
    block = page.locator("details[data-tool-uses]").last
    block.locator("> summary").click()
    return block


def test_the_round_opens_in_place_and_fits_a_phone(live, engine_double, make_user, browser):  # noqa: F811
    """Given a chat whose answer followed two calls, on a 390x844 touch phone: the block is
    closed, opens to show both calls, the long result opens in full, and the page neither
    scrolls sideways nor has a target under 44x44 px."""
    user = make_user("tom")
    conversation = chat_with_round(user)
    context = open_context(browser, PHONE, "dark", user, live.url, touch=True)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/c/{conversation.pk}/")
        block = page.locator("details[data-tool-uses]").last
        expect(block.locator("> summary")).to_contain_text("Used 2 tools")
        expect(block.locator(".tool-use").first).to_be_hidden()
        _open_round(page)
        expect(block.locator(".tool-use")).to_have_count(2)
        expect(block.locator(".tool-use-call").first).to_contain_text("get_weather(")
        full = block.locator("[data-tool-result-full]")
        expect(full).to_be_hidden()
        block.locator(".tool-use-result summary").click()
        expect(full).to_be_visible()
        expect(block.locator(".tool-use-preview").first).to_be_hidden()
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
        assert small_touch_targets(page) == []
    finally:
        context.close()


@pytest.mark.screenshots  # deselected unless CHAT_SCREENSHOTS_DIR is set (tests/conftest.py)
def test_write_tool_round_screenshots(live, engine_double, make_user, browser):  # noqa: F811
    out = Path(os.environ["CHAT_SCREENSHOTS_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    user = make_user("sam")
    conversation = chat_with_round(user)
    for size_name, size in SIZES.items():
        for scheme in SCHEMES:
            context = open_context(browser, size, scheme, user, live.url)
            page = context.new_page()
            page.goto(f"{live.url}/c/{conversation.pk}/")
            page.screenshot(path=out / f"tool-round-closed-{size_name}-{scheme}.png")
            _open_round(page).locator("> summary").scroll_into_view_if_needed()
            page.screenshot(path=out / f"tool-round-{size_name}-{scheme}.png")
            context.close()
