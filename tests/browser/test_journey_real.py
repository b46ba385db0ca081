"""Issue 18's journey with the real model, on a phone (390x844, dark scheme): the chat page as a
new user meets it. The behaviours one at a time, with the engine double, are in
test_layout_ui.py, test_menus_ui.py, test_chat_render.py and test_chat_ui.py; this module runs
them in one go against the real vLLM engine (shared with the rest of the session, ``live``)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation, Turn
from conversations.services import title_from_message
from core.rendering import markdown_to_safe_html
from tests.browser.chat_ui_support import (  # noqa: F401
    ANSWER,
    TIMEOUT_MS,
    active_content,
    assert_scripts_loaded,
    browser,
    send,
)
from tests.browser.layout_support import PHONE
from tests.browser.test_versions_ui import QUESTION_VERSION
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.real_engine]

CAP = 24  # tokens per answer: the first answer is cut off, Continue goes on
PROMPT = "Write a long story about a dragon who learns to bake bread."
EDITED = "Write a long story about a cat who learns to sail."


def visible_text(page) -> str:
    return page.locator(f"{ANSWER} .bubble").inner_text()


def words(text: str) -> str:
    return re.sub(r"[\W_]+", "", text)


def test_phone_journey_with_the_real_model_cut_off_continue_branch_dark_and_sign_out(
    live, make_user, browser, settings  # noqa: F811
):
    """Given a user on a 390x844 phone in the dark scheme and the real model with a 24-token
    answer budget, when they sign in, send a message with Enter, watch it stream, see it cut off
    and press Continue, then: the answer streams as rendered text (no script-capable markup),
    says "Cut off at 24 tokens." with a Continue button, Continue streams onto the end of the
    same answer (one answer, its text a continuation of the cut-off one, the note gone), the
    page never scrolls sideways, the stored turns are a cut-off answer and a continuation whose
    render is what the page shows; editing the question starts a branch (2/2, its own answer)
    and `<` brings back the continued answer, which a reload keeps; the drawer lists the
    conversation by its title, the page is dark, and Sign out in the account menu signs them
    out."""
    settings.CHAT_MAX_TOKENS = CAP
    make_user("journey")
    context = browser.new_context(viewport=PHONE, color_scheme="dark")
    context.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{live.url}/accounts/login/")
        page.fill("input[name=username]", "journey")
        page.fill("input[name=password]", PASSWORD)
        page.click("main.auth button[type=submit]")
        page.wait_for_url(f"{live.url}/")
        assert_scripts_loaded(page)
        dark = page.evaluate(
            "() => { const m = getComputedStyle(document.body).backgroundColor.match(/\\d+/g)"
            ".map(Number); return (0.2126*m[0] + 0.7152*m[1] + 0.0722*m[2]) / 255 < 0.3; }"
        )
        assert dark, "the page follows prefers-color-scheme: dark"

        send(page, PROMPT)

        page.wait_for_selector(f"{ANSWER}.streaming")
        cut = page.locator(f"{ANSWER}.complete [data-cut-off]")
        expect(cut).to_have_text(f"Cut off at {CAP} tokens.", timeout=60_000)
        assert active_content(page) == []
        first = visible_text(page)
        assert first.strip()
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

        page.locator(f"{ANSWER} button.continue").click()

        expect(page.locator(f"{ANSWER}.complete")).to_have_count(1, timeout=60_000)
        expect(page.locator(ANSWER)).to_have_count(1)
        expect(page.locator(f"{ANSWER} [data-cut-off]")).to_have_count(0, timeout=60_000)
        page.wait_for_function(
            "(sel) => { const a = document.querySelector(sel);"
            " return a && !a.classList.contains('streaming') && a.classList.contains('complete'); }",
            arg=ANSWER,
            timeout=60_000,
        )
        whole = visible_text(page)
        assert words(whole).startswith(words(first)) and len(words(whole)) > len(words(first))
        assert active_content(page) == []

        conversation = Conversation.objects.get(owner__username="journey")
        answers = list(
            Turn.objects.filter(conversation=conversation, role=Turn.Role.ASSISTANT).order_by("created_at")
        )
        assert len(answers) == 2, [a.status for a in answers]
        cut_off, continuation = answers
        assert continuation.continues_id == cut_off.turn_id
        assert cut_off.token_count == CAP and cut_off.finish_reason == "length"
        # What the page shows is the continuation's stored text, rendered by the server.
        stored_text = page.evaluate(
            "(h) => { const d = document.createElement('div'); d.innerHTML = h;"
            " document.body.appendChild(d); const t = d.innerText; d.remove(); return t; }",
            markdown_to_safe_html(continuation.content),
        )
        assert words(whole) == words(stored_text)

        page.reload()
        expect(page.locator(ANSWER)).to_have_count(1)
        assert words(visible_text(page)) == words(whole)
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

        # Edit the question: a branch with its own answer; the old one is a click (and a
        # reload) away.
        exchange = page.locator("#messages .exchange").first
        exchange.locator("details.edit summary").click()
        exchange.locator("details.edit textarea").fill(EDITED)
        with page.expect_response(lambda r: r.url.endswith("/edit")) as edited:
            exchange.locator("details.edit button[type=submit]").click()
        assert edited.value.status == 200
        expect(page.locator(f"{ANSWER}.complete")).to_have_count(1, timeout=60_000)
        expect(page.locator(QUESTION_VERSION)).to_have_text("2/2")
        expect(page.locator("#messages article.user > .bubble")).to_have_text(EDITED)
        assert words(visible_text(page)) != words(whole)
        page.click("#messages article.user .question-versions button.version-prev")
        expect(page.locator(QUESTION_VERSION)).to_have_text("1/2")
        page.reload()
        expect(page.locator(QUESTION_VERSION)).to_have_text("1/2")
        assert words(visible_text(page)) == words(whole)

        page.locator("#sidebar-toggle").click()
        expect(page.locator("nav.sidebar li.current a.row-link")).to_have_text(title_from_message(PROMPT))
        page.keyboard.press("Escape")

        menu = page.locator(".topbar details.account-menu")
        menu.locator("summary").click()
        menu.get_by_role("button", name="Sign out").click()
        page.wait_for_load_state()
        page.goto(f"{live.url}/")
        assert page.url.startswith(f"{live.url}/accounts/login/")
    finally:
        context.close()
    assert errors == [], f"uncaught JavaScript errors: {errors}"
