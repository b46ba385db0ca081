"""The rating buttons under an answer (issue 8), as the server renders them: the owner's rating
and comment shown, pressed states, plain form posts redirecting back or saying why they were
refused, a rating per version, and no inline script or style. In a real browser:
test_feedback_ui.py."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from tests.feedback_support import answered, buttons, rate, signed_in

pytestmark = pytest.mark.django_db


# --- the buttons -----------------------------------------------------------------------------


def test_the_conversation_page_shows_the_owners_rating_and_comment(make_user):
    """Given an answer rated down with a comment, when its owner opens the conversation, then
    the down button is pressed, the up button is not, and the comment box holds the comment,
    escaped (PF-X1: user text never becomes markup)."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    client = signed_in(owner)
    rate(client, conversation, answer, "down", "<b>wrong</b> city")

    html = client.get(f"/c/{conversation.pk}/").content.decode()

    assert buttons(html)[str(answer.turn_id)] == {"up": "false", "down": "true", "comment": "<b>wrong</b> city"}
    assert "&lt;b&gt;wrong&lt;/b&gt; city" in html


def test_an_unrated_answer_shows_both_buttons_unpressed_and_no_comment_box(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    html = signed_in(owner).get(f"/c/{conversation.pk}/").content.decode()

    assert buttons(html)[str(answer.turn_id)] == {"up": "false", "down": "false", "comment": None}


def test_rating_answers_with_the_buttons_in_their_chosen_state(make_user):
    """The htmx response is the buttons again, the chosen one pressed, with the comment box."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = rate(signed_in(owner), conversation, answer, "up")

    assert buttons(response.content.decode())[str(answer.turn_id)] == {"up": "true", "down": "false", "comment": ""}
    assert "Thanks for your feedback." in response.content.decode()


def test_a_plain_form_post_redirects_back_to_the_answer(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = rate(signed_in(owner), conversation, answer, "up", htmx=False)

    assert response.status_code == 303
    assert response["Location"] == f"/c/{conversation.pk}/#turn-{answer.turn_id}"


def test_a_refused_plain_form_post_gets_a_page_saying_why(make_user):
    owner = make_user("ann")
    conversation, question, _ = answered(owner)

    response = rate(signed_in(owner), conversation, question, "up", htmx=False)

    assert response.status_code == 400
    assert "Only answers can be rated" in response.content.decode()
    assert f'href="/c/{conversation.pk}/"' in response.content.decode()


def test_the_version_switcher_shows_the_rating_of_each_version(make_user):
    """The answer fragment (what < i/n > swaps in) carries that version's buttons and state."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    client = signed_in(owner)
    rate(client, conversation, answer, "up")

    html = client.get(f"/c/{conversation.pk}/turns/{answer.turn_id}/version").content.decode()

    assert buttons(html)[str(answer.turn_id)]["up"] == "true"


def test_the_buttons_carry_no_inline_script_or_style(make_user):
    """CSP (issue 10): no inline handlers, hx-on or style attributes in the buttons."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    html = rate(signed_in(owner), conversation, answer, "up").content.decode()

    assert inline_code(html) == []


class _Inline(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.found.append(f"<{tag}>")
        for name, _ in attrs:
            if name.startswith(("on", "hx-on")) or name == "style":
                self.found.append(f"{name} on <{tag}>")


def inline_code(html: str) -> list[str]:
    """Inline scripts, styles, event handlers and hx-on attributes in ``html``."""
    parser = _Inline()
    parser.feed(html)
    return parser.found
