"""Accessibility (issue 18 part 13): axe-core on every page at 1280x800 and 390x844, in the
light and the dark scheme, with the scripted engine double (no model runs).

axe-core comes from the npm registry, pinned in the root package-lock.json and installed by
``make test`` (``npm ci``) into node_modules/, outside static/: it is never served to users.
The test reads ``node_modules/axe-core/axe.min.js`` and evaluates it in each page after it has
loaded (Playwright's evaluate is not bound by the page's CSP). One browser for the module
(chat_ui_support.py's fixture); each size and scheme is one browser context and each page is
loaded once in it. A control page with an unlabelled input must report a violation, so the
check can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.browser.chat_ui_support import ANSWER, browser, new_page, send, ui_login  # noqa: F401 - fixtures
from tests.browser.layout_support import SCHEMES, SIZES, World, open_context, page_of
from tests.browser.test_composer_focus_ui import FOCUS_TO_TOP

pytestmark = pytest.mark.browser

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING = ("serious", "critical")  # axe's impact levels this project does not ship with


@pytest.fixture(scope="module")
def axe_source() -> str:
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `make test` (it runs `npm ci` at the repository root)")
    return AXE.read_text()


def axe_violations(page: Page, source: str) -> list[dict]:
    """axe-core's violations on ``page`` as it is now, each ``{"id", "impact", "help",
    "targets"}`` (targets: CSS selectors of the first few failing nodes)."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(source)
    return page.evaluate(
        """async () => {
            const result = await axe.run(document, {resultTypes: ['violations']});
            return result.violations.map((v) => ({
                id: v.id, impact: v.impact, help: v.help,
                targets: v.nodes.slice(0, 4).map((n) => n.target.join(' ')),
            }));
        }"""
    )


def blocking(violations: list[dict]) -> list[dict]:
    return [v for v in violations if v["impact"] in BLOCKING]


def test_axe_reports_the_unlabelled_input_of_a_control_page(browser, axe_source):  # noqa: F811
    """The check can fail: a page whose only control is an input with no label has a critical
    ``label`` violation."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_content(
            '<!doctype html><html lang="en"><head><title>Control</title></head>'
            '<body><main><h1>Control</h1><input type="text" name="q"></main></body></html>'
        )
        found = blocking(axe_violations(page, axe_source))
        assert [v["id"] for v in found] == ["label"], found
    finally:
        context.close()


def test_every_page_has_no_serious_or_critical_axe_violations(
    live, engine_double, make_user, browser, axe_source  # noqa: F811
):
    """Given a user with a conversation (a wide answer with a table and code), an organisation
    and a share link, when every page (the chat with a conversation and its shortcuts dialog
    open, an empty chat, settings, usage, memory, API keys, sessions, data, shared links,
    share, organisations, members, policies, the shared page, a 404; signed out: sign-in,
    sign-up, the shared page) is checked by axe-core at 1280x800 and 390x844 in the light and
    the dark scheme, then none has a serious or critical violation."""
    world = World(make_user)
    problems: list[str] = []
    errors: list[str] = []
    for size_name, size in SIZES.items():
        for scheme in SCHEMES:
            for user, paths in ((world.user, world.signed_in_pages()), (None, world.anonymous_pages())):
                context = open_context(browser, size, scheme, user, live.url)
                page = page_of(context, errors)
                try:
                    for path in paths:
                        page.goto(f"{live.url}{path}")
                        where = f"{path} at {size_name} {scheme}{' signed out' if user is None else ''}"
                        states = [("", None)]
                        if user is not None and path.startswith("/c/") and path.count("/") == 3:
                            states.append((" with the shortcuts dialog", "#composer [data-shortcuts-open]"))
                        for state, click in states:
                            if click:
                                page.click(click)
                                page.wait_for_selector("dialog#shortcuts[open]")
                            for v in blocking(axe_violations(page, axe_source)):
                                problems.append(f"{where}{state}: {v['impact']} {v['id']} ({v['help']}): {v['targets']}")
                finally:
                    context.close()
    assert problems == [], "\n".join(problems)
    assert errors == []


# Where the focus is after each Tab: the element, whether it is after the previous one in the
# document, and whether it is drawn with a visible outline.
FOCUS_PROBE = """(previous) => {
    const el = document.activeElement;
    const style = getComputedStyle(el);
    const outlined = style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 1;
    const after = !window.__lastFocus || !!(window.__lastFocus.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING);
    window.__lastFocus = el;
    return {name: el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className ? '.' + el.className : ''),
            outlined, after, composer: el.matches('#composer textarea')};
}"""


def test_tab_moves_through_the_chat_in_document_order_with_a_visible_focus_ring(
    live, engine_double, make_user, new_page  # noqa: F811
):
    """Given a conversation's page at 1280x800, when the user presses Tab from the top, each
    stop comes after the previous one in the page (no positive tabindex reorders them), each
    is drawn with a focus outline, and the message box is reached; the first stop is "Skip to
    message box"."""
    make_user("tabitha")
    page = new_page()
    ui_login(page, live.url, "tabitha")
    send(page, "hello")
    page.locator(f"{ANSWER}.complete").wait_for()
    page.reload()
    page.locator(f"{ANSWER}.complete").wait_for()
    page.evaluate(FOCUS_TO_TOP)  # the page opens with the focus in the message box: start above it
    stops = []
    for _ in range(40):
        page.keyboard.press("Tab")
        stop = page.evaluate(FOCUS_PROBE)
        stops.append(stop)
        if stop["composer"]:
            break
    assert stops[-1]["composer"], [s["name"] for s in stops]
    assert stops[0]["name"] == "a.skip-link", [s["name"] for s in stops]
    assert [s["name"] for s in stops if not s["after"]] == []
    assert [s["name"] for s in stops if not s["outlined"]] == []


def test_the_streaming_answer_is_announced_politely(live, engine_double, make_user, new_page):  # noqa: F811
    """Given an answer being written, its text is inside an aria-live="polite" region (read
    out as it grows, without interrupting)."""
    engine_double.scripts.append(["Writing ", 3.0, "slowly."])
    make_user("polly")
    page = new_page()
    ui_login(page, live.url, "polly")
    send(page, "hello")
    page.wait_for_selector(f"{ANSWER}.streaming [data-stream-text]:has-text('Writing')")
    live_value = page.eval_on_selector(
        f"{ANSWER}.streaming [data-stream-text]",
        "el => { const r = el.closest('[aria-live]'); return r && r.getAttribute('aria-live'); }",
    )
    assert live_value == "polite"
