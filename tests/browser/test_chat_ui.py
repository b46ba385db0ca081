"""The chat page in a real browser: headless Debian Chromium driven by Playwright (sync API),
against daphne serving the real app in this process (``live``), with the real vLLM engine or
the scripted engine double (``engine_double``, requested after ``live``): the whole journey,
the keys, hostile model output (PF-X1), empty messages and a reload mid-answer. Answers split
across network chunks (PF-S2): test_chat_ui_chunks.py. Fixtures and helpers:
tests/browser/chat_ui_support.py.

Chromium comes from Debian's ``chromium`` package (``make browser``); nothing is downloaded.
"""

from __future__ import annotations

import re
import time

import pytest
from django.conf import settings as django_settings
from playwright.sync_api import expect

from conversations.models import Conversation, Turn
from conversations.services import title_from_message
from tests.browser.chat_ui_support import (  # noqa: F401 - fixtures
    ANSWER,
    COMPOSER_BOX,
    HOSTILE_DELTAS,
    STREAM_TEXT,
    active_content,
    assert_scripts_loaded,
    browser,
    new_page,
    send,
    stream_state,
    ui_login,
)
from tests.conftest import PASSWORD

pytestmark = pytest.mark.browser


# --- 1. the whole journey with the real model --------------------------------------------


@pytest.mark.real_engine
def test_signup_send_watch_stream_stop_and_reload_shows_history(live, new_page, settings):
    """Given a new visitor and the real model, when they sign up through the form, send a
    message with Enter, watch the answer stream in and press Stop mid-answer, then the answer
    says "Stopped.", the engine has no unfinished request within 1 s, and after a reload the
    history shows the message and the partial answer, and the sidebar lists the conversation
    titled from the first message."""
    settings.CHAT_MAX_TOKENS = 400
    baseline = live.unfinished()
    page = new_page()
    prompt = "Write a very long story about a dragon and a knight."

    page.goto(f"{live.url}/accounts/signup/")
    page.fill("input[name=username]", "walter")
    page.fill("input[name=password1]", PASSWORD)
    page.fill("input[name=password2]", PASSWORD)
    page.click("main.auth button[type=submit]")
    page.wait_for_url(f"{live.url}/")
    assert_scripts_loaded(page)
    expect(page.locator(".account")).to_contain_text("walter")

    send(page, prompt)

    # The answer streams in: its text grows at least twice while it is still being written.
    page.wait_for_selector(STREAM_TEXT)
    lengths: list[int] = []
    deadline = time.monotonic() + 60
    while True:
        state = stream_state(page)
        assert state is not None
        text, streaming = state
        assert streaming, f"the answer finished before it was seen growing twice: {lengths}"
        if text and (not lengths or len(text) > lengths[-1]):
            lengths.append(len(text))
        if len(lengths) >= 3:
            break
        assert time.monotonic() < deadline, f"the answer did not grow: {lengths}"
        time.sleep(0.02)
    seen = text
    assert live.unfinished() == baseline + 1

    clicked = time.monotonic()
    page.click(f"{ANSWER} button.stop")
    while live.unfinished() > baseline and time.monotonic() - clicked < 1.0:
        time.sleep(0.02)
    assert live.unfinished() == baseline, "the engine still runs the request 1 s after Stop"

    expect(page.locator(f"{ANSWER} [data-stream-note]")).to_have_text("Stopped.")
    expect(page.locator(ANSWER)).to_have_class(re.compile(r"\bcancelled\b"))
    expect(page.locator(f"{ANSWER} button.stop")).to_have_count(0)
    conversation = Conversation.objects.get(owner__username="walter")
    assert page.url == f"{live.url}/c/{conversation.conversation_id}/"  # pushed by htmx
    stored = Turn.objects.get(conversation=conversation, role=Turn.Role.ASSISTANT)
    assert stored.status == Turn.Status.CANCELLED and stored.content.strip()

    page.reload()

    expect(page.locator("#messages article.user .bubble")).to_have_text(prompt)
    answer = page.locator("#messages article.assistant.cancelled")
    expect(answer).to_have_count(1)
    expect(answer.locator(".note")).to_have_text("Stopped.")
    # What streamed (rendered live as Markdown) is the start of the stored answer's render,
    # up to its last word (a word or a Markdown mark may still have been growing).
    rendered = answer.locator(".bubble").inner_text()
    shown = seen.rsplit(None, 1)[0] if len(seen.split()) > 1 else ""
    assert rendered.strip() and letters(rendered).startswith(letters(shown)), (seen, rendered)
    expect(page.locator("#sidebar li.current a.row-link")).to_have_text(title_from_message(prompt))
    assert page.locator("#sidebar li.current a.row-link").get_attribute("href") == (
        f"/c/{conversation.conversation_id}/"
    )



def letters(text: str) -> str:
    """``text`` without whitespace and punctuation, to compare rendered texts by their words."""
    return re.sub(r"[\W_]+", "", text)

# --- 2. keys ------------------------------------------------------------------------------


