"""A database that cannot be reached is a 503 with Retry-After on every entrypoint, never a 500
(issue 26; core/unavailable.py, chatsite/middleware.py DatabaseUnavailableMiddleware,
chatsite/error_pages.py). The real outage (a Patroni primary killed) is
tests/integration/test_patroni_failover.py; here the errors are raised where a view meets them."""

from __future__ import annotations

import json

import pytest
from django.db import DataError, IntegrityError, OperationalError
from django.test import Client, RequestFactory

from chatsite import error_pages
from core.db_breaker import PrimaryDown
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from core.unavailable import unavailable_error

pytestmark = pytest.mark.django_db

POOL_TIMEOUT = OperationalError("couldn't get a connection after 2.00 sec")


def signed_in(make_user) -> tuple[Client, object]:
    user = make_user("ada")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client, user


def _failing(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc

    return fail


def test_a_page_whose_database_is_unreachable_gets_the_503_page(make_user, monkeypatch):
    """Given a signed-in user, when the chat page's query cannot get a connection, then the page
    is the site's own 503 page with an integer Retry-After >= 1 and a way to try again, not the
    500 page."""
    client, _ = signed_in(make_user)
    monkeypatch.setattr("conversations.selectors.conversation_list", _failing(POOL_TIMEOUT))

    response = client.get("/")

    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    page = response.content.decode()
    assert 'data-status="503"' in page and 'id="error-retry"' in page
    assert "Something went wrong" not in page


def test_a_message_sent_from_the_chat_page_while_the_primary_is_down_keeps_the_typed_text(
    make_user, monkeypatch
):
    """Given the conversation's primary down (PrimaryDown from the region's breaker), when the
    chat page sends a message (htmx), then 503 with the breaker's Retry-After, nothing swapped
    (the typed text stays in the box) and a chat:unavailable event whose message says to try
    again; nothing is stored."""
    client, _ = signed_in(make_user)
    down = PrimaryDown(region="eu-west", retry_after_s=7)
    monkeypatch.setattr(conversation_services, "conversation_create", _failing(down))

    response = client.post("/chat/turns", {"content": "hello"}, headers={"HX-Request": "true"})

    assert response.status_code == 503
    assert response["Retry-After"] == "7"
    assert response["HX-Reswap"] == "none"
    event = json.loads(response["HX-Trigger"])["chat:unavailable"]
    assert "Try again in 7 s" in event["message"]
    assert Conversation.objects.count() == 0 and Turn.objects.count() == 0


def test_a_v1_request_whose_database_is_unreachable_gets_the_json_503(make_user, monkeypatch):
    """Given an API key, when listing conversations cannot get a connection, then the API's
    JSON error: 503 ``unavailable`` with Retry-After and a message to act on."""
    from accounts.services import api_key_create  # noqa: PLC0415

    user = make_user("bo")
    key = api_key_create(user=user, name="t").raw
    monkeypatch.setattr("conversations.page_selectors.conversation_page", _failing(POOL_TIMEOUT))

    response = Client(raise_request_exception=False).get(
        "/v1/conversations", headers={"Authorization": f"Bearer {key}"}
    )

    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "unavailable" and "try again" in error["message"].lower()


def test_an_error_raised_before_any_view_is_a_503_too(rf: RequestFactory):
    """Given the database unreachable where no view can catch it (a middleware loading the
    session), when Django's 500 handler answers inside the ``except`` block, then it is the
    503 page with Retry-After (and the JSON 503 on /v1)."""
    for path, marker in (("/c/x/", b'data-status="503"'), ("/v1/conversations", b'"unavailable"')):
        try:
            raise POOL_TIMEOUT
        except OperationalError:
            response = error_pages.server_error(rf.get(path))
        assert response.status_code == 503, path
        assert int(response["Retry-After"]) >= 1
        assert marker in response.content


@pytest.mark.parametrize("exc", [IntegrityError("duplicate key"), DataError("bad value"), ValueError("x")])
def test_errors_that_are_not_an_outage_stay_errors(exc):
    """Given an error that is a bug or bad input, not an unreachable database, then it is not
    dressed up as a 503 (the 500 handler and the views' own checks answer it)."""
    assert unavailable_error(exc) is None


def test_the_breaker_refusal_keeps_its_own_retry_after_and_others_get_its_cool_down(settings):
    """Given PrimaryDown (the breaker knows when it probes again), then that refusal is used as
    it is, Retry-After included; any other unreachable-database error gets the breaker's
    cool-down (CHAT_REGION_BREAKER_OPEN_S), rounded up to whole seconds."""
    settings.CHAT_REGION_BREAKER_OPEN_S = 2.5
    down = PrimaryDown(region="us-east", retry_after_s=4)
    assert unavailable_error(down) is down
    assert unavailable_error(OperationalError("server closed the connection")).headers["Retry-After"] == "3"
