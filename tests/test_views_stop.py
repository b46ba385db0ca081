"""Stop, disconnect and abandon on the chat page with the scripted engine double: Stop aborts at
once and keeps the partial text, a reader that goes (or never comes) frees the engine, one that
comes back within the grace period keeps the answer, and answers written or held by another
process are followed, ended and cancelled across processes."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from conversations import answer_lock, cancels, presence, services, turnfollow, turnlog, turnstream
from conversations.models import Turn
from tests.chat_support import (
    events_url_of,
    parse_sse,
    post_message,
    read_stream,
    signed_in,
    wait_for,
    wait_for_async,
)

pytestmark = pytest.mark.django_db(transaction=True)


# --- stop, disconnect, abandon ----------------------------------------------------------------


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
