"""Feedback on answers (issue 8): thumbs up / down with an optional comment, one rating per user
and answer, only by the conversation's owner, counted per pool and model version, and exported
as ``chat_feedback_total``.

Who may rate: the conversation's owner only. Anyone else gets 404, whether or not they can read
the conversation (a workspace member reading a conversation shared with the workspace
included): a rating is the asker's judgement of the answer to their own question, and counting
readers' opinions would weigh shared conversations more in the canary signal. Anonymous
visitors are sent to sign in (the page) or get 401 (``/v1``), as on every other chat endpoint.
"""

from __future__ import annotations

import datetime as dt
import html as html_module
import json
import uuid
from html.parser import HTMLParser

import pytest
from django.template import RequestContext, Template
from django.test import Client, RequestFactory
from django.utils import timezone

from accounts import services as account_services
from accounts.models import Membership, Organisation
from core import metrics
from conversations import deletion, held, services
from conversations.models import Conversation, Turn
from feedback import selectors
from feedback.models import Feedback
from feedback.services import COMMENT_MAX_CHARS

pytestmark = pytest.mark.django_db

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


# --- rating: one per user and answer ---------------------------------------------------------


def test_rating_an_answer_stores_it_with_the_answers_pool_and_version(make_user):
    """Given an answer from mini@v1, when its owner rates it up, then one row holds the rating
    and the answer's pool and model version, in the conversation's database."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool="mini", version="v1")

    response = rate(signed_in(owner), conversation, answer, "up")

    assert response.status_code == 200
    row = Feedback.objects.get()
    assert (row.turn_id, row.user_id, row.conversation_id) == (answer.turn_id, owner.pk, conversation.pk)
    assert (row.rating, row.comment, row.pool, row.model_version) == ("up", "", "mini", "v1")


def test_rating_again_replaces_the_rating_and_the_comment(make_user):
    """Given a thumbs up with a comment, when the owner rates the same answer down with another
    comment, then there is still one row, holding the new rating and comment."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    client = signed_in(owner)
    rate(client, conversation, answer, "up", "Exactly right.")

    response = rate(client, conversation, answer, "down", "On second thought, too short.")

    assert response.status_code == 200
    assert rows() == [("ann", answer.turn_id, "down", "On second thought, too short.")]


def test_each_answer_and_each_version_gets_its_own_rating(make_user):
    """Given two answers in one conversation, when both are rated, then each has its own row."""
    owner = make_user("ann")
    conversation, _, first = answered(owner)
    question = services.turn_append_user(conversation=conversation, content="And Spain?")
    second = services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="Madrid.", status="complete", prompt_tokens=20, completion_tokens=2, pool="mini",
    )  # fmt: skip
    client = signed_in(owner)

    rate(client, conversation, first, "up")
    rate(client, conversation, second, "down")

    assert {(r[1], r[2]) for r in rows()} == {(first.turn_id, "up"), (second.turn_id, "down")}


