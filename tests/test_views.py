"""Chat pages with the scripted engine double: sign-in and sign-up, escaping, the full history
on reload, compression, refused messages, rename and delete, the first message's page and the
CSRF failure page. The event stream: test_views_stream.py; Stop and disconnects:
test_views_stop.py."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from conversations import services, turnstream
from conversations.models import Conversation, Turn
from tests.chat_support import HTMX, events_url_of, post_message, read_stream, signed_in

pytestmark = pytest.mark.django_db(transaction=True)


# --- pages and auth -------------------------------------------------------------------------


def test_anonymous_visitor_is_sent_to_sign_in():
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_sign_up_creates_a_free_user_and_signs_in(django_user_model):
    client = Client()
    response = client.post(
        "/accounts/signup/",
        {"username": "newbie", "password1": "A-long-pass-phrase-9", "password2": "A-long-pass-phrase-9"},
    )
    assert response.status_code == 302
    user = django_user_model.objects.get(username="newbie")
    assert user.tier == "free"
    assert client.get("/").status_code == 200


def test_session_cookie_is_httponly(make_user):
    """PF-X1: scripts in the page can never read the session cookie."""
    make_user("carol")
    client = Client()
    client.post("/accounts/login/", {"username": "carol", "password": "correct-horse-battery-staple-42"})
    assert client.cookies["sessionid"]["httponly"]


def test_sidebar_and_page_escape_titles_and_messages(make_user):
    """PF-X1: a hostile first message is shown as text, in the sidebar and in the thread."""
    user = make_user()
    conversation = services.conversation_create(owner=user)
    services.turn_append_user(conversation=conversation, content='<img src=x onerror="alert(1)">')
    client = Client()
    client.force_login(user)
    html = client.get(f"/c/{conversation.pk}/").content.decode()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html


def test_reload_shows_the_full_history(make_user):
    user = make_user()
    conversation = services.conversation_create(owner=user)
    q = services.turn_append_user(conversation=conversation, content="What is **2+2**?")
    services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
        content="It is **4**.", status=Turn.Status.COMPLETE, prompt_tokens=5, completion_tokens=4,
    )  # fmt: skip
    client = Client()
    client.force_login(user)
    html = client.get(f"/c/{conversation.pk}/").content.decode()
    assert "What is **2+2**?" in html  # the user's text, verbatim
    assert "It is <strong>4</strong>." in html  # the answer, rendered
    assert "sse-connect" not in html  # answered: nothing to stream


def test_pages_compress_but_event_streams_never_do(make_user):
    """PF-S3 (unit half): the gzip middleware skips text/event-stream."""
    from django.http import HttpResponse, StreamingHttpResponse
    from django.test import RequestFactory

    from chatsite.middleware import GZipExceptEventStreamMiddleware

    request = RequestFactory().get("/", headers={"Accept-Encoding": "gzip"})
    page = GZipExceptEventStreamMiddleware(lambda r: HttpResponse("x" * 500))(request)
    stream = GZipExceptEventStreamMiddleware(
        lambda r: StreamingHttpResponse(iter([b"data: 1\n\n"]), content_type="text/event-stream")
    )(request)
    assert page["Content-Encoding"] == "gzip"
    assert not stream.has_header("Content-Encoding")


def test_zip_downloads_are_not_compressed_again_and_keep_their_length():
    """A data export (.zip) is already compressed: gzip would drop its Content-Length."""
    from django.http import HttpResponse
    from django.test import RequestFactory

    from chatsite.middleware import GZipExceptEventStreamMiddleware

    request = RequestFactory().get("/", headers={"Accept-Encoding": "gzip"})
    archive = HttpResponse(b"PK\x03\x04" + b"x" * 500, content_type="application/zip")
    archive["Content-Length"] = "504"
    response = GZipExceptEventStreamMiddleware(lambda r: archive)(request)
    assert not response.has_header("Content-Encoding")
    assert response["Content-Length"] == "504"


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "    ", "\n\n"])
async def test_empty_message_is_refused_and_nothing_stored(make_user, engine_double, content):
    client, _ = await signed_in(make_user)
    response = await post_message(client, content)
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#composer-error"
    assert "Type a message" in response.content.decode()
    assert not await Conversation.objects.aexists()
    assert not await Turn.objects.aexists()
    assert engine_double.requests == []


async def test_over_long_message_is_refused_with_the_limit(make_user, engine_double, settings):
    settings.CHAT_MAX_MESSAGE_CHARS = 100
    client, _ = await signed_in(make_user)
    response = await post_message(client, "x" * 101)
    assert response.status_code == 400
    assert "limit is 100" in response.content.decode()
    assert not await Turn.objects.aexists()


async def test_someone_elses_conversation_is_not_found(make_user, engine_double):
    owner = await sync_to_async(make_user)("owner")
    conversation = await sync_to_async(services.conversation_create)(owner=owner)
    question = await sync_to_async(services.turn_append_user)(conversation=conversation, content="private")
    intruder, _ = await signed_in(make_user, "intruder")
    base = f"/c/{conversation.pk}"
    assert (await intruder.get(f"{base}/")).status_code == 404
    assert (await post_message(intruder, "hi", conversation.pk)).status_code == 404
    assert (await intruder.get(f"{base}/turns/{question.turn_id}/events")).status_code == 404
    assert (await intruder.post(f"{base}/turns/{question.turn_id}/stop")).status_code == 404
    assert (await intruder.post(f"{base}/rename", {"title": "mine"})).status_code == 404
    assert (await intruder.post(f"{base}/delete")).status_code == 404
    assert await Turn.objects.acount() == 1
    assert engine_double.requests == []


async def test_malformed_ids_are_not_found(make_user):
    client, _ = await signed_in(make_user)
    assert (await client.get("/c/not-a-uuid/")).status_code == 404
    assert (await client.post("/c/123/turns", {"content": "hi"})).status_code == 404


async def test_send_endpoint_only_accepts_post(make_user):
    client, _ = await signed_in(make_user)
    response = await client.get("/chat/turns")
    assert response.status_code == 405
    assert not await Turn.objects.aexists()


async def test_second_message_while_answering_gets_409(make_user, engine_double):
    engine_double.scripts = [["slow", 5.0, "answer"]]
    client, _ = await signed_in(make_user)
    first = await post_message(client, "first")
    conversation_id = events_url_of(first).split("/")[2]
    second = await post_message(client, "second", conversation_id)
    assert second.status_code == 409
    assert "still being written" in second.content.decode()
    assert await Turn.objects.filter(role="user").acount() == 1
    turnstream.stream_for_conversation(uuid.UUID(conversation_id)).stop()


# --- rename / delete ------------------------------------------------------------------------


def test_rename_updates_the_sidebar(make_user):
    user = make_user()
    conversation = services.conversation_create(owner=user, title="old")
    client = Client()
    client.force_login(user)
    response = client.post(f"/c/{conversation.pk}/rename", {"title": "Trip <b>plans</b>"}, headers=HTMX)
    assert response.status_code == 200
    assert "Trip &lt;b&gt;plans&lt;/b&gt;" in response.content.decode()
    conversation.refresh_from_db()
    assert conversation.title == "Trip <b>plans</b>"


def test_an_empty_rename_shows_its_message_beside_the_title_and_keeps_the_sidebar(make_user):
    """A blank title is refused with a message; htmx is told to put it beside the title box
    (HX-Retarget), not into the sidebar the form normally refreshes, and nothing changes."""
    user = make_user()
    conversation = services.conversation_create(owner=user, title="old")
    client = Client()
    client.force_login(user)
    response = client.post(f"/c/{conversation.pk}/rename", {"title": "   "}, headers=HTMX)
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#rename-error"
    assert "empty" in response.content.decode()
    page = client.get(f"/c/{conversation.pk}/").content.decode()
    assert 'id="rename-error"' in page
    conversation.refresh_from_db()
    assert conversation.title == "old"


def test_delete_removes_conversation_and_goes_home(make_user):
    user = make_user()
    conversation = services.conversation_create(owner=user)
    services.turn_append_user(conversation=conversation, content="bye")
    client = Client()
    client.force_login(user)
    response = client.post(f"/c/{conversation.pk}/delete", headers=HTMX)
    assert response.status_code == 204
    assert response["HX-Redirect"] == "/"
    assert not Conversation.objects.exists()
    assert not Turn.objects.exists()


def test_an_empty_answer_is_never_a_blank_bubble(make_user):
    """PF-S1 / "never a blank reply": an answer with no text says so."""
    user = make_user()
    conversation = services.conversation_create(owner=user)
    q = services.turn_append_user(conversation=conversation, content="hi")
    services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
        content="", status=Turn.Status.COMPLETE, prompt_tokens=5, completion_tokens=1,
    )  # fmt: skip
    client = Client()
    client.force_login(user)
    html = client.get(f"/c/{conversation.pk}/").content.decode()
    assert "The model gave an empty answer" in html


async def test_first_message_turns_the_new_chat_page_into_the_conversation(make_user, engine_double, settings):
    """The fragment for a first message also swaps in the sidebar entry, the rename/delete
    header and a composer that posts to the new conversation (with the size limit)."""
    settings.CHAT_MAX_MESSAGE_CHARS = 1234
    client, _ = await signed_in(make_user)
    response = await post_message(client, "Plan a picnic")
    html = response.content.decode()
    conversation_id = events_url_of(response).split("/")[2]
    assert f'hx-post="/c/{conversation_id}/rename"' in html
    assert f'hx-post="/c/{conversation_id}/turns"' in html
    assert 'maxlength="1234"' in html
    assert "Plan a picnic" in html  # the sidebar title
    await read_stream(await client.get(events_url_of(response)))


def test_a_form_posted_without_its_csrf_token_gets_a_readable_page_with_no_inline_style(make_user):
    """CSRF failures render the site's own page (templates/403_csrf.html): a message a person
    can act on, and nothing the production Content-Security-Policy would block."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("csrfuser"))
    response = client.post("/chat/turns", {"content": "hello"})
    assert response.status_code == 403
    page = response.content.decode()
    assert "This form has expired" in page
    assert "<style" not in page and "style=" not in page
