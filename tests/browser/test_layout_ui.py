"""The page chrome in a real browser (issue 18 parts 1, 8, 9): every page at a phone's
390x844 and a desktop's 1280x800, in the light and the dark scheme (Chromium's
prefers-color-scheme emulation), with the scripted engine double (``engine_double``; no model
runs): no sideways scroll, touch targets of at least 44 px on a phone, the error pages and the
tab title. The drawer, the sidebar and the account menu: test_menus_ui.py. One browser for the
module (chat_ui_support.py's fixture); each size and scheme is a browser context, not a new
browser. The world, the sizes and the probes: tests/browser/layout_support.py.

``make screenshots`` runs the last test with ``CHAT_SCREENSHOTS_DIR`` set: it writes PNGs of the
main pages at both sizes in both schemes (docs/screenshots/)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation
from tests.browser.chat_ui_support import (
    ANSWER,
    assert_scripts_loaded,
    browser,  # noqa: F401 - a fixture
    send,
)
from tests.browser.layout_support import (
    DESKTOP,
    LAYOUT_PROBE,
    PHONE,
    SCHEMES,
    SIZES,
    TOUCH_MIN_PX,
    World,
    open_context,
    page_of,
    small_touch_targets,
)
from workspaces import services as workspace_services

pytestmark = pytest.mark.browser


# --- no sideways scroll, both sizes, both schemes ------------------------------------------


def test_no_page_scrolls_sideways_at_phone_and_desktop_in_light_and_dark(
    live, engine_double, make_user, browser  # noqa: F811
):
    """Given a user with a 70-character name, a long-titled conversation whose answer has a
    wide table, a long code line and an unbroken word, an organisation and a share link, when
    every page (chat, conversation, settings, usage, memory, API keys, sessions, data, shared
    links, share, organisations, members, policies, the shared page, a 404; signed out: sign-in,
    sign-up and the shared page) is opened at 390x844 and at 1280x800 in the light and the dark
    scheme, then none is wider than the window (no sideways scroll), nothing but a table or a
    code block sticks out past its right edge, the page is styled, and it is drawn dark exactly
    in the dark scheme."""
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
                        got = page.evaluate(LAYOUT_PROBE)
                        where = f"{path} at {size_name} {scheme}{' signed out' if user is None else ''}"
                        if got["scrollWidth"] > got["innerWidth"]:
                            problems.append(f"{where}: {got['scrollWidth']}px wide in {got['innerWidth']}px")
                        if got["mainOverflow"] > 1:
                            problems.append(f"{where}: <main> overflows by {got['mainOverflow']}px")
                        if got["wide"]:
                            problems.append(f"{where}: past the right edge: {got['wide']}")
                        if not got["styled"]:
                            problems.append(f"{where}: the stylesheet did not apply")
                        if got["dark"] != (scheme == "dark"):
                            problems.append(f"{where}: drawn {'dark' if got['dark'] else 'light'}")
                finally:
                    context.close()
    assert problems == [], "\n".join(problems)
    assert errors == []


# --- touch targets on a phone --------------------------------------------------------------


def test_small_touch_target_probe_finds_a_small_button(browser):  # noqa: F811
    """The count can fail: a 30x20 button is reported, a 44x44 one, a link in a sentence and a
    hidden button are not."""
    context = browser.new_context(viewport=PHONE, has_touch=True, is_mobile=True)
    try:
        page = context.new_page()
        page.set_content(
            '<!doctype html><html lang="en"><body><p>Read <a href="/x">the terms</a> first.</p>'
            '<button id="small">s</button><button id="big">b</button><button hidden>h</button>'
            "</body></html>"
        )
        page.evaluate(
            "() => { const s = document.getElementById('small').style; s.width = '30px'; s.height = '20px';"
            " const b = document.getElementById('big').style; b.width = '44px'; b.height = '44px'; }"
        )
        found = small_touch_targets(page)
        assert len(found) == 1 and found[0].startswith("button. 's' 30x20"), found
    finally:
        context.close()


def test_every_touch_target_is_at_least_44px_on_a_phone(live, engine_double, make_user, browser):  # noqa: F811
    """Given the long-named user's world on a 390x844 touch phone (has_touch, is_mobile:
    ``pointer: coarse``), when each signed-in page (the chat, a conversation, settings, usage,
    memory, API keys, sessions, data, shared links, share, organisations and their pages, the
    shared page, a 404) is opened, and on the conversation the drawer, a chat's row menu, the
    header's menu and the account menu are opened, then no target is under 44x44 CSS px
    (WCAG 2.5.5)."""
    world = World(make_user)
    problems: list[str] = []
    context = open_context(browser, PHONE, "light", world.user, live.url, touch=True)
    try:
        page = context.new_page()
        for path in world.signed_in_pages():
            page.goto(f"{live.url}{path}")
            problems += [f"{path}: {t}" for t in small_touch_targets(page)]
        page.goto(f"{live.url}/c/{world.conversation.pk}/")
        assert_scripts_loaded(page)
        opened = [("account menu", "details.account-menu > summary"), ("header menu", "[data-header-menu-button]")]
        for state, click in opened:
            page.click(click)
            page.wait_for_timeout(100)
            problems += [f"chat with the {state} open: {t}" for t in small_touch_targets(page)]
            page.keyboard.press("Escape")
        page.click("#sidebar-toggle")
        page.wait_for_function("document.querySelector('nav.sidebar').getBoundingClientRect().left >= 0")
        problems += [f"chat with the drawer open: {t}" for t in small_touch_targets(page)]
        page.locator("#sidebar [data-row-menu-button]").first.click()
        expect(page.locator("#sidebar [role=menu]").first).to_be_visible()
        problems += [f"chat with a row menu open: {t}" for t in small_touch_targets(page)]
    finally:
        context.close()
    print(f"touch targets under {TOUCH_MIN_PX}px: {len(problems)}")
    assert problems == [], f"{len(problems)} targets under {TOUCH_MIN_PX}x{TOUCH_MIN_PX} px:\n" + "\n".join(problems)


# --- error pages and the tab title -------------------------------------------------------


def test_error_pages_are_styled_and_lead_back_to_the_chats(live, engine_double, make_user, browser):  # noqa: F811
    """Given a signed-in user, when they open an unknown path, a conversation that is not
    theirs, and an organisation page their role may not see, then each is the site's styled
    page (a card, the account menu) with a link back; following the 404's link lands on the
    chat."""
    owner = make_user("owen")
    member = make_user("mina")
    org = workspace_services.organisation_create(creator=owner, name="Closed shop")
    org.membership_set.create(user=member, role="member")
    context = open_context(browser, DESKTOP, user=member, url=live.url)
    try:
        page = context.new_page()
        for path, status, back in [
            ("/no/such/page/", 404, "#error-back"),
            (f"/c/{uuid.uuid4()}/", 404, "#error-back"),
            (f"/orgs/{org.slug}/policies/", 403, "main a[href='/']"),
        ]:
            response = page.goto(f"{live.url}{path}")
            assert response.status == status, path
            card = page.locator("main.auth")
            expect(card).to_be_visible()
            radius = card.evaluate("(el) => getComputedStyle(el).borderTopLeftRadius")
            assert radius != "0px", f"{path}: the card is not styled"
            expect(page.locator("details.account-menu")).to_be_visible()
            expect(page.locator(back).first).to_be_visible()
            assert "Not Found" not in page.content()

        page.goto(f"{live.url}/no/such/page/")
        page.click("#error-back")
        page.wait_for_url(f"{live.url}/")
        expect(page.locator("#composer textarea")).to_be_visible()
    finally:
        context.close()


def test_tab_title_follows_the_first_message_and_a_rename(live, engine_double, make_user, browser):  # noqa: F811
    """Given a new chat (tab title "New chat"), when the first message is sent, then the tab
    takes the conversation's automatic title; when the conversation is renamed in its header,
    then the tab takes the new name, without a reload."""
    user = make_user("tilda")
    context = open_context(browser, DESKTOP, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")
        assert_scripts_loaded(page)
        assert page.title() == "New chat"

        send(page, "Plan a weekend in Lisbon")
        expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
        title = Conversation.objects.get(owner=user).title
        assert title and title != "New chat"
        expect(page).to_have_title(title)

        page.fill(".chat-header .rename input", "Lisbon trip")
        page.click(".chat-header .rename button[type=submit]")
        expect(page).to_have_title("Lisbon trip")
    finally:
        context.close()


# --- make screenshots ----------------------------------------------------------------------


@pytest.mark.screenshots
def test_write_screenshots(live, engine_double, make_user, browser):  # noqa: F811
    """``make screenshots``: PNGs of the main pages at 390x844 and 1280x800 in both schemes
    into ``CHAT_SCREENSHOTS_DIR`` (docs/screenshots/), named page-size-scheme.png."""
    out = Path(os.environ["CHAT_SCREENSHOTS_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    world = World(make_user)
    c = world.conversation.pk
    pages = {
        "chat": f"/c/{c}/", "settings": "/settings/", "usage": "/usage/",
        "api-keys": "/settings/api-keys/", "org": f"/orgs/{world.org.slug}/",
        "org-policies": f"/orgs/{world.org.slug}/policies/",
        "org-moderation": f"/orgs/{world.org.slug}/moderation/",
        "org-review": f"/orgs/{world.org.slug}/moderation/review/", "404": "/no/such/page/",
        "data": "/settings/data/", "share": f"/c/{c}/share/", "shared-links": "/settings/shared-links/",
        "project": f"/p/{world.project.pk}/", "project-chat": f"/c/{world.project_chat.pk}/",
    }  # fmt: skip
    written = []
    for size_name, size in SIZES.items():
        for scheme in SCHEMES:
            context = open_context(browser, size, scheme, world.user, live.url)
            page = context.new_page()
            for name, path in pages.items():
                page.goto(f"{live.url}{path}")
                page.screenshot(path=out / f"{name}-{size_name}-{scheme}.png")
                written.append(name)
            page.goto(f"{live.url}/c/{c}/")
            if size_name == "phone":
                page.click("#sidebar-toggle")
                page.wait_for_timeout(300)
                page.screenshot(path=out / f"drawer-{size_name}-{scheme}.png")
            if size_name == "phone":
                page.goto(f"{live.url}/c/{c}/")
                page.click("[data-header-menu-button]")
                page.wait_for_timeout(200)
                page.screenshot(path=out / f"header-menu-{size_name}-{scheme}.png")
            page.goto(f"{live.url}/c/{c}/")
            page.click("#messages article.user details.edit summary")
            page.screenshot(path=out / f"edit-{size_name}-{scheme}.png")
            page.goto(f"{live.url}/")
            page.click("details.account-menu summary")
            page.screenshot(path=out / f"menu-{size_name}-{scheme}.png")
            context.close()
            anonymous = open_context(browser, size, scheme)
            page = anonymous.new_page()
            for name, path in (
                ("sign-in", "/accounts/login/"), ("sign-up", "/accounts/signup/"),
                ("shared", f"/s/{world.link.token}/"),
            ):
                page.goto(f"{live.url}{path}")
                page.screenshot(path=out / f"{name}-{size_name}-{scheme}.png")
            anonymous.close()
    assert written