def test_the_comment_is_optional(make_user):
    """Given no comment field at all, the rating is stored with an empty comment."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = rate(signed_in(owner), conversation, answer, "down")

    assert response.status_code == 200 and rows() == [("ann", answer.turn_id, "down", "")]


def test_a_comment_of_exactly_the_limit_is_stored(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = rate(signed_in(owner), conversation, answer, "down", "x" * COMMENT_MAX_CHARS)

    assert response.status_code == 200 and len(Feedback.objects.get().comment) == COMMENT_MAX_CHARS


def test_a_comment_over_the_limit_is_refused_and_the_earlier_rating_kept(make_user):
    """Given a stored thumbs up, when a comment one character over the limit is sent, then 400
    names the limit and the stored rating is unchanged."""
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    client = signed_in(owner)
    rate(client, conversation, answer, "up", "Good.")

    response = rate(client, conversation, answer, "down", "x" * (COMMENT_MAX_CHARS + 1))

    assert response.status_code == 400
    assert f"the limit is {COMMENT_MAX_CHARS:,}" in response.content.decode()
    assert rows() == [("ann", answer.turn_id, "up", "Good.")]


def test_a_comment_with_a_nul_character_is_refused_not_a_500(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = rate(signed_in(owner), conversation, answer, "up", "bad\x00byte")

    assert response.status_code == 400 and "NUL" in response.content.decode()
    assert rows() == []


@pytest.mark.parametrize("rating", ["", "sideways", "UP", "1"])
def test_a_rating_other_than_up_or_down_is_refused(make_user, rating):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = rate(signed_in(owner), conversation, answer, rating)

    assert response.status_code == 400
    assert 'A rating is "up"' in text(response)
    assert rows() == []


# --- who may rate, and what ------------------------------------------------------------------


def test_another_users_conversation_is_404_and_nothing_is_stored(make_user):
    owner, other = make_user("ann"), make_user("bob")
    conversation, _, answer = answered(owner)

    page = rate(signed_in(other), conversation, answer, "down", "spam")
    api = api_rate(other, conversation, answer, {"rating": "down"})

    assert page.status_code == 404 and api.status_code == 404
    assert api.json()["error"]["type"] == "not_found"
    assert rows() == []


def test_a_workspace_member_who_can_read_a_shared_conversation_cannot_rate_it(make_user):
    """Given a conversation its owner shared with their organisation's workspace, when another
    member (who may read it) rates an answer, then 404 and nothing is stored; the page does
    not show them the buttons (only the owner rates, see the module docstring)."""
    owner, reader = make_user("ann"), make_user("mia")
    org = Organisation.objects.create(name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=owner, role="owner")
    Membership.objects.create(organisation=org, user=reader, role="member")
    conversation, _, answer = answered(owner, org=org)
    Conversation.objects.filter(pk=conversation.pk).update(shared_with_org=True)

    response = rate(signed_in(reader), conversation, answer, "down")

    assert response.status_code == 404
    assert rows() == []
    assert "data-feedback" not in widget_for(reader, conversation, answer)
    assert "data-feedback" in widget_for(owner, conversation, answer)


def widget_for(user, conversation, answer) -> str:
    """The rating buttons as ``user`` would see them under ``answer`` (any page that shows it)."""
    request = RequestFactory().get("/")
    request.user = user
    template = Template("{% load feedback_tags %}{% feedback_widget conversation answer %}")
    return template.render(RequestContext(request, {"conversation": conversation, "answer": answer}))


def test_anonymous_visitors_are_sent_to_sign_in_and_api_calls_without_a_key_get_401(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    page = Client().post(page_url(conversation, answer), {"rating": "up"})
    api = Client().post(api_url(conversation, answer), json.dumps({"rating": "up"}), content_type="application/json")

    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")
    assert api.status_code == 401
    assert rows() == []


def test_the_page_refuses_a_rating_without_the_csrf_token(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)

    response = client.post(page_url(conversation, answer), {"rating": "up"})

    assert response.status_code == 403 and rows() == []


def test_rating_the_users_own_message_is_a_clear_400(make_user):
    """Given a user turn, when it is rated (page and API), then 400 says only answers can be
    rated, and nothing is stored."""
    owner = make_user("ann")
    conversation, question, _ = answered(owner)

    page = rate(signed_in(owner), conversation, question, "up")
    api = api_rate(owner, conversation, question, {"rating": "up"})

    assert page.status_code == 400 and "Only answers can be rated" in page.content.decode()
    assert api.status_code == 400 and api.json()["error"]["type"] == "invalid_request"
    assert "Only answers can be rated" in api.json()["error"]["message"]
    assert rows() == []


def test_an_unknown_turn_or_one_of_another_conversation_is_404(make_user):
    owner = make_user("ann")
    conversation, _, _ = answered(owner)
    _, _, elsewhere = answered(owner)
    unknown = Turn(turn_id=uuid.uuid4())
    client = signed_in(owner)

    assert rate(client, conversation, unknown, "up").status_code == 404
    assert rate(client, conversation, elsewhere, "up").status_code == 404
    assert api_rate(owner, conversation, unknown, {"rating": "up"}).status_code == 404
    assert rows() == []


def test_an_answer_still_held_for_write_back_can_be_rated(make_user):
    """Given an answer whose done event was sent but which is still held in Redis (not yet in
    the turn log), when it is rated, then the rating is stored with the answer's pool."""
    owner = make_user("ann")
    conversation = services.conversation_create(owner=owner)
    question = services.turn_append_user(conversation=conversation, content="Hi?")
    record = held.answer_record(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="Hello.", status="complete", prompt_tokens=5, completion_tokens=2,
        pool="frontier", model_version="v9",
    )  # fmt: skip
    held.hold(record, ttl_s=60, due=False)
    answer = Turn(turn_id=uuid.UUID(record["turn_id"]))
    try:
        response = rate(signed_in(owner), conversation, answer, "up")
    finally:
        held.release(turn_id=record["turn_id"], conversation_id=conversation.pk)

    assert response.status_code == 200
    assert Feedback.objects.filter(turn_id=answer.turn_id, pool="frontier", model_version="v9").exists()


