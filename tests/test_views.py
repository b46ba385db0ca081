"""Chat pages, sending, the event stream and Stop, with the scripted engine double."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient, Client

from conversations import answer_lock, cancels, presence, services, turnfollow, turnlog, turnstream
from conversations.models import Conversation, Turn

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HX-Request": "true"}


def parse_sse(raw: bytes) -> list[tuple[str, dict, int | None]]:
    """[(event, data, id)] from SSE bytes (comments ignored)."""
    events = []
    for block in raw.decode("utf-8").split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value
        if "event" in fields:
            eid = int(fields["id"]) if "id" in fields else None
            events.append((fields["event"], json.loads(fields["data"]), eid))
    return events


async def read_stream(response, *, limit: int | None = None) -> bytes:
    """Consume a streaming response (optionally only ``limit`` chunks, then disconnect)."""
    body = b""
    iterator = response.streaming_content
    count = 0
    try:
        async for chunk in iterator:
            body += chunk
            count += 1
            if limit is not None and count >= limit:
                break
    finally:
        await iterator.aclose()
    return body


async def signed_in(make_user, username="alice") -> tuple[AsyncClient, object]:
    user = await sync_to_async(make_user)(username)
    client = AsyncClient()
    await client.aforce_login(user)
    return client, user


async def post_message(client, content, conversation_id=None, **headers):
    url = f"/c/{conversation_id}/turns" if conversation_id else "/chat/turns"
    return await client.post(url, {"content": content}, headers={**HTMX, **headers})


def events_url_of(response) -> str:
    return re.search(r'sse-connect="([^"]+)"', response.content.decode()).group(1)


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


# --- streaming ------------------------------------------------------------------------------


async def test_send_streams_tokens_then_done_and_stores_the_answer(make_user, engine_double):
    engine_double.scripts = [["Hello", ", ", "", "**world**", "."]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "Say hello")
    assert response.status_code == 200
    assert response["HX-Push-Url"].startswith("/c/")
    # The user turn is committed before generation starts.
    assert await Turn.objects.filter(role="user", content="Say hello").aexists()

    stream = await client.get(events_url_of(response))
    assert stream["Content-Type"].startswith("text/event-stream")
    assert stream["Cache-Control"] == "no-cache"
    assert stream["X-Accel-Buffering"] == "no"
    events = parse_sse(await read_stream(stream))

    tokens = [data["text"] for name, data, _ in events if name == "token"]
    assert tokens == ["Hello", ", ", "**world**", "."]  # PF-S1: no empty events
    name, done, _ = events[-1]
    assert name == "done"
    assert [eid for _, _, eid in events] == list(range(1, len(events) + 1))
    answer = await Turn.objects.aget(role="assistant")
    assert answer.content == "".join(tokens) == "Hello, **world**."
    assert answer.status == "complete"
    assert done["turn_id"] == str(answer.turn_id)
    # The empty delta was still a token (as a partial UTF-8 byte is): usage counts it.
    assert done["usage"] == {
        "prompt_tokens": answer.prompt_tokens, "cached_tokens": 0, "completion_tokens": 5,
        "cost_usd": str(answer.cost_usd),
    }  # fmt: skip
    assert (done["pool"], answer.pool) == ("mini", "mini")  # a free user's default pool
    # mini's prices ($0.75 / $4.50 per 1M input / output tokens, the design brief's).
    assert answer.cost_usd == (Decimal(answer.prompt_tokens) * Decimal("0.75") + 5 * Decimal("4.50")) / 1_000_000
    assert "<strong>world</strong>" in done["html"]


async def test_unicode_deltas_arrive_as_valid_utf8_and_match_the_stored_turn(make_user, engine_double):
    """PF-S2 (gateway half): every data payload is valid UTF-8 JSON, no U+FFFD."""
    engine_double.scripts = [["你好", "世界 ", "🙂🎉", " café ", "naïve"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "greet me")
    raw = await read_stream(await client.get(events_url_of(response)))
    text = raw.decode("utf-8")  # raises on invalid UTF-8
    assert "\ufffd" not in text
    events = parse_sse(raw)
    joined = "".join(d["text"] for n, d, _ in events if n == "token")
    answer = await Turn.objects.aget(role="assistant")
    assert joined == answer.content == "你好世界 🙂🎉 café naïve"


async def test_engine_failure_ends_with_a_readable_error_event(make_user, engine_double):
    engine_double.scripts = [["partial", RuntimeError("boom")]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    name, data, _ = events[-1]
    assert name == "error"
    assert "went wrong" in data["message"]
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "failed"


async def test_answered_turn_replays_only_done(make_user, engine_double):
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    url = events_url_of(response)
    await read_stream(await client.get(url))
    turnstream._streams.clear()  # as after the finished stream has been released
    events = parse_sse(await read_stream(await client.get(url)))
    assert [name for name, _, _ in events] == ["done"]
    assert len(engine_double.requests) == 1  # not generated again


async def test_next_turn_prompt_contains_the_history(make_user, engine_double):
    engine_double.scripts = [["Paris", "."], ["Yes", "."]]
    client, _ = await signed_in(make_user)
    first = await post_message(client, "capital of france")
    await read_stream(await client.get(events_url_of(first)))
    conversation_id = events_url_of(first).split("/")[2]
    second = await post_message(client, "are you sure", conversation_id)
    assert second.status_code == 200
    await read_stream(await client.get(events_url_of(second)))
    prompt_2 = engine_double.requests[1][0]
    prompt_1 = engine_double.requests[0][0]
    assert len(prompt_2) > len(prompt_1)  # history + the new question


# --- stop, disconnect, abandon ----------------------------------------------------------------


async def wait_for_async(read, expected, timeout=2.0):
    """Await ``read()`` until it returns ``expected`` (AssertionError after ``timeout`` s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (value := await read()) != expected:
        assert loop.time() < deadline, f"still {value!r}, not {expected!r}"
        await asyncio.sleep(0.02)


async def wait_for(predicate, timeout=2.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_stop_aborts_at_once_and_stores_the_partial_text(make_user, engine_double):
    """PF-C3: Stop aborts the engine request within 1 s; the partial answer is kept."""
    engine_double.scripts = [["Once", " upon", 30.0, " a time"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "story")
    url = events_url_of(response)
    events_response = await client.get(url)
    reader = asyncio.ensure_future(read_stream(events_response))
    await wait_for(lambda: engine_double.requests and engine_double.unfinished)
    await asyncio.sleep(0.05)

    started = asyncio.get_running_loop().time()
    stop = await client.post(url.replace("/events", "/stop"))
    assert stop.status_code == 204
    request_id = engine_double.requests[0][2]
    assert request_id in engine_double.aborted
    assert asyncio.get_running_loop().time() - started < 1.0
    events = parse_sse(await asyncio.wait_for(reader, 5))
    assert events[-1][0] == "done" and events[-1][1]["status"] == "cancelled"
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "cancelled"
    assert answer.content == "Once upon"
    assert answer.token_count == 2


async def test_stop_before_the_first_token(make_user, engine_double):
    """PF-C3: a Stop that lands before any token still aborts, and the next turn starts."""
    engine_double.scripts = [[30.0, "late"], ["Next", " answer"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "q1")
    url = events_url_of(response)
    await wait_for(lambda: engine_double.unfinished)
    assert (await client.post(url.replace("/events", "/stop"))).status_code == 204
    assert engine_double.requests[0][2] in engine_double.aborted
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "cancelled" and answer.content == ""

    conversation_id = url.split("/")[2]
    again = await post_message(client, "q2", conversation_id)
    assert again.status_code == 200
    events = parse_sse(await read_stream(await client.get(events_url_of(again))))
    assert "".join(d["text"] for n, d, _ in events if n == "token") == "Next answer"


async def test_second_stop_is_a_no_op(make_user, engine_double):
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    url = events_url_of(response)
    await read_stream(await client.get(url))
    assert (await client.post(url.replace("/events", "/stop"))).status_code == 204
    assert (await client.post(url.replace("/events", "/stop"))).status_code == 204
    assert (await Turn.objects.aget(role="assistant")).status == "complete"


async def test_dropped_events_connection_aborts_generation(make_user, engine_double, settings):
    """PF-C1 (double): with no grace period, a reader that goes aborts the engine request."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 0
    engine_double.scripts = [["one", " two", 30.0, " three"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "count")
    events_response = await client.get(events_url_of(response))
    reader = asyncio.ensure_future(read_stream(events_response))
    await wait_for(lambda: len(turnstream._streams) and len(next(iter(turnstream._streams.values())).events) == 2)
    await asyncio.sleep(0.05)
    reader.cancel()  # what the ASGI server does when the client's socket closes
    await wait_for(lambda: engine_double.aborted, timeout=1.0)
    await wait_for(lambda: not turnstream._busy)
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "cancelled"
    assert answer.content == "one two"


async def test_reader_that_comes_back_within_the_grace_period_keeps_the_answer(
    make_user, engine_double, settings
):
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 5
    engine_double.scripts = [["one", 0.3, " two"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "count")
    url = events_url_of(response)
    reader = asyncio.ensure_future(read_stream(await client.get(url)))
    await wait_for(lambda: len(next(iter(turnstream._streams.values())).events) == 1)
    reader.cancel()
    await asyncio.sleep(0.05)
    events = parse_sse(await read_stream(await client.get(url, headers={"Last-Event-ID": "1"})))
    assert [d.get("text") for n, d, _ in events if n == "token"] == [" two"]
    assert events[-1][1]["status"] == "complete"
    assert engine_double.aborted == {}


async def test_generation_nobody_reads_is_aborted(make_user, engine_double, settings):
    settings.CHAT_STREAM_ATTACH_TIMEOUT_S = 0.2
    engine_double.scripts = [["never", 30.0, " read"]]
    client, _ = await signed_in(make_user)
    await post_message(client, "hello?")
    await wait_for(lambda: engine_double.aborted, timeout=2.0)
    await wait_for(lambda: not turnstream._busy)
    assert (await Turn.objects.aget(role="assistant")).status == "cancelled"


async def test_a_reader_in_another_process_keeps_an_answer_nobody_reads_here(make_user, engine_double, settings):
    """Given an answer whose events request a load balancer sent to another process, so nobody
    reads it here; when that reader's mark is in Redis (presence.reading: what
    follow_remote_sse holds); then the answer is not aborted after the attach timeout and
    completes."""
    settings.CHAT_STREAM_ATTACH_TIMEOUT_S = 0.2
    engine_double.scripts = [["read", 0.8, " elsewhere"]]
    client, _ = await signed_in(make_user)
    await post_message(client, "hello?")
    stream = next(iter(turnstream._streams.values()))
    async with presence.reading(stream.answer_id):
        await wait_for_async(lambda: presence.reader_present(stream.answer_id), True)
        await wait_for(lambda: stream.finished, timeout=5)
    assert engine_double.aborted == {}
    await wait_for(lambda: not turnstream._busy)
    answer = await Turn.objects.aget(role="assistant")
    assert (answer.status, answer.content) == ("complete", "read elsewhere")


async def test_an_answer_still_queued_in_another_process_is_followed_not_answered_again(make_user):
    """Given an answer that another process writes but that still waits for an engine slot (its
    conversation lock and Redis keys are set, no event yet); when a reader here asks where the
    answer is; then it follows that process's log (it does not give up, and the page does not
    answer the question a second time) and gets the events once they are written."""
    user = await sync_to_async(make_user)("quinn")
    conversation = await sync_to_async(services.conversation_create)(owner=user)
    answer_id, question_id = uuid.uuid4(), uuid.uuid4()
    assert await answer_lock.conversation_lock(conversation.pk, answer_id)
    writer = turnlog.TurnLogWriter(answer_id, question_id, conversation.pk)
    await wait_for_async(lambda: turnlog.answer_for_question(question_id), answer_id)

    async def nothing_stored():
        return None

    body = await turnstream.answer_sse(conversation_id=conversation.pk, answer_id=answer_id, stored=nothing_stored)
    assert body is not None
    chunks: list[bytes] = []

    async def read():
        async for chunk in body:
            chunks.append(chunk)

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0.3)
    assert await presence.reader_present(answer_id)  # the writer's process sees a reader
    writer.append(1, "token", {"text": "late"})
    writer.append(2, "done", {"status": "complete"})
    writer.close()
    await asyncio.wait_for(reader, 5)
    events = parse_sse(b"".join(chunks))
    assert [(name, data.get("text")) for name, data, _ in events] == [("token", "late"), ("done", None)]


async def test_a_withdrawn_answers_log_ends_its_remote_readers_and_a_cancel_of_it_at_once(make_user):
    """Given an answer another process withdrew (its log ends with ``moderation``, its
    conversation still locked while it is stored); when a reader here follows the log and a
    Stop here asks that process to cancel it; then the reader ends at the moderation event and
    the cancel returns within 1 s (moderation is terminal like done and error: not after the
    log's TTL and the cancel's full 5 s wait)."""
    user = await sync_to_async(make_user)("wanda")
    conversation = await sync_to_async(services.conversation_create)(owner=user)
    answer_id = uuid.uuid4()
    assert await answer_lock.conversation_lock(conversation.pk, answer_id)
    writer = turnlog.TurnLogWriter(answer_id, uuid.uuid4(), conversation.pk)
    writer.append(1, "token", {"text": "one"})
    writer.append(2, "moderation", {"retract": True, "categories": ["blocked_term"], "finish_reason": "moderation"})
    await wait_for_async(lambda: turnlog.exists(answer_id), True)
    loop = asyncio.get_running_loop()

    started = loop.time()
    events = [item async for item in turnfollow.follow(answer_id) if item is not None]
    assert [event for _, event, _ in events] == ["token", "moderation"]
    assert loop.time() - started < 1.0

    started = loop.time()
    await cancels.cancel_elsewhere(answer_id)
    assert loop.time() - started < 1.0
    writer.close()
    await writer.wait_flushed()


async def test_answering_an_unanswered_question_waits_for_another_process_holding_the_conversation(
    make_user, engine_double
):
    """Given a stored question with no answer and another process holding its conversation's
    lock; when its events are requested here; then the reader is told the conversation is busy
    and no second answer is started (the claim is cross-process, as for a new message)."""
    user = await sync_to_async(make_user)("rhea")
    client = AsyncClient()
    await client.aforce_login(user)
    conversation = await sync_to_async(services.conversation_create)(owner=user)
    question = await sync_to_async(services.turn_append_user)(conversation=conversation, content="hello?")
    assert await answer_lock.conversation_lock(conversation.pk, uuid.uuid4())
    response = await client.get(f"/c/{conversation.pk}/turns/{question.turn_id}/events")
    events = parse_sse(await read_stream(response))
    assert [name for name, _, _ in events] == ["error"], events
    assert engine_double.requests == []
    assert not turnstream._busy


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


async def test_engine_death_mid_answer_continues_after_restart(make_user, engine_double):
    """The engine process dies after two tokens: the turn waits for the restarted engine and
    continues from the text already sent (re-prefilled), so nothing streamed is lost."""
    from inference.engine import EngineUnavailable

    engine_double.scripts = [["Hello", " there", EngineUnavailable("core died")], [",", " friend."]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    tokens = [d["text"] for n, d, _ in events if n == "token"]
    assert tokens == ["Hello", " there", ",", " friend."]
    assert events[-1][0] == "done" and events[-1][1]["status"] == "complete"
    assert engine_double.waited_ready == 1
    first_prompt, second_prompt = engine_double.requests[0][0], engine_double.requests[1][0]
    assert len(second_prompt) == len(first_prompt) + 2  # + "Hello there" re-prefilled
    answer = await Turn.objects.aget(role="assistant")
    assert answer.content == "Hello there, friend."
    assert answer.token_count == 4


async def test_engine_that_stays_dead_ends_with_a_readable_error(make_user, engine_double, settings):
    from inference.engine import EngineUnavailable

    settings.CHAT_ENGINE_RESUME_ATTEMPTS = 1
    engine_double.scripts = [["Hi", EngineUnavailable("dead")], [EngineUnavailable("still dead")]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    assert events[-1][0] == "error"
    assert "unavailable" in events[-1][1]["message"]
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "failed" and answer.content == "Hi"


async def test_a_second_stop_while_the_answer_is_stored_still_closes_the_stream(make_user, engine_double):
    """Two Stops in quick succession (a double click, or Stop plus an abandoned reader): the
    answer is stored once and the stream still ends with `done`."""
    engine_double.scripts = [["part", 30.0, "never"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "go")
    url = events_url_of(response)
    await wait_for(lambda: engine_double.unfinished)
    stream = next(iter(turnstream._streams.values()))
    stream.stop()
    stream.task.cancel()  # a second cancellation lands while the answer is being stored
    await asyncio.wait_for(stream.wait(), 5)
    assert stream.finished
    assert stream.events[-1].event == "done"
    assert turnstream.stream_for_conversation(stream.conversation_id) is None
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "cancelled"


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
