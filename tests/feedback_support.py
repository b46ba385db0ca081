"""Helpers for the feedback tests (tests/test_feedback*.py): an answered conversation, the rating
URLs, signed-in and Bearer-key requests that rate an answer, the stored ratings, and the rating
buttons read from a page."""

from __future__ import annotations

import html as html_module
import json
import uuid
from html.parser import HTMLParser

from django.test import Client

from accounts import services as account_services
from conversations import services
from feedback.models import Feedback

HTMX = {"HX-Request": "true"}


def answered(owner, *, pool="mini", version="smollm2-135m-1", content="Paris.", org=None):
    """A new conversation of ``owner`` with one question and its stored answer."""
    conversation = services.conversation_create(owner=owner, org=org)
    question = services.turn_append_user(conversation=conversation, content="Capital of France?")
    answer = services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=content, status="complete", prompt_tokens=12, completion_tokens=3,
        pool=pool, model_version=version,
    )  # fmt: skip
    return conversation, question, answer


def page_url(conversation, turn) -> str:
    return f"/c/{conversation.pk}/turns/{turn.turn_id}/feedback"


def api_url(conversation, turn) -> str:
    return f"/v1/conversations/{conversation.pk}/turns/{turn.turn_id}/feedback"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def rate(client, conversation, turn, rating="up", comment=None, htmx=True):
    data = {"rating": rating}
    if comment is not None:
        data["comment"] = comment
    return client.post(page_url(conversation, turn), data, headers=HTMX if htmx else {})


def bearer(user) -> dict:
    issued = account_services.api_key_create(user=user, name="tests")
    return {"Authorization": f"Bearer {issued.raw}"}


def api_rate(user_or_headers, conversation, turn, body, content_type="application/json"):
    headers = user_or_headers if isinstance(user_or_headers, dict) else bearer(user_or_headers)
    data = json.dumps(body) if content_type == "application/json" else body
    return Client().post(api_url(conversation, turn), data, content_type=content_type, headers=headers)


def text(response) -> str:
    """The response body with HTML entities decoded (messages are autoescaped)."""
    return html_module.unescape(response.content.decode())


def rows() -> list[tuple]:
    return list(Feedback.objects.order_by("created_at").values_list("user__username", "turn_id", "rating", "comment"))


class _Buttons(HTMLParser):
    """The rating forms of a page: answer turn id -> {"up"/"down": aria-pressed, "comment"}."""

    def __init__(self):
        super().__init__()
        self.forms: dict[str, dict] = {}
        self._form = None
        self._textarea = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and "data-feedback" in attrs:
            answer_id = attrs["hx-post"].rstrip("/").split("/")[-2]
            self._form = self.forms.setdefault(answer_id, {"comment": None})
        elif self._form is not None and tag == "button" and attrs.get("class") in ("feedback-up", "feedback-down"):
            self._form[attrs["value"]] = attrs["aria-pressed"]
        elif self._form is not None and tag == "textarea" and attrs.get("name") == "comment":
            self._textarea = True
            self._form["comment"] = ""

    def handle_data(self, data):
        if self._textarea:
            self._form["comment"] += data

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = False
        if tag == "form":
            self._form = None


def buttons(html: str) -> dict[str, dict]:
    parser = _Buttons()
    parser.feed(html)
    return parser.forms
