"""The layout tests' world and probes (tests/browser/test_layout_ui.py and the browser tests
that check pages at both sizes): the phone and desktop sizes and the two schemes, a user with
every kind of page to open (and a project's), signed-in browser contexts, the layout probe, and
the touch-target probe (WCAG 2.5.5)."""

from __future__ import annotations

import uuid

from django.test import Client
from playwright.sync_api import Browser, Page

from accounts.models import User
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from moderation.services import withdrawn_answer_keep
from sharing import services as sharing_services
from tests.browser.chat_ui_support import TIMEOUT_MS
from workspaces import services as workspace_services

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
