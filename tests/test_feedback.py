"""Feedback on answers (issue 8): thumbs up / down with an optional comment, one rating per user
and answer, only by the conversation's owner, on the page and through ``/v1``. The buttons:
test_feedback_buttons.py; counts per pool and model version and ``chat_feedback_total``:
test_feedback_counts.py.

Who may rate: the conversation's owner only. Anyone else gets 404, whether or not they can read
the conversation (a workspace member reading a conversation shared with the workspace
included): a rating is the asker's judgement of the answer to their own question, and counting
readers' opinions would weigh shared conversations more in the canary signal. Anonymous
visitors are sent to sign in (the page) or get 401 (``/v1``), as on every other chat endpoint.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.template import RequestContext, Template
from django.test import Client, RequestFactory

from accounts.models import Membership, Organisation
from conversations import deletion, held, services
from conversations.models import Conversation, Turn
from feedback.models import Feedback
from feedback.services import COMMENT_MAX_CHARS
from tests.feedback_support import (
    answered,
    api_rate,
    api_url,
    bearer,
    page_url,
    rate,
    rows,
    signed_in,
    text,
)

pytestmark = pytest.mark.django_db


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
