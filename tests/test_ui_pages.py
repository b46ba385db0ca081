"""The page chrome (issue 18 parts 1, 8, 9): the stored colour scheme, the error pages, the
account menu, the settings navigation, icons and the tab title, without a browser."""

from __future__ import annotations

import re
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.test import Client, RequestFactory

from accounts import services as account_services
from accounts.models import Theme
from chatsite import error_pages
from chatsite.icons import PATHS, icon_svg
from conversations import services as conversation_services

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}
EMOJI = re.compile("[\U0001f300-\U0001faff\u2600-\u27bf]")


def signed_in(make_user, username: str = "tess", **fields) -> tuple[Client, object]:
    user = make_user(username, **fields)
    client = Client()
    client.force_login(user)
    return client, user


# --- the colour scheme ---------------------------------------------------------------------


def test_theme_set_stores_each_scheme_on_the_user(make_user):
    """Given a user on the default (system) scheme, when the service stores dark, then light,
    then the user row holds each in turn."""
    user = make_user("theo")
    assert user.theme == Theme.SYSTEM

    account_services.user_theme_set(user=user, theme="dark")
    user.refresh_from_db()
    assert user.theme == "dark"

    account_services.user_theme_set(user=user, theme="light")
    user.refresh_from_db()
    assert user.theme == "light"


def test_theme_set_refuses_an_unknown_scheme(make_user):
    """Given a user, when the service is asked for a scheme that is not system/light/dark,
    then it raises ValidationError and the stored scheme stays."""
    user = make_user("theo")
    with pytest.raises(ValidationError):
        account_services.user_theme_set(user=user, theme="purple")
    user.refresh_from_db()
    assert user.theme == Theme.SYSTEM


def test_theme_post_stores_the_scheme_and_every_page_renders_it_on_html(make_user):
    """Given a signed-in user, when they post theme=dark from the settings page, then they are
    sent back there and the next page's <html> carries data-theme="dark" (so it is drawn dark
    from the first paint)."""
    client, user = signed_in(make_user)

    response = client.post("/settings/theme", {"theme": "dark", "next": "/settings/"})

    assert response.status_code == 302 and response["Location"] == "/settings/"
    user.refresh_from_db()
    assert user.theme == "dark"
    page = client.get("/usage/").content.decode()
    assert '<html lang="en" data-theme="dark">' in page


def test_theme_post_over_htmx_answers_204_with_the_theme_changed_event(make_user):
    """Given a signed-in user, when the account menu posts theme=light with htmx, then the
    answer is 204 with HX-Trigger theme-changed {theme: light}, and the scheme is stored."""
    client, user = signed_in(make_user)

    response = client.post("/settings/theme", {"theme": "light"}, headers=HTMX)

    assert response.status_code == 204
    assert response["HX-Trigger"] == '{"theme-changed": {"theme": "light"}}'
    user.refresh_from_db()
    assert user.theme == "light"


