"""The page chrome in a real browser (issue 18 parts 1, 8, 9): every page at a phone's
390x844 and a desktop's 1280x800, in the light and the dark scheme (Chromium's
prefers-color-scheme emulation), with the scripted engine double (``engine_double``; no model
runs). One browser for the module (test_chat_ui.py's fixture); each size and scheme is a
browser context, not a new browser.

``make screenshots`` runs the last test with ``CHAT_SCREENSHOTS_DIR`` set: it writes PNGs of the
main pages at both sizes in both schemes (docs/screenshots/)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from django.test import Client
from playwright.sync_api import Browser, Page, expect

from accounts.models import User
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from moderation.services import withdrawn_answer_keep
from sharing import services as sharing_services
from tests.browser.test_chat_ui import (  # noqa: F401
    ANSWER,
    TIMEOUT_MS,
    assert_scripts_loaded,
    browser,
    send,
)
from tests.conftest import PASSWORD
from workspaces import services as workspace_services

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
SIZES = {"phone": PHONE, "desktop": DESKTOP}
SCHEMES = ("light", "dark")
LONG_NAME = "maximiliana_von_hohenzollern_sigmaringen_" + "x" * 30
LONG_TITLE = "A very long conversation title that goes on and on " * 3
LONG_ANSWER = (
    "Here is a table and some code.\n\n"
    "| column one | column two | column three | column four | column five | column six |\n"
    "|---|---|---|---|---|---|\n"
    "| a long cell value | another long cell value | more | more still | and more | the end |\n\n"
    "```python\n"
    "def a_function_with_a_long_line(): return 'x' * 1000  # " + "y" * 120 + "\n"
    "```\n\n"
    "An unbroken word: " + "supercalifragilistic" * 8 + "\n\n"
    "A link: https://example.com/" + "very-long-path-segment/" * 8
)


# --- the world ---------------------------------------------------------------------------


class World:
    """A user with a long name, a conversation with a long title and a wide answer, an
    organisation they own and a share link: every page of the list below has content."""

    def __init__(self, make_user):
        self.user: User = make_user(LONG_NAME)
        conversation = conversation_services.conversation_create(owner=self.user)
        question = conversation_services.turn_append_user(
            conversation=conversation, content="Show me a wide table and some long code, please."
        )
        conversation_services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
            content=LONG_ANSWER, status=Turn.Status.COMPLETE, prompt_tokens=12,
            completion_tokens=120, pool="mini",
        )  # fmt: skip
        conversation_services.conversation_rename(conversation=conversation, title=LONG_TITLE)
        self.conversation: Conversation = conversation
        self.org = workspace_services.organisation_create(
            creator=self.user, name="Acme Research and Development Laboratories International",
            slug="acme-research",
        )
        self.link = sharing_services.share_link_create(conversation=conversation, user=self.user)
        # An answer the output gate withdrew, for the organisation's review page (issue 28).
        withdrawn_answer_keep(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), owner_id=self.user.pk,
            org_id=self.org.pk, text=LONG_ANSWER, window=LONG_ANSWER[:400],
            verdict={"flagged": True, "categories": ["indiscriminate_weapons"],
                     "scores": {"indiscriminate_weapons": 0.93}, "gate": "output"},
            zero_retention=False,
        )  # fmt: skip

        self.project, self.project_chat = project_world(self.user)

    def signed_in_pages(self) -> list[str]:
        c, slug = self.conversation.pk, self.org.slug
        return [
            "/", f"/c/{c}/", "/settings/", "/usage/", "/settings/memory/", "/settings/api-keys/",
            "/settings/sessions/", "/settings/data/", "/settings/shared-links/", f"/c/{c}/share/",
            "/orgs/", f"/orgs/{slug}/", f"/orgs/{slug}/members/", f"/orgs/{slug}/policies/",
            f"/orgs/{slug}/moderation/", f"/orgs/{slug}/moderation/review/",
            f"/s/{self.link.token}/", "/no/such/page/",
            "/projects/new", f"/p/{self.project.pk}/", f"/c/{self.project_chat.pk}/",
        ]  # fmt: skip

    def anonymous_pages(self) -> list[str]:
        return ["/accounts/login/", "/accounts/signup/", f"/s/{self.link.token}/"]


def project_world(user: User):
    """A project of ``user`` with a long name, instructions, files in each state (one with a
    long name, one with why it failed) and a chat whose answer lists two sources (issue 30)."""
    from projects import services as project_services  # noqa: PLC0415
    from projects.models import ProjectFile, ProjectTurnSource  # noqa: PLC0415

    project = project_services.project_create(
        owner=user, name="Antares mission planning and the long name of a project " * 2,
        instructions="Answer as a ship navigator. " * 12,
    )  # fmt: skip
    for name, status, error in (
        ("mission-briefing-with-a-very-long-file-name-" + "x" * 40 + ".md", "ready", ""),
        ("crew.pdf", "pending", ""),
        ("scanned.pdf", "failed", "This PDF has no text layer (it is a scan); add a text version of it."),
    ):
        ProjectFile.objects.create(
            project=project, uploaded_by=user, name=name, kind="markdown", size=100, sha256="0" * 64,
            storage_name=f"{project.pk}/{name}", status=status, error=error, pages=3 if status == "ready" else None,
        )  # fmt: skip
    chat = conversation_services.conversation_create(owner=user, project=project, title="Launch windows")
    question = conversation_services.turn_append_user(conversation=chat, content="When is the launch window?")
    answer = conversation_services.turn_append_assistant(
        conversation_id=chat.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="The window opens at 04:10 UTC.", status=Turn.Status.COMPLETE, prompt_tokens=40,
        completion_tokens=9, pool="mini",
    )  # fmt: skip
    for position, text in enumerate((
        "The launch window for Antares opens at 04:10 UTC and closes at 04:42 UTC. " * 3,
        "Unbrokenpassage" * 12,
    )):
        ProjectTurnSource.objects.create(
            conversation=chat, answer_id=answer.turn_id, question_id=question.turn_id, position=position,
            file_name="mission-briefing-with-a-very-long-file-name-" + "x" * 40 + ".md",
            start=0, end=len(text), text=text, similarity=0.8,
        )  # fmt: skip
    return project, chat


def session_cookie(user: User, url: str) -> dict:
    client = Client()
    client.force_login(user)
    return {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": url}


def open_context(
    browser: Browser, size: dict, scheme: str = "light", user: User | None = None, url: str = "",  # noqa: F811
    touch: bool = False,
):
    """A browser context at ``size`` (CSS px) in ``scheme``, signed in as ``user`` when given;
    ``touch``: a phone's touch screen (has_touch, is_mobile: CSS ``pointer: coarse``)."""
    context = browser.new_context(viewport=size, color_scheme=scheme, has_touch=touch, is_mobile=touch)
    context.set_default_timeout(TIMEOUT_MS)
    if user is not None:
        context.add_cookies([session_cookie(user, url)])
    return context


