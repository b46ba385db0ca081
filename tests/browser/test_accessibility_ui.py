"""Accessibility (issue 18 part 13): axe-core on every page at 1280x800 and 390x844, in the
light and the dark scheme, with the scripted engine double (no model runs).

axe-core comes from the npm registry, pinned in the root package-lock.json and installed by
``make test`` (``npm ci``) into node_modules/, outside static/: it is never served to users.
The test reads ``node_modules/axe-core/axe.min.js`` and evaluates it in each page after it has
loaded (Playwright's evaluate is not bound by the page's CSP). One browser for the module
(test_chat_ui.py's fixture); each size and scheme is one browser context and each page is
loaded once in it. A control page with an unlabelled input must report a violation, so the
check can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.browser.test_chat_ui import browser  # noqa: F401 - fixture
from tests.browser.test_layout_ui import SCHEMES, SIZES, World, open_context, page_of

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
