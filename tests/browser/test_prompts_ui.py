"""Custom instructions, a conversation's instructions and temporary chats (issue 18 parts 10 and
12) in real Chromium at 1280x800, with the scripted engine double, which records every prompt
the turn pipeline templates."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation
from inference.prompts import CONVERSATION_PROMPT_HEADING, CUSTOM_INSTRUCTIONS_HEADING
from tests.browser.chat_ui_support import ANSWER, browser, new_page, send, ui_login  # noqa: F401

pytestmark = pytest.mark.browser

DESKTOP = {"width": 1280, "height": 800}


@pytest.fixture
def prompts(engine_double, monkeypatch) -> list[list[dict]]:
    """The system message of every prompt the engine double was asked to template."""
    seen: list[str] = []
    encode = engine_double.encode_chat

    def record(messages):
        system = [m["content"] for m in messages if m["role"] == "system"]
        seen.append(system[0] if system else "")
        return encode(messages)

    monkeypatch.setattr(engine_double, "encode_chat", record)
    return seen


def test_custom_and_conversation_instructions_set_in_the_page_reach_the_next_prompts(
    live, prompts, make_user, new_page, settings  # noqa: F811
):
    """Given a signed-in user, when they save custom instructions on the settings page and
    start a chat, then its first prompt carries them; when they then save instructions for the
    chat from its header, the next prompt carries both, the chat's after the user's."""
    settings.CHAT_MEMORY_ENABLED = False
    make_user("ivy")
    page = new_page()
    page.set_viewport_size(DESKTOP)
    ui_login(page, live.url, "ivy")

    page.goto(f"{live.url}/settings/")
    page.fill("#custom-instructions", "Call me Ivy.")
    page.click("form.custom-instructions button[type=submit]")
    expect(page.locator("#custom-instructions-status")).to_contain_text("Saved")

    page.goto(f"{live.url}/")
    send(page, "hello")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    first = prompts[-1]
    assert CUSTOM_INSTRUCTIONS_HEADING in first and "Call me Ivy." in first
    assert CONVERSATION_PROMPT_HEADING not in first

    page.click(".instructions-menu > summary")
    page.fill("#conversation-instructions", "Answer in French.")
    page.click(".instructions-panel button[type=submit]")
    expect(page.locator("#instructions-status")).to_contain_text("next message")
    send(page, "again")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(2)
    second = prompts[-1]
    assert second.index("Call me Ivy.") < second.index(CONVERSATION_PROMPT_HEADING)
    assert second.endswith("Answer in French.")

    page.reload()  # what was saved is shown in the dialog
    page.click(".instructions-menu > summary")
    expect(page.locator("#conversation-instructions")).to_have_value("Answer in French.")


def test_a_temporary_chat_is_marked_answered_and_deleted_when_its_page_goes(
    live, engine_double, make_user, new_page  # noqa: F811
):
    """Given the new-chat page, when the user turns on "Temporary chat", the banner shows; they
    send a message and get the answer, the chat is not in the sidebar; when they navigate away,
    the page's pagehide beacon deletes the conversation."""
    engine_double.scripts = [["Bonjour", "!"]]
    make_user("tom")
    page = new_page()
    page.set_viewport_size(DESKTOP)
    ui_login(page, live.url, "tom")

    banner = page.locator(".temporary-banner")
    expect(banner).to_be_hidden()
    page.check("[data-temporary-toggle]")
    expect(banner).to_be_visible()
    expect(banner).to_have_text("Temporary chat – not saved, not in your history")

    send(page, "hello")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator(f"{ANSWER} .bubble")).to_have_text("Bonjour!")
    conversation = Conversation.objects.get(owner__username="tom")
    assert conversation.temporary
    assert page.url == f"{live.url}/c/{conversation.conversation_id}/"
    expect(banner).to_be_visible()
    expect(page.locator("[data-temporary-discard]")).to_have_count(1)
    expect(page.locator(f'#sidebar a[href="/c/{conversation.conversation_id}/"]')).to_have_count(0)

    # Playwright does not report a beacon sent as its page goes: the row going is the evidence
    # (nothing else deletes it within seconds: the expiry is CHAT_ZDR_TTL_S, 600 s here).
    page.goto(f"{live.url}/settings/")

    deadline = time.monotonic() + 10
    while Conversation.objects.filter(pk=conversation.pk).exists():
        assert time.monotonic() < deadline, "the pagehide beacon did not delete the chat"
        time.sleep(0.1)