def test_shift_enter_inserts_newline_and_enter_sends(live, engine_double, make_user, new_page):
    """Given the chat page, when the user presses Shift+Enter in the message box, a newline is
    inserted and nothing is sent; when they then press Enter, the two-line message is sent and
    answered."""
    make_user("sam")
    page = new_page()
    ui_login(page, live.url, "sam")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    page.click(COMPOSER_BOX)
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    page.wait_for_timeout(500)  # a send would have gone out by now

    assert page.input_value(COMPOSER_BOX) == "line one\nline two"
    assert posts == []
    assert engine_double.requests == []
    expect(page.locator("#messages article.user")).to_have_count(0)

    page.keyboard.press("Enter")

    expect(page.locator("#messages article.user .bubble")).to_have_text("line one\nline two")
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("Hello, world.")
    assert len(posts) == 1 and posts[0].endswith("/chat/turns")
    assert len(engine_double.requests) == 1
    assert page.input_value(COMPOSER_BOX) == ""


# --- 3. PF-X1 -----------------------------------------------------------------------------


HOSTILE_MESSAGE = 'Hi <img src=x onerror="window.__pwned=5"> there'


def test_pf_x1_hostile_model_output_and_title_never_run_in_the_browser(
    live, engine_double, make_user, new_page
):
    """PF-X1: given a model whose output carries a <script>, an onerror <img>, a javascript:
    link and an onload <svg> (each split over deltas), and a first message with an onerror
    <img> (so also the sidebar title), then while streaming, after the answer is finished and
    after a reload no script ran, no script-capable element or javascript: link is in the
    messages or the sidebar, and the session cookie is HttpOnly."""
    engine_double.scripts.append([*HOSTILE_DELTAS[:-1], 0.6, HOSTILE_DELTAS[-1]])
    make_user("mallory")
    page = new_page()
    ui_login(page, live.url, "mallory")

    send(page, HOSTILE_MESSAGE)

    # While streaming (the pause before the last delta): the text is there, rendered as
    # Markdown and inert (tests/browser/test_chat_render.py has the live render's own case).
    page.wait_for_function(
        "(sel) => { const t = document.querySelector(sel);"
        " return t && t.textContent.includes('__pwned=4'); }",
        arg=STREAM_TEXT,
    )
    assert active_content(page) == []
    assert stream_state(page)[1], "the answer should still be streaming"

    # Finished: the server's sanitised HTML replaced the streamed text.
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    page.wait_for_timeout(500)  # time for any onerror/onload to fire
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert active_content(page) == []
    expect(page.locator("#messages article.user .bubble")).to_have_text(HOSTILE_MESSAGE)
    expect(page.locator("#sidebar li.current a.row-link")).to_have_text(HOSTILE_MESSAGE)

    page.reload()
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    page.wait_for_timeout(500)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert active_content(page) == []
    expect(page.locator("#messages article.user .bubble")).to_have_text(HOSTILE_MESSAGE)
    expect(page.locator("#sidebar li.current a.row-link")).to_have_text(HOSTILE_MESSAGE)
    assert page.title() == HOSTILE_MESSAGE  # <title> holds it as text

    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies[django_settings.SESSION_COOKIE_NAME]
    assert session["httpOnly"] is True
    assert django_settings.SESSION_COOKIE_NAME not in page.evaluate("document.cookie")


# --- 5. empty messages --------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "   \n\t  "], ids=["empty", "whitespace"])
def test_empty_message_shows_error_above_box_and_sends_nothing(
    live, engine_double, make_user, new_page, content
):
    """Given the chat page, when the user sends an empty or whitespace-only message, a
    readable error appears above the message box and nothing is sent: no turn, no
    conversation, no engine request."""
    make_user("erin")
    page = new_page()
    ui_login(page, live.url, "erin")

    send(page, content)

    expect(page.locator("#composer-error")).to_have_text(re.compile(r"Type a message"))
    page.wait_for_timeout(300)
    assert engine_double.requests == []
    assert not Conversation.objects.filter(owner__username="erin").exists()
    expect(page.locator("#messages article")).to_have_count(0)
    assert page.url == f"{live.url}/"

    # The error goes away once a real message is sent.
    send(page, "hello")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator("#composer-error")).to_have_text("")


def test_reload_mid_answer_shows_what_was_generated_and_continues_live(live, engine_double, make_user, new_page, settings):
    """A reload in the middle of an answer is not a stop (DESIGN.md's disconnect rule): the page
    shows the text already generated and the rest streams in live; the answer completes."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 30
    engine_double.scripts = [["one ", 1.5, "two ", 1.0, "three"]]
    make_user("rita")
    page = new_page()
    ui_login(page, live.url, "rita")
    send(page, "count slowly")
    expect(page.locator(f"{ANSWER} [data-stream-text]")).to_have_text("one ")
    page.reload()
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("one two three", timeout=10_000)
    assert engine_double.aborted == {}
    assert len(engine_double.requests) == 1