def test_theme_post_never_redirects_off_site(make_user):
    """Given a signed-in user, when the post's next is another site, then it goes to the chat."""
    client, _ = signed_in(make_user)
    response = client.post("/settings/theme", {"theme": "dark", "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/"


def test_theme_post_with_an_unknown_scheme_is_400(make_user):
    """Given a signed-in user, when they post theme=purple, then 400 and nothing is stored."""
    client, user = signed_in(make_user)
    response = client.post("/settings/theme", {"theme": "purple"})
    assert response.status_code == 400
    user.refresh_from_db()
    assert user.theme == Theme.SYSTEM


def test_theme_post_needs_a_signed_in_user():
    """Given no session, when the theme is posted, then it redirects to sign-in."""
    response = Client().post("/settings/theme", {"theme": "dark"})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_signed_out_pages_follow_the_system_scheme():
    """Given no session, when the sign-in page is rendered, then <html> says system."""
    page = Client().get("/accounts/login/").content.decode()
    assert '<html lang="en" data-theme="system">' in page


# --- error pages ---------------------------------------------------------------------------


def test_unknown_path_gets_the_styled_404_with_a_way_back(make_user):
    """Given a signed-in user, when they open a path that does not exist, then the answer is
    404 with the site's page: a heading, a link back to the chats and the account menu."""
    client, _ = signed_in(make_user)
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'id="error-page"' in page and "Nothing here" in page
    assert 'id="error-back" href="/"' in page
    assert 'class="account-menu account"' in page


def test_a_missing_conversation_gets_the_styled_404(make_user):
    """Given a signed-in user, when they open a conversation id that is not theirs, then 404
    with the site's page, not Django's bare "Not Found"."""
    client, _ = signed_in(make_user)
    response = client.get("/c/00000000-0000-0000-0000-000000000000/")
    assert response.status_code == 404
    assert 'id="error-page"' in response.content.decode()


def test_unknown_v1_path_keeps_the_json_error_shape():
    """Given an API client, when it calls an unknown /v1 path, then 404 in the JSON shape."""
    response = Client().get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_403_page_says_why_and_offers_a_way_back(rf: RequestFactory, make_user):
    """Given a PermissionDenied with a message, when the 403 handler renders it, then the page
    is 403, shows the message and links back to the chats."""
    from django.contrib.auth.models import AnonymousUser  # noqa: PLC0415
    from django.core.exceptions import PermissionDenied  # noqa: PLC0415

    request = rf.get("/orgs/acme/members/")
    request.user = make_user("rhea")
    response = error_pages.permission_denied(request, PermissionDenied("Only owners may."))
    assert response.status_code == 403
    page = response.content.decode()
    assert "Only owners may." in page and 'id="error-back"' in page

    request.user = AnonymousUser()
    response = error_pages.permission_denied(request, PermissionDenied())
    assert response.status_code == 403 and "Sign in" in response.content.decode()


def test_500_page_renders_without_the_request_or_the_database(rf: RequestFactory):
    """Given a request whose user cannot be loaded (as when the database is down), when the 500
    handler renders, then it gives the styled 500 page without touching the user."""

    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError("database is down")

    request = rf.get("/c/whatever/")
    request.user = Exploding()
    response = error_pages.server_error(request)
    assert response.status_code == 500
    page = response.content.decode()
    assert 'id="error-page"' in page and "Something went wrong" in page and 'href="/"' in page


def test_an_error_page_that_cannot_render_falls_back_to_a_plain_one(rf: RequestFactory):
    """Given a request whose user raises when read (the database is down), when the 404
    handler renders its page (which reads the user for the account menu), then it still
    answers 404, with the plain page and its link back, instead of raising."""

    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError("database is down")

    request = rf.get("/nowhere/")
    request.user = Exploding()
    response = error_pages.page_not_found(request, None)
    assert response.status_code == 404
    assert b'<a href="/">Back to your chats</a>' in response.content


def test_v1_500_is_json(rf: RequestFactory):
    """Given an API path, when the 500 handler answers, then it is the JSON error shape."""
    response = error_pages.server_error(rf.get("/v1/chat/completions"))
    assert response.status_code == 500 and b'"server_error"' in response.content


# --- chrome on the pages -------------------------------------------------------------------


def test_chat_page_has_the_account_menu_with_every_account_link_and_sign_out(make_user):
    """Given a signed-in user, when they open the chat, then the account menu lists settings,
    usage, memory, API keys and organisations, and sign out is a POST form."""
    client, _ = signed_in(make_user)
    page = client.get("/").content.decode()
    menu = page[page.index('class="account-menu account"'):]
    menu = menu[: menu.index("</details>")]
    for href in ("/settings/", "/usage/", "/settings/memory/", "/settings/api-keys/", "/orgs/"):
        assert f'href="{href}"' in menu, href
    assert re.search(r'<form class="sign-out" method="post" action="/accounts/logout/">', menu)
    assert 'id="sidebar-toggle" aria-controls="drawer"' in page


@pytest.mark.parametrize(
    "path",
    ["/settings/", "/usage/", "/settings/memory/", "/settings/api-keys/", "/settings/sessions/",
     "/settings/data/", "/orgs/", "/settings/shared-links/"],
)
def test_every_settings_page_has_the_one_settings_navigation(make_user, path):
    """Given a signed-in user, when they open any settings page (the API keys page included),
    then it carries the settings navigation with its own entry marked current."""
    client, _ = signed_in(make_user)
    response = client.get(path)
    assert response.status_code == 200, path
    page = response.content.decode()
    assert page.count('<nav class="usage-nav" aria-label="Settings">') == 1, path
    assert 'aria-current="page"' in page, path


def test_feedback_buttons_are_svg_icons_not_emoji(make_user):
    """Given an answered conversation, when its page renders, then the thumbs are inline SVG
    icons and no control label is an emoji glyph."""
    client, user = signed_in(make_user)
    conversation = conversation_services.conversation_create(owner=user, title="Thumbs")
    question = conversation_services.turn_append_user(conversation=conversation, content="hi")
    conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="hello", status="complete", prompt_tokens=3, completion_tokens=1, pool="mini",
    )  # fmt: skip
    page = client.get(f"/c/{conversation.conversation_id}/").content.decode()
    assert "icon-thumbs-up" in page and "icon-thumbs-down" in page
    assert EMOJI.findall(page) == []


def test_icons_are_inline_svg_without_inline_style():
    """Every icon is an aria-hidden inline <svg> drawn in currentColor with no style=
    attribute (the Content-Security-Policy forbids inline style); an unknown name raises."""
    for name in PATHS:
        svg = str(icon_svg(name))
        assert svg.startswith("<svg ") and 'aria-hidden="true"' in svg and "currentColor" in svg
        assert "style=" not in svg
    with pytest.raises(KeyError):
        icon_svg("no-such-icon")


def test_rename_over_htmx_sends_the_new_tab_title(make_user):
    """Given a conversation, when it is renamed from the chat header (htmx), then the answer
    carries a <title> with the new name (htmx sets the tab title from it) beside the sidebar."""
    client, user = signed_in(make_user)
    conversation = conversation_services.conversation_create(owner=user, title="Old name")
    response = client.post(
        f"/c/{conversation.conversation_id}/rename", {"title": "Trip to Oslo"}, headers=HTMX
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.startswith("<title>Trip to Oslo</title>")
    assert "conversation-list" in html


def test_pages_load_only_the_scripts_they_use(make_user):
    """Given a signed-in user, the chat page loads the SSE extension and chat.js; a settings
    page loads neither (only htmx and the chrome's layout.js); the sign-in page, which has no
    account menu, not layout.js either."""
    sign_in = Client().get("/accounts/login/").content.decode()
    assert "/static/chat/layout.js" not in sign_in and "/static/chat/chat.js" not in sign_in
    client, _ = signed_in(make_user)
    chat = client.get("/").content.decode()
    settings_page = client.get("/settings/").content.decode()
    for page in (chat, settings_page):
        assert "/static/chat/layout.js" in page and "/static/vendor/htmx-2.0.11.min.js" in page
    assert "/static/chat/chat.js" in chat and "htmx-ext-sse" in chat
    assert "/static/chat/chat.js" not in settings_page and "htmx-ext-sse" not in settings_page


def test_collapsed_sidebar_is_drawn_collapsed_from_the_cookie(make_user):
    """Given the sidebar cookie says collapsed, when the chat renders, then the layout carries
    sidebar-collapsed and the button says aria-expanded=false (no flash of the sidebar)."""
    client, _ = signed_in(make_user)
    client.cookies["sidebar"] = "collapsed"
    page = client.get("/").content.decode()
    assert 'class="layout sidebar-collapsed"' in page
    assert 'aria-expanded="false" aria-label="Conversation list"' in page
