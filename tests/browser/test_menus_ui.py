"""The drawer, the collapsible sidebar and the account menu in a real browser (issue 18), with
the scripted engine double: the drawer opens from the menu button and closes with Esc and the
scrim, the desktop sidebar stays collapsed after a reload, signing out from the account menu on
a phone, and the dark toggle. One browser for the module (chat_ui_support.py's fixture).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.chat_ui_support import (
    assert_scripts_loaded,
    browser,  # noqa: F401 - a fixture
)
from tests.browser.layout_support import DESKTOP, LAYOUT_PROBE, LONG_NAME, PHONE, open_context
from tests.conftest import PASSWORD

pytestmark = pytest.mark.browser


# --- the drawer and the collapsible sidebar ----------------------------------------------


def test_drawer_opens_from_the_menu_button_and_closes_with_esc_and_the_scrim(
    live, engine_double, make_user, browser  # noqa: F811
):
    """Given the chat at 390x844, the conversation list is off-canvas and the menu button says
    aria-expanded=false; when it is pressed, the drawer shows, the button says true and focus
    is inside the drawer; Esc closes it and focus returns to the button; opened again, a tap on
    the dimmed page beside it closes it."""
    user = make_user("dora")
    context = open_context(browser, PHONE, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")
        assert_scripts_loaded(page)
        toggle = page.locator("#sidebar-toggle")
        drawer = page.locator("nav.sidebar")
        expect(toggle).to_have_attribute("aria-expanded", "false")
        expect(drawer).to_be_hidden()

        toggle.click()
        expect(drawer).to_be_visible()
        expect(toggle).to_have_attribute("aria-expanded", "true")
        assert page.evaluate("!!document.activeElement.closest('[data-drawer]')")
        # Slid fully in (after its 0.2 s transition), inside the window.
        page.wait_for_function("document.querySelector('nav.sidebar').getBoundingClientRect().left >= 0")
        box = drawer.bounding_box()
        assert box["x"] + box["width"] <= PHONE["width"]
        assert page.evaluate("document.querySelector('main.chat').inert")  # Tab stays in it

        page.keyboard.press("Escape")
        expect(drawer).to_be_hidden()
        expect(toggle).to_have_attribute("aria-expanded", "false")
        assert page.evaluate("document.activeElement.id") == "sidebar-toggle"

        toggle.click()
        expect(drawer).to_be_visible()
        page.mouse.click(PHONE["width"] - 10, PHONE["height"] // 2)  # the scrim, beside it
        expect(drawer).to_be_hidden()
        expect(toggle).to_have_attribute("aria-expanded", "false")
    finally:
        context.close()


def test_desktop_sidebar_collapses_and_stays_collapsed_after_reload(
    live, engine_double, make_user, browser  # noqa: F811
):
    """Given the chat at 1280x800 with the sidebar shown (aria-expanded=true), when the button
    is pressed the sidebar is gone and the chat column takes the width; after a reload it is
    still collapsed; pressed again, it is back."""
    user = make_user("colin")
    context = open_context(browser, DESKTOP, user=user, url=live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")
        assert_scripts_loaded(page)
        toggle = page.locator("#sidebar-toggle")
        expect(page.locator("nav.sidebar")).to_be_visible()
        expect(toggle).to_have_attribute("aria-expanded", "true")

        toggle.click()
        expect(page.locator("nav.sidebar")).to_be_hidden()
        expect(toggle).to_have_attribute("aria-expanded", "false")
        assert page.locator("main.chat").bounding_box()["width"] == DESKTOP["width"]

        page.reload()
        expect(page.locator("nav.sidebar")).to_be_hidden()
        expect(page.locator("#sidebar-toggle")).to_have_attribute("aria-expanded", "false")

        page.locator("#sidebar-toggle").click()
        expect(page.locator("nav.sidebar")).to_be_visible()
    finally:
        context.close()


# --- the account menu --------------------------------------------------------------------


def test_sign_out_from_the_account_menu_on_a_phone(live, engine_double, make_user, browser):  # noqa: F811
    """Given a user with a 70-character name signed in on a 390x844 phone, when they open the
    account menu from the chat's top bar, then every account link and Sign out show inside the
    window; when they press Sign out, they are signed out: the chat sends them to sign in."""
    make_user(LONG_NAME)
    context = open_context(browser, PHONE)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/accounts/login/")
        page.fill("input[name=username]", LONG_NAME)
        page.fill("input[name=password]", PASSWORD)
        page.click("main.auth button[type=submit]")
        page.wait_for_url(f"{live.url}/")
        menu = page.locator(".topbar details.account-menu")
        sign_out = menu.get_by_role("button", name="Sign out")
        expect(sign_out).to_be_hidden()

        menu.locator("summary").click()

        for name in ("Settings", "Usage", "Memory", "API keys", "Organisations"):
            link = menu.get_by_role("link", name=name)
            expect(link).to_be_visible()
            box = link.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], name
        expect(sign_out).to_be_visible()
        box = sign_out.bounding_box()
        assert box["x"] + box["width"] <= PHONE["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

        sign_out.click()
        page.wait_for_load_state()
        page.goto(f"{live.url}/")
        assert page.url.startswith(f"{live.url}/accounts/login/")
    finally:
        context.close()


def test_dark_toggle_sticks_after_reload_and_system_follows_the_device(
    live, engine_double, make_user, browser  # noqa: F811
):
    """Given a user on a device in the light scheme, when they pick Dark in the account menu,
    then the page turns dark at once, the choice is stored on the user, and after a reload (and
    on another page) it is still dark; when they pick System, the page follows the device
    (light) again."""
    user = make_user("darla")
    context = open_context(browser, DESKTOP, "light", user, live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/settings/")
        assert_scripts_loaded(page)
        assert page.evaluate(LAYOUT_PROBE)["dark"] is False

        page.locator("details.account-menu summary").click()
        page.locator(".theme-pick button[value=dark]").click()

        expect(page.locator("html")).to_have_attribute("data-theme", "dark")
        page.wait_for_function("() => getComputedStyle(document.body).backgroundColor !== 'rgb(247, 247, 248)'")
        assert page.evaluate(LAYOUT_PROBE)["dark"] is True
        user.refresh_from_db()
        assert user.theme == "dark"

        page.reload()
        assert page.evaluate(LAYOUT_PROBE)["dark"] is True
        page.goto(f"{live.url}/")
        assert page.evaluate(LAYOUT_PROBE)["dark"] is True
        expect(page.locator(".theme-pick button[value=dark]")).to_have_attribute("aria-pressed", "true")

        page.locator("details.account-menu summary").click()
        page.locator(".theme-pick button[value=system]").click()
        expect(page.locator("html")).to_have_attribute("data-theme", "system")
        page.reload()
        assert page.evaluate(LAYOUT_PROBE)["dark"] is False
    finally:
        context.close()
