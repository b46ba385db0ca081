"""Fixtures and helpers for the browser tests (tests/browser/, and the *_ui.py tests beside them):
Chromium from Debian's ``chromium`` package driven by Playwright (sync API), ``browser`` (one
per test module) and ``new_page``, signing in through the form, sending a message, reading the
streamed answer, script-capable markup on the page, and hostile model output.

Chromium comes from Debian's ``chromium`` package (``make browser``); nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.conftest import PASSWORD

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000

# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium for this module. Playwright's sync API leaves its asyncio loop marked running
    in this thread, which makes Django refuse ORM calls here (SynchronousOnlyOperation) though
    nothing in this thread is async; the flag below says so while the browser lives. Module
    scope: later test modules get a thread without that loop."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def new_page(browser):
    """``new_page()``: a page in a fresh browser context (own cookies). Uncaught page errors
    fail the test."""
    contexts = []
    errors: list[str] = []

    def make() -> Page:
        context = browser.new_context()
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        return page

    yield make
    for context in contexts:
        context.close()
    assert errors == [], f"uncaught JavaScript errors: {errors}"


# --- helpers ------------------------------------------------------------------------------

ANSWER = "#messages article.assistant"
STREAM_TEXT = f"{ANSWER} [data-stream-text]"
COMPOSER_BOX = "#composer textarea"


def assert_scripts_loaded(page: Page) -> None:
    """The page's scripts ran (htmx, its SSE extension and chat.js were served)."""
    if page.evaluate("typeof window.htmx") == "object":
        return
    statuses = page.evaluate(
        "() => Promise.all([...document.scripts].map((s) =>"
        " fetch(s.src).then((r) => `${s.getAttribute('src')}: HTTP ${r.status}`)))"
    )
    pytest.fail(f"htmx did not load, so the chat page cannot work; its scripts: {statuses}")


def ui_login(page: Page, base_url: str, username: str) -> None:
    """Sign in through the login form; lands on a new, empty chat."""
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("main.auth button[type=submit]")
    page.wait_for_url(f"{base_url}/")
    assert_scripts_loaded(page)


def send(page: Page, text: str) -> None:
    page.fill(COMPOSER_BOX, text)
    page.press(COMPOSER_BOX, "Enter")


def stream_state(page: Page) -> tuple[str, bool] | None:
    """(the streamed text so far, still streaming?) of the last answer, or None."""
    return page.evaluate(
        """(sel) => {
            const all = document.querySelectorAll(sel);
            const a = all[all.length - 1];
            if (!a) return null;
            const t = a.querySelector('[data-stream-text]') || a.querySelector('.bubble');
            return [t.textContent, a.classList.contains('streaming')];
        }""",
        ANSWER,
    )


def active_content(page: Page) -> list[str]:
    """Script-capable markup in the messages and the sidebar: script/svg/iframe/object/embed
    elements, any on* attribute, any javascript: link. The page's own icons (``<svg
    data-icon>`` outside any message bubble, chatsite/icons.py) are not model output; an
    ``<svg>`` inside a bubble counts whatever it carries."""
    return page.evaluate(
        """() => {
            const bad = [];
            for (const root of [document.getElementById('messages'),
                                document.querySelector('nav.sidebar')]) {
                for (const el of root.querySelectorAll('*')) {
                    const tag = el.tagName.toLowerCase();
                    const ownIcon = tag === 'svg' && el.hasAttribute('data-icon')
                        && !el.closest('.bubble');
                    if ((['script', 'svg', 'iframe', 'object', 'embed'].includes(tag) && !ownIcon)
                        || [...el.attributes].some((a) => a.name.toLowerCase().startsWith('on'))
                        || /^\\s*javascript:/i.test(el.getAttribute('href') || '')
                        || /^\\s*javascript:/i.test(el.getAttribute('src') || '')) {
                        bad.push(el.outerHTML.slice(0, 200));
                    }
                }
            }
            return bad;
        }"""
    )


HOSTILE_DELTAS = [
    "Sure. <scr",
    "ipt>window.__pwned=1</scr",
    "ipt>\n\n",
    "<img src=x one",
    'rror="window.__pwned=2">\n\n',
    "[x](java",
    "script:window.__pwned=3)\n\n",
    "<svg onl",
    'oad="window.__pwned=4">',
    "</svg>\n\nDone.",
]
