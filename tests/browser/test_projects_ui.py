"""Projects in a real browser (issue 30): create one from the sidebar, give it instructions,
start a chat in it from its page, see the project's name in the chat's header, and open an
answer's source in place. The scripted engine double answers; retrieval is
projects/retrieval.py, in the live server's process.

With ``CHAT_SCREENSHOTS_DIR`` set, the last test writes PNGs of the project page and a project
chat at 390x844 and 1280x800 in both schemes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from projects.models import Project
from tests.browser.chat_ui_support import TIMEOUT_MS, assert_scripts_loaded, browser  # noqa: F401
from tests.browser.layout_support import PHONE, SCHEMES, SIZES, open_context, project_world, small_touch_targets
from tests.projects_support import passage_file_add, retrieval  # noqa: F401 - fixture

pytestmark = pytest.mark.browser

LAUNCH = "The launch code for the Antares mission is tangerine-42."


def test_create_a_project_add_instructions_chat_in_it_and_open_a_source(
    live, engine_double, make_user, browser, retrieval  # noqa: F811
):
    """Given a signed-in person at 1280x800, when they press New project, name it, save its
    instructions, add a file (made directly: ingestion is another branch's) and send a message
    from the project's page, then the chat opens with the project's name in its header (a link
    back), the answer streams and lists its source, and opening the source shows the passage in
    place (no navigation); the project page then lists the chat."""
    user = make_user("pia")
    context = open_context(browser, SIZES["desktop"], "light", user, live.url)
    try:
        page = context.new_page()
        page.goto(f"{live.url}/")
        assert_scripts_loaded(page)
        page.click("#sidebar-projects a.new-project")
        page.fill("#project-name", "Antares")
        page.click("button:has-text('Create project')")
        expect(page.locator("#project-title")).to_have_value("Antares")
        project = Project.objects.get(owner=user)
        page.fill("#project-instructions-box", "Answer as a ship navigator.")
        page.click(".project-instructions button[type=submit]")
        expect(page.locator("#project-instructions-status")).to_contain_text("Saved")
        assert Project.objects.get(pk=project.pk).instructions == "Answer as a ship navigator."
        passage_file_add(project, user=user, name="mission.md", passages=[LAUNCH])

        page.fill("#project-composer textarea", "What is the launch code?")
        page.press("#project-composer textarea", "Enter")
        page.wait_for_url(f"{live.url}/c/**")
        crumb = page.locator(".chat-header a.project-crumb")
        expect(crumb).to_have_text("Antares")
        expect(crumb).to_have_attribute("href", f"/p/{project.pk}/")
        sources = page.locator("#messages article.assistant section.sources").last
        expect(sources).to_be_visible(timeout=TIMEOUT_MS)
        expect(sources.locator("summary").first).to_contain_text("mission.md")
        text = sources.locator("[data-source-text]").first
        expect(text).to_be_hidden()
        url = page.url
        sources.locator("summary").first.click()
        expect(text).to_be_visible()
        expect(text).to_contain_text("tangerine-42")
        assert page.url == url  # opened in place
        page.goto(f"{live.url}/p/{project.pk}/")
        expect(page.locator(".project-chats a.project-chat")).to_have_count(1)
    finally:
        context.close()


def test_the_project_page_and_chat_have_44px_targets_on_a_phone(live, engine_double, make_user, browser):  # noqa: F811
    """On a 390x844 touch phone the project page and a project chat with its sources open have
    no target under 44x44 CSS px, and neither scrolls sideways."""
    user = make_user("tia")
    project, chat = project_world(user)
    context = open_context(browser, PHONE, "light", user, live.url, touch=True)
    try:
        page = context.new_page()
        problems = []
        for path in (f"/p/{project.pk}/", f"/c/{chat.pk}/"):
            page.goto(f"{live.url}{path}")
            if path.startswith("/c/"):
                page.locator("section.sources summary").first.click()
            problems += [f"{path}: {t}" for t in small_touch_targets(page)]
            assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), path
        assert problems == [], "\n".join(problems)
    finally:
        context.close()


@pytest.mark.screenshots  # deselected unless CHAT_SCREENSHOTS_DIR is set (tests/conftest.py)
def test_write_project_screenshots(live, engine_double, make_user, browser):  # noqa: F811
    out = Path(os.environ["CHAT_SCREENSHOTS_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    user = make_user("sky")
    project, chat = project_world(user)
    for size_name, size in SIZES.items():
        for scheme in SCHEMES:
            context = open_context(browser, size, scheme, user, live.url)
            page = context.new_page()
            page.goto(f"{live.url}/p/{project.pk}/")
            page.screenshot(path=out / f"project-{size_name}-{scheme}.png", full_page=True)
            page.goto(f"{live.url}/c/{chat.pk}/")
            page.locator("section.sources summary").first.click()
            page.screenshot(path=out / f"project-chat-{size_name}-{scheme}.png")
            if size_name == "phone":
                page.click("#sidebar-toggle")
                page.wait_for_timeout(300)
                page.screenshot(path=out / f"project-drawer-{size_name}-{scheme}.png")
            context.close()
