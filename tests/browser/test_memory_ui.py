""""Memory updated" with Undo in a real browser (issue 28): under the answer to a message that
asked to remember something, at 390x844 and 1280x800 in both schemes, with no sideways scroll;
Undo puts memory back as it was. ``CHAT_SCREENSHOTS_DIR`` set: PNGs of the notice there."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conversations import services as conversation_services
from conversations.models import Turn
from memory.models import UserMemory
from memory.updates import memory_commands_apply
from tests.browser.chat_ui_support import browser  # noqa: F401
from tests.browser.layout_support import LAYOUT_PROBE, SCHEMES, SIZES, open_context, page_of

pytestmark = pytest.mark.browser


def test_memory_updated_shows_under_the_answer_and_undo_restores_memory(
    live, engine_double, make_user, browser  # noqa: F811
):
    user = make_user("ada")
    conversation = conversation_services.conversation_create(owner=user)
    question = conversation_services.turn_append_user(
        conversation=conversation, content="Remember that I'm vegetarian and allergic to peanuts."
    )
    memory_commands_apply(user=user, conversation_id=conversation.pk, turn=question)
    conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="Noted: vegetarian and no peanuts.", status=Turn.Status.COMPLETE, prompt_tokens=12,
        completion_tokens=8, pool="mini",
    )  # fmt: skip
    shots = os.environ.get("CHAT_SCREENSHOTS_DIR")
    errors: list[str] = []
    for size_name, size in SIZES.items():
        for scheme in SCHEMES:
            context = open_context(browser, size, scheme, user, live.url)
            page = page_of(context, errors)
            try:
                page.goto(f"{live.url}/c/{conversation.pk}/")
                notice = page.locator("[data-memory-update]")
                expect(notice).to_contain_text("Memory updated")
                expect(notice.get_by_role("button", name="Undo")).to_be_visible()
                got = page.evaluate(LAYOUT_PROBE)
                assert got["scrollWidth"] <= got["innerWidth"], (size_name, scheme, got)
                if shots:
                    Path(shots).mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=Path(shots) / f"memory-updated-{size_name}-{scheme}.png")
            finally:
                context.close()

    context = open_context(browser, SIZES["phone"], "light", user, live.url)
    page = page_of(context, errors)
    page.goto(f"{live.url}/c/{conversation.pk}/")
    page.locator("[data-memory-update]").get_by_role("button", name="Undo").click()
    expect(page.locator("[data-memory-update]")).to_have_text("Memory update undone.")
    context.close()
    assert not UserMemory.objects.filter(user=user).exists()
    assert errors == []