def page_of(context, errors: list[str]) -> Page:
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page


# What the checks read from a page: sideways overflow of the document and of the main column,
# and whether the page is drawn dark (the body's background luminance).
LAYOUT_PROBE = """() => {
    const doc = document.documentElement;
    const main = document.querySelector('main');
    const rgb = getComputedStyle(document.body).backgroundColor.match(/\\d+/g).map(Number);
    const luminance = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255;
    const wide = [...document.querySelectorAll('body *')].filter((el) => {
        const r = el.getBoundingClientRect();
        return r.width > 0 && r.right > innerWidth + 1 && getComputedStyle(el).position !== 'fixed'
            && !el.closest('.keys, pre, .usage-nav, table, [data-drawer]');
    }).slice(0, 3).map((el) => el.tagName.toLowerCase() + '.' + el.className);
    return {
        scrollWidth: doc.scrollWidth, innerWidth: innerWidth,
        mainOverflow: main ? main.scrollWidth - main.clientWidth : 0,
        dark: luminance < 0.3, wide: wide,
        styled: getComputedStyle(document.body).margin === '0px',
    };
}"""


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

# WCAG 2.5.5 (Target Size, AAA): a pointer target is at least 44 by 44 CSS px, unless it is a
# link inside a sentence ("inline"). What a finger can hit here: links, buttons, summaries and
# form controls that are drawn (not hidden, not inside a closed menu or the closed drawer, not
# a visually hidden 1 px input operated through its labelled button); a checkbox or radio
# counts its <label> when that is bigger. Each too-small one: "tag.class 'name' WxH".
TOUCH_MIN_PX = 44
SMALL_TARGETS = """(min) => {
    const sel = 'a[href], button, summary, select, textarea, input:not([type=hidden]), [role=button], [role=menuitem]';
    const small = [];
    for (const el of document.querySelectorAll(sel)) {
        if (!el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
        if (el.closest('[inert]')) continue;
        let r = el.getBoundingClientRect();
        if (r.width <= 1 || r.height <= 1) continue;            // visually hidden
        if (r.right <= 0 || r.bottom <= 0) continue;            // parked off-screen (skip link)
        if (el.matches('input[type=checkbox], input[type=radio]')) {
            const label = el.closest('label') || (el.id && document.querySelector(`label[for="${el.id}"]`));
            if (label) { const l = label.getBoundingClientRect(); if (l.width * l.height > r.width * r.height) r = l; }
        }
        if (el.matches('a') && getComputedStyle(el).display === 'inline') {
            const block = el.parentElement;                     // a link inside a sentence
            if (block && block.textContent.trim().length > el.textContent.trim().length) continue;
        }
        if (r.width + 0.5 < min || r.height + 0.5 < min) {
            const name = (el.getAttribute('aria-label') || el.textContent || el.value || '').trim().slice(0, 24);
            small.push(`${el.tagName.toLowerCase()}.${el.className} '${name}' ${Math.round(r.width)}x${Math.round(r.height)}`);
        }
    }
    return small;
}"""


def small_touch_targets(page: Page) -> list[str]:
    """The targets on ``page`` as drawn now that are under 44x44 CSS px (``SMALL_TARGETS``)."""
    return page.evaluate(SMALL_TARGETS, TOUCH_MIN_PX)


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
