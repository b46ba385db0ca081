"""The per-turn event stream: an answer as Server-Sent Events (resumable with Last-Event-ID,
DESIGN.md's disconnect rule), and stopping an answer being written.

``async def``: they stream, or touch the generation registry, which lives in the event loop.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_POST

from accounts.callers import acaller_for
from conversations import locks, selectors, submit, turnlog, turnstream
from conversations.chat_context import blocked_message
from conversations.models import Conversation, Turn
from core.db import release_db_connection
from core.sse import last_event_id, sse_event, sse_response
from gateway import gate


@login_required
async def turn_events(request: HttpRequest, conversation_id: UUID, turn_id: UUID):
    """``GET``: the answer to user turn ``turn_id`` as Server-Sent Events.

    Events: ``token`` ``{"text"}`` for each new piece of text, then ``done``
    ``{"turn_id", "status", "usage": {"prompt_tokens", "completion_tokens"}, "html"}`` (the
    sanitised HTML of the whole answer), or ``error`` ``{"message"}``. Each event has an ``id:``.
    If the answer is already stored, only ``done`` is sent. 404 if the conversation is not the
    user's or the turn is not a user turn of it.
    """
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET"})
    user = await request.auser()
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    question = await sync_to_async(selectors.user_turn_get)(
        conversation=conversation, turn_id=turn_id
    )
    if question.status == Turn.Status.BLOCKED:  # the input gate stopped it: never answered
        await release_db_connection()
        return sse_response(_single_error(blocked_message(question)))
    after = last_event_id(request)
    stream = turnstream.stream_for_question(question.turn_id)
    if stream is not None:
        body = turnstream.follow_sse(stream, after=after)
    else:
        try:
            body = await turnstream.answer_sse(
                conversation_id=conversation.conversation_id,
                answer_id=await turnlog.answer_for_question(
                    question.turn_id, conversation_id=conversation.conversation_id
                ),
                stored=sync_to_async(lambda: selectors.reply_get(turn=question)),
                after=after,
                stored_first=True,
            )
        except turnstream.LiveStateUnavailable:
            # Degraded mode (core/redis_guard.py): it may be generating in another process,
            # whose events only Redis carries; starting it again here could answer it twice.
            body = _single_error(RESUME_UNAVAILABLE)
        if body is None:
            # Unanswered and not generating (e.g. the server restarted mid-answer): answer now.
            body = await _answer_now(conversation, question, user, after)
    await release_db_connection()
    return sse_response(body)


async def _answer_now(conversation: Conversation, question: Turn, user, after: int):
    """Start answering ``question`` here and follow it; a refusal is one ``error`` event."""
    try:
        stream = await submit.answer_now(
            conversation=conversation, question=question, caller=await acaller_for(user)
        )
    except locks.ConversationBusy as exc:
        return _single_error(str(exc))
    except gate.Refused as exc:
        return _single_error(exc.message)
    return turnstream.follow_sse(stream, after=after)


RESUME_UNAVAILABLE = (
    "This answer cannot be shown live right now. It is saved when it is finished: reload the "
    "page in a moment."
)


async def _single_error(message: str):
    yield sse_event("error", {"finish_reason": "error", "message": message}, 1)


@require_POST
@login_required
async def turn_stop(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Stop answering user turn ``turn_id``: aborts the engine request at once and stores the
    partial answer as cancelled. 204 (also when there is nothing left to stop); 404 if the
    conversation is not the user's."""
    user = await request.auser()
    await selectors.aconversation_get_for_user(conversation_id=conversation_id, user=user)
    stream = turnstream.stream_for_question(turn_id)
    if stream is not None and stream.conversation_id == conversation_id:
        stream.stop()
        await stream.wait()
    else:  # maybe generating in another server process
        answer_id = await turnlog.answer_for_question(turn_id, conversation_id=conversation_id)
        if answer_id is not None:
            await turnstream.stop_anywhere(conversation_id=conversation_id, answer_id=answer_id)
    return HttpResponse(status=204)