def test_zero_retention_conversations_take_a_rating_but_no_comment(make_user):
    """Given a zero-retention organisation's conversation (no text of theirs is stored), when
    an answer is rated with a comment, then 400 says why; without one, the rating is stored."""
    owner = make_user("ann")
    org = Organisation.objects.create(name="ZDR", slug="zdr", zero_retention=True)
    Membership.objects.create(organisation=org, user=owner, role="owner")
    conversation = services.conversation_create(owner=owner, org=org)
    record = held.answer_record(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=uuid.uuid4(),
        content="Hello.", status="complete", prompt_tokens=5, completion_tokens=2, pool="mini",
        zero_retention=True,
    )  # fmt: skip
    held.hold(record, ttl_s=60, due=False)
    answer = Turn(turn_id=uuid.UUID(record["turn_id"]))
    client = signed_in(owner)
    try:
        with_comment = rate(client, conversation, answer, "down", "It said something odd.")
        without = rate(client, conversation, answer, "down")
    finally:
        held.release(turn_id=record["turn_id"], conversation_id=conversation.pk)

    assert with_comment.status_code == 400 and "keeps no conversation text" in with_comment.content.decode()
    assert without.status_code == 200
    assert rows() == [("ann", answer.turn_id, "down", "")]


def test_deleting_the_conversation_deletes_its_feedback(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    rate(signed_in(owner), conversation, answer, "up", "Nice.")

    deletion.conversation_delete(conversation=conversation)

    assert rows() == []


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


# --- the API ---------------------------------------------------------------------------------


def test_api_rates_an_answer_and_answers_200_with_the_rating(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool="frontier", version="v2")

    response = api_rate(owner, conversation, answer, {"rating": "down", "comment": "Too vague."})

    assert response.status_code == 200
    body = response.json()
    assert {k: body[k] for k in ("turn_id", "conversation_id", "rating", "comment", "pool", "model_version")} == {
        "turn_id": str(answer.turn_id), "conversation_id": str(conversation.pk), "rating": "down",
        "comment": "Too vague.", "pool": "frontier", "model_version": "v2",
    }  # fmt: skip


def test_api_posting_again_replaces_and_an_omitted_comment_clears_it(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)
    headers = bearer(owner)
    api_rate(headers, conversation, answer, {"rating": "down", "comment": "Too vague."})

    response = api_rate(headers, conversation, answer, {"rating": "up"})

    assert response.status_code == 200 and response.json()["comment"] == ""
    assert rows() == [("ann", answer.turn_id, "up", "")]


@pytest.mark.parametrize(
    ("body", "content_type", "status", "needle"),
    [
        ({"rating": "sideways"}, "application/json", 400, "rating"),
        ({"comment": "no rating"}, "application/json", 400, "rating"),
        ({"rating": "up", "stars": 5}, "application/json", 400, "stars"),
        ({"rating": "up", "comment": 5}, "application/json", 400, "comment"),
        ({"rating": "up", "comment": "x" * (COMMENT_MAX_CHARS + 1)}, "application/json", 400, "limit"),
        ({"rating": "up", "comment": "a\x00b"}, "application/json", 400, "NUL"),
        ("rating=up", "application/x-www-form-urlencoded", 415, "JSON"),
    ],
)
def test_api_bad_bodies_get_4xx_naming_the_problem_and_store_nothing(make_user, body, content_type, status, needle):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = api_rate(owner, conversation, answer, body, content_type=content_type)

    assert response.status_code == status
    assert needle in response.json()["error"]["message"]
    assert rows() == []


def test_api_other_methods_get_405(make_user):
    owner = make_user("ann")
    conversation, _, answer = answered(owner)

    response = Client().get(api_url(conversation, answer), headers=bearer(owner))

    assert response.status_code == 405 and response["Allow"] == "POST"


# --- counts per pool and model version; the metric -------------------------------------------


def test_counts_per_pool_and_version_count_each_users_current_rating(make_user):
    """Given ratings of answers from mini@v1, mini@v2 (a canary) and frontier@v1 by several
    users, one of them changed from up to down, then the counts per (pool, version) are the
    current ratings, the changed one counted once as down."""
    given = [  # (user, pool, version, ratings in order)
        ("u1", "mini", "v1", ["up"]), ("u2", "mini", "v1", ["up"]), ("u3", "mini", "v1", ["down"]),
        ("u4", "mini", "v2", ["up", "down"]), ("u5", "mini", "v2", ["down"]),
        ("u6", "frontier", "v1", ["up"]),
    ]  # fmt: skip
    for name, pool, version, ratings in given:
        owner = make_user(name)
        conversation, _, answer = answered(owner, pool=pool, version=version)
        client = signed_in(owner)
        for rating in ratings:
            assert rate(client, conversation, answer, rating).status_code == 200

    counts = {(c.pool, c.model_version): (c.up, c.down) for c in selectors.feedback_counts()}

    assert counts == {("frontier", "v1"): (1, 0), ("mini", "v1"): (2, 1), ("mini", "v2"): (0, 2)}


def test_counts_since_leave_out_older_ratings(make_user):
    owner = make_user("ann")
    for pool in ("mini", "frontier"):
        conversation, _, answer = answered(owner, pool=pool, version="v1")
        rate(signed_in(owner), conversation, answer, "up")
    Feedback.objects.filter(pool="frontier").update(updated_at=timezone.now() - dt.timedelta(days=8))

    counts = selectors.feedback_counts(since=timezone.now() - dt.timedelta(days=7))

    assert [(c.pool, c.up, c.down) for c in counts] == [("mini", 1, 0)]


def feedback_metric(pool: str, version: str, rating: str) -> float:
    return metrics.value("chat_feedback_total", pool=pool, model_version=version, rating=rating)


def test_the_metric_counts_new_and_changed_ratings_once_committed(make_user, django_capture_on_commit_callbacks):
    """Given an answer of a pool/version no other test uses, when it is rated up, up again,
    its comment edited, then rated down: up counts 1 and down 1 (a repeat or a comment edit
    counts nothing)."""
    pool, version = f"pool-{uuid.uuid4().hex[:6]}", "v-metric"
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool=pool, version=version)
    client = signed_in(owner)

    with django_capture_on_commit_callbacks(execute=True):
        rate(client, conversation, answer, "up")
    assert (feedback_metric(pool, version, "up"), feedback_metric(pool, version, "down")) == (1, 0)
    with django_capture_on_commit_callbacks(execute=True):
        rate(client, conversation, answer, "up")
        rate(client, conversation, answer, "up", "Now with a comment.")
    assert (feedback_metric(pool, version, "up"), feedback_metric(pool, version, "down")) == (1, 0)
    with django_capture_on_commit_callbacks(execute=True):
        rate(client, conversation, answer, "down", "Now with a comment.")
    assert (feedback_metric(pool, version, "up"), feedback_metric(pool, version, "down")) == (1, 1)


def test_a_refused_rating_is_not_counted(make_user, django_capture_on_commit_callbacks):
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool=pool, version="v1")

    with django_capture_on_commit_callbacks(execute=True):
        rate(signed_in(owner), conversation, answer, "up", "x" * (COMMENT_MAX_CHARS + 1))

    assert feedback_metric(pool, "v1", "up") == 0


def test_metrics_endpoint_exports_the_feedback_counter(make_user, django_capture_on_commit_callbacks):
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    owner = make_user("ann")
    conversation, _, answer = answered(owner, pool=pool, version="v7")
    with django_capture_on_commit_callbacks(execute=True):
        api_rate(owner, conversation, answer, {"rating": "down"})

    body = Client().get("/metrics").content.decode()

    assert f'chat_feedback_total{{model_version="v7",pool="{pool}",rating="down"}} 1.0' in body
