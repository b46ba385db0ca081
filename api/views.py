"""The ``/v1`` API: conversations, streamed turns, cancel, history (shapes from DESIGN.md).

This is the conversations app's ``/v1`` view layer. Beside its ``services`` and ``selectors`` it
drives the turn pipeline itself (``plan``, ``submit``, ``turnstream``, ``locks``), as the chat
page's views in conversations/ do: a turn has one pipeline whatever the entrypoint, and an
entrypoint parses its protocol and renders the pipeline's events (tests/test_layers.py allows
these imports to this module alone).
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.core import signing
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.dateparse import parse_datetime

from accounts.callers import acaller_for
from api import idempotency, schemas, tools
from core.errors import ApiError
from core.http import api_view, parse_json, query_int
from attachments.api import attachment_json
from attachments.selectors import attachments_by_turn
from attachments.services import turn_attachments
from core import redis_guard
from conversations import (
    locks,
    page_selectors,
    plan,
    search_selectors,
    selectors,
    services,
    submit,
    turnstream,
)
from conversations.models import Conversation, Turn
from core.db import release_db_connection
from core.sse import last_event_id, sse_response
from gateway import gate
from moderation.gate import verdict_from_json
from projects.selectors import aproject_get_for_user

PAGE_MAX = 100
# GET /v1/conversations/{id}?path=: the whole log, or the branch the page shows.
PATHS = ("all", "selected")
CURSOR_SALT = "v1.cursor"


def _cursor_dump(kind: str, created_at, pk) -> str:
    """An opaque, signed keyset cursor (tampering is detected, not trusted)."""
    return signing.dumps([kind, created_at.isoformat(), str(pk)], salt=CURSOR_SALT, compress=True)


def _cursor_load(kind: str, raw: str | None):
    if not raw:
        return None
    try:
        found_kind, created_at, pk = signing.loads(raw, salt=CURSOR_SALT)
    except (signing.BadSignature, ValueError, TypeError):
        raise ApiError(400, "invalid_request", "'before' is not a cursor this API issued.") from None
    if found_kind != kind:
        raise ApiError(400, "invalid_request", "'before' is a cursor for another listing.")
    return parse_datetime(created_at), UUID(pk)


def _turn_json(turn: Turn) -> dict:
    return {
        "turn_id": str(turn.turn_id),
        "role": turn.role,
        "content": turn.content,
        "status": turn.status,
        "token_count": turn.token_count,
        "reply_to": str(turn.reply_to_id) if turn.reply_to_id else None,
        # Versions: the turn this one edits or regenerates (conversations/versions.py).
        "replaces": str(turn.replaces_id) if turn.replaces_id else None,
        # User turns: the message before it on its branch (the turn tree; null for a first
        # message, and for one written before branches existed).
        "parent": str(turn.parent_id) if getattr(turn, "parent_id", None) else None,
        "context_trimmed": turn.context_trimmed,
        # Who answered and what it cost (assistant turns; null / "" on user turns).
        "pool": turn.pool,
        "model_version": turn.model_version,
        "cached_tokens": turn.cached_tokens,
        "cost_usd": str(turn.cost_usd) if turn.cost_usd is not None else None,
        "moderation_verdict": turn.moderation_verdict,
        # Function calling: an answer's calls ([] for none), a tool turn's call id (null else).
        "tool_calls": list(getattr(turn, "tool_calls", None) or []),
        "tool_call_id": getattr(turn, "tool_call_id", "") or None,
        "finish_reason": getattr(turn, "finish_reason", "") or None,
        "created_at": turn.created_at.isoformat(),
    }


def _conversation_json(conversation: Conversation) -> dict:
    return {
        "conversation_id": str(conversation.conversation_id),
        "title": conversation.title,
        "model": conversation.model,
        "region": conversation.region,
        "project_id": str(conversation.project_id) if conversation.project_id else None,
        "created_at": conversation.created_at.isoformat(),
        "last_turn_at": conversation.last_turn_at.isoformat(),
    }


@api_view("GET", "POST")
async def conversations(request: HttpRequest) -> HttpResponse:
    """``POST``: create a conversation -> 201 ``{"conversation_id", "region", "project_id"}``
    (``project_id``: start it in that project; 404 for one the caller may not open).
    ``GET``: the caller's conversations, newest first, keyset-paginated
    (``?before=<cursor>&limit=1..100``) -> ``{"conversations": [...], "next_cursor"}``.
    ``GET ?q=<words>``: full-text search over the caller's conversations (titles and turn
    text; search_selectors.conversation_search), most recently active first, at most ``limit``, in
    one page (``next_cursor`` null; ``before`` is refused). 400 for a ``q`` over 200 characters."""
    user = request.api_user
    if request.method == "POST":
        body = parse_json(request, schemas.ConversationCreate)
        if body.model:
            # 400 for a model that does not exist, 403 for one the tier may not use.
            gate.route_for(await acaller_for(user), body.model)
        # 404 for a project the caller may not open (projects/selectors.py).
        project = (
            await aproject_get_for_user(project_id=body.project_id, user=user) if body.project_id else None
        )
        try:
            conversation = await sync_to_async(services.conversation_create)(
                owner=user, model=body.model, system_prompt=body.system_prompt or "", project=project
            )
        except ValidationError as exc:
            raise ApiError(400, "invalid_request", exc.messages[0]) from None
        return JsonResponse(
            {
                "conversation_id": str(conversation.conversation_id),
                "region": conversation.region,
                "project_id": str(project.pk) if project is not None else None,
            },
            status=201,
        )
    limit = query_int(request, "limit", 20, 1, PAGE_MAX)
    try:
        search = search_selectors.search_query_clean(request.GET.get("q", ""))
    except ValidationError as exc:
        raise ApiError(400, "invalid_request", f"'q': {exc.messages[0]}") from None
    if search:
        if request.GET.get("before"):
            raise ApiError(
                400, "invalid_request", "'before' cannot be combined with 'q': a search is one page."
            )
        found = await sync_to_async(search_selectors.conversation_search)(user=user, q=search, limit=limit)
        return JsonResponse({"conversations": [_conversation_json(c) for c in found], "next_cursor": None})
    before = _cursor_load("conversations", request.GET.get("before"))
    page, more = await sync_to_async(page_selectors.conversation_page)(
        user=user, before=before, limit=limit
    )
    last = page[-1] if page else None
    return JsonResponse(
        {
            "conversations": [_conversation_json(c) for c in page],
            "next_cursor": (
                _cursor_dump("conversations", last.created_at, last.conversation_id) if more else None
            ),
        }
    )


@api_view("GET", "DELETE")
async def conversation_detail(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """``GET``: a page of turns, newest page first (``?before=<cursor>&limit=1..100``, keyset,
    turns oldest-first within the page) -> ``{"conversation_id", ..., "path", "turns",
    "next_cursor"}``: the whole log, every branch and version (``?path=all``, the default).
    ``?path=selected``: only the branch the chat page shows (conversations/versions.py), each
    message with its answer shown, oldest first, in one page (``next_cursor`` null; ``before``
    and ``limit`` are refused with it). 400 for another ``path``.
    ``DELETE``: remove the conversation and its turns for good -> 204."""
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=request.api_user
    )
    if request.method == "DELETE":
        await services.aconversation_delete(conversation=conversation)
        return HttpResponse(status=204)
    path = request.GET.get("path", "all")
    if path not in PATHS:
        raise ApiError(400, "invalid_request", f"'path' must be one of: {', '.join(PATHS)}.")
    if path == "selected":
        if request.GET.get("before") or request.GET.get("limit"):
            raise ApiError(
                400, "invalid_request", "'before' and 'limit' cannot be combined with 'path=selected': the path is one page."
            )
        turns = await sync_to_async(selectors.selected_path)(conversation=conversation)
        more = False
    else:
        limit = query_int(request, "limit", 50, 1, PAGE_MAX)
        before = _cursor_load("turns", request.GET.get("before"))
        turns, more = await sync_to_async(page_selectors.turn_page)(
            conversation=conversation, before=before, limit=limit
        )
    files = await sync_to_async(attachments_by_turn)(conversation=conversation, turn_ids=[t.turn_id for t in turns])
    oldest = turns[0] if turns else None
    return JsonResponse(
        {
            **_conversation_json(conversation),
            "path": path,
            "turns": [
                {**_turn_json(t), "attachments": [attachment_json(a) for a in files.get(t.turn_id, ())]}
                for t in turns
            ],
            "next_cursor": _cursor_dump("turns", oldest.created_at, oldest.turn_id) if more else None,
        }
    )


@api_view("POST")
async def turns(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Append a user turn and stream the answer as SSE (``token`` / ``done`` / ``error``, each
    with an ``id:``). The answer's turn id is in the ``X-Turn-Id`` header, for resuming at
    ``GET .../turns/{turn_id}/events``. 409 while another answer is being written.
    ``replaces``: edit that user turn (the new one takes its place; 400 if it is not a user
    turn of this conversation). ``tools`` / ``tool_choice`` / ``parallel_tool_calls``: function
    calling as on /v1/chat/completions (api/tools.py; 400 for what it refuses): an answer that
    calls functions sends ``tool_call`` events and ends ``done`` with ``finish_reason``
    ``tool_calls``. ``role: "tool"``: the results of those calls (:func:`_tool_results`)."""
    user = request.api_user
    body = parse_json(request, schemas.TurnOrResults).root
    if isinstance(body, schemas.ToolResultsCreate):
        return await _tool_results(request, conversation_id, body)
    calling = _calling(body)
    key = idempotency.key_from_header(request.headers.get("Idempotency-Key"))
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    if key is not None:
        fingerprint = idempotency.request_fingerprint(conversation_id, body.model_dump(mode="json"))
        replay = await idempotency.claim(user.pk, key, fingerprint)
        if replay is not None:
            return await _replay(replay, conversation)
    try:
        replaces = await _replaced_user_turn(conversation, body.replaces)
        # Uploaded files sent with it (404 / 400 for ids that are not this conversation's
        # unsent files: attachments/services.py); an edit keeps the original's files.
        async with turn_attachments(conversation=conversation, attachment_ids=body.attachments) as attached:
            question, stream = await submit.turn_submit(
                conversation=conversation,
                content=body.content,
                model=body.model,
                max_tokens=body.max_tokens,
                explicit_max_tokens=True,
                replaces=replaces,
                tools=calling,
            )
            await attached.link(question)
    except plan.ContentBlocked as exc:
        # Stored (blocked): a retry with the same key gets the same refusal, not a second copy.
        if key is not None:
            await idempotency.record(user.pk, key, fingerprint, conversation_id, exc.question.turn_id)
        raise
    except (ValidationError, locks.ConversationBusy, ApiError, gate.Refused) as exc:
        if key is not None:
            await idempotency.release(user.pk, key)
        if isinstance(exc, (ApiError, gate.Refused)):
            raise
        if isinstance(exc, ValidationError):
            raise ApiError(400, "invalid_request", exc.messages[0]) from None
        raise ApiError(409, "conflict", str(exc)) from None
    if key is not None:
        await idempotency.record(user.pk, key, fingerprint, conversation_id, stream.answer_id)
    return await _stream_response(stream, question)


def _calling(body) -> tools.ToolCalling | None:
    """The function calling ``body`` asks for (api/tools.py ``calling_from``), None when it
    sends no ``tools`` and no ``tool_choice``. Raises ApiError 400 as that does."""
    if body.tools is None and body.tool_choice is None:
        return None
    return tools.calling_from(body.tools, body.tool_choice, body.parallel_tool_calls)


async def _tool_results(request: HttpRequest, conversation_id: UUID, body: schemas.ToolResultsCreate) -> HttpResponse:
    """``POST .../turns`` with ``role: "tool"``: store ``results`` as ``tool`` turns answering the
    calls of the answer the branch shown ends with (conversations/submit.py
    ``tool_results_submit``). Once every call has a result, the next answer streams as for a
    user turn (headers ``X-Turn-Id``, ``X-User-Turn-Id``: the question answered); while calls
    still await results, 202 ``{"tool_turns": [ids], "awaiting": [call ids]}``. 400 for an id
    that matches no call of that answer, a result given twice or already, an answer that made
    no calls; 409 while another answer is being written."""
    conversation = await selectors.aconversation_get_for_user(conversation_id=conversation_id, user=request.api_user)
    calling = _calling(body)
    try:
        stored, stream = await submit.tool_results_submit(
            conversation=conversation, results=[(r.tool_call_id, r.content) for r in body.results],
            tools=calling, model=body.model, max_tokens=body.max_tokens, explicit_max_tokens=True,
        )  # fmt: skip
    except submit.ToolResultsInvalid as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    except locks.ConversationBusy as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    if stream is None:
        turns = await sync_to_async(selectors.turn_list)(conversation=conversation)
        calls = next(t for t in turns if t.turn_id == stored[0].reply_to_id)
        answered = selectors.results_by_call_turn(turns).get(calls.turn_id, [])
        return JsonResponse(
            {
                "tool_turns": [str(t.turn_id) for t in stored],
                "awaiting": selectors.pending_calls(calls, answered),
            },
            status=202,
        )
    question = await sync_to_async(selectors.user_turn_get)(conversation=conversation, turn_id=stream.question_id)
    return await _stream_response(stream, question)


async def _stream_response(stream: turnstream.TurnStream, question: Turn) -> HttpResponse:
    """The SSE response following a new answer: headers ``X-Turn-Id`` (the answer, for
    resuming), ``X-User-Turn-Id``, ``X-Pool`` (the pool answering) and the rate-limit headers
    (X-RateLimit-Remaining-Requests / -Tokens after this request)."""
    await release_db_connection()
    response = sse_response(turnstream.follow_sse(stream))
    response["X-Turn-Id"] = str(stream.answer_id)
    response["X-User-Turn-Id"] = str(question.turn_id)
    response["X-Pool"] = stream.plan.route.pool.key
    if stream.plan.decision is not None:
        for name, value in stream.plan.decision.headers().items():
            response[name] = value
    return response


async def _replaced_user_turn(conversation: Conversation, turn_id: UUID | None) -> Turn | None:
    """The user turn an edit replaces, or None. Raises ApiError 400 if ``turn_id`` is not a
    user turn of ``conversation``."""
    if turn_id is None:
        return None
    try:
        return await sync_to_async(selectors.user_turn_get)(conversation=conversation, turn_id=turn_id)
    except Http404:
        raise ApiError(
            400, "invalid_request", "'replaces' must be the id of a user turn of this conversation."
        ) from None


@api_view("POST")
async def turn_regenerate(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Answer again the question that assistant turn ``turn_id`` answered: a new assistant turn
    with ``replaces`` = ``turn_id`` and the same ``reply_to`` (append-only), streamed as SSE like
    a new turn (header ``X-Turn-Id``: the new answer). Optional JSON body ``{"max_tokens"}``.
    404 if ``turn_id`` is not an assistant turn of the caller's conversation, 409 while another
    answer is being written."""
    user = request.api_user
    body = schemas.TurnRegenerate()
    if request.body:
        body = parse_json(request, schemas.TurnRegenerate)
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    try:
        answer = await sync_to_async(selectors.answer_get)(conversation=conversation, turn_id=turn_id)
    except Http404:
        raise ApiError(404, "not_found", "No such assistant turn in this conversation.") from None
    try:
        question, stream = await submit.answer_regenerate(
            conversation=conversation,
            answer=answer,
            model=body.model,
            max_tokens=body.max_tokens,
            explicit_max_tokens=True,
        )
    except locks.ConversationBusy as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return await _stream_response(stream, question)


async def _replay(replay: idempotency.Replay, conversation: Conversation) -> HttpResponse:
    """The stream of an earlier request with the same Idempotency-Key, from its first event."""
    blocked = await _blocked_question_or_none(conversation, replay.answer_id)
    if blocked is not None:  # the key names a message the input gate stopped
        raise plan.ContentBlocked(blocked, verdict_from_json(blocked.moderation_verdict or {}))
    body = await _answer_body(conversation, replay.answer_id, after=0)
    if body is None:
        raise ApiError(409, "conflict", "The earlier request with this Idempotency-Key is gone; use a new key.")
    await release_db_connection()
    response = sse_response(body)
    response["X-Turn-Id"] = str(replay.answer_id)
    response["Idempotent-Replayed"] = "true"
    return response


@api_view("GET")
async def turn_events(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Resume the stream of assistant turn ``turn_id``: the events after ``Last-Event-ID``, then
    live ones. For a turn already stored and no longer held, a single ``done``. 404 otherwise."""
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=request.api_user
    )
    body = await _answer_body(conversation, turn_id, after=last_event_id(request))
    if body is None:
        raise ApiError(404, "not_found", "No such turn in this conversation.")
    await release_db_connection()
    return sse_response(body)


async def _answer_body(conversation: Conversation, answer_id: UUID, *, after: int):
    """The SSE body of the conversation's answer ``answer_id`` wherever it is
    (conversations/turnstream.py ``answer_sse``), or None. Raises ApiError 503 while Redis is
    down and the answer is not stored (it may be generating in another process)."""
    try:
        return await turnstream.answer_sse(
            conversation_id=conversation.conversation_id, answer_id=answer_id,
            stored=lambda: _answer_or_none(conversation, answer_id), after=after,
        )  # fmt: skip
    except turnstream.LiveStateUnavailable:
        raise _resume_unavailable() from None


async def _blocked_question_or_none(conversation: Conversation, turn_id: UUID) -> Turn | None:
    """The conversation's user turn ``turn_id`` if the input gate blocked it, else None (an
    Idempotency-Key recorded for a blocked message names the message, not an answer)."""
    try:
        turn = await sync_to_async(selectors.user_turn_get)(conversation=conversation, turn_id=turn_id)
    except Http404:
        return None
    return turn if turn.status == Turn.Status.BLOCKED else None


async def _answer_or_none(conversation: Conversation, turn_id: UUID) -> Turn | None:
    """The conversation's answer ``turn_id``, stored in its region's database or still held
    awaiting write-back (conversations/writeback.py); None if it has no such answer."""
    try:
        return await sync_to_async(selectors.answer_get)(conversation=conversation, turn_id=turn_id)
    except Http404:
        return None


def _resume_unavailable() -> ApiError:
    """503 for a resume that needs Redis while it is unavailable (degraded mode,
    core/redis_guard.py): the turn's events are only in another process."""
    retry_s = max(1, round(redis_guard.breaker.open_s))
    return ApiError(
        503, "unavailable",
        "This stream cannot be resumed right now (the event store is unavailable). The answer is "
        "stored when it finishes: read it with GET /v1/conversations/{id}, or retry shortly.",
        headers={"Retry-After": str(retry_s)},
    )  # fmt: skip


@api_view("POST")
async def cancel(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Abort the conversation's generating answer now (KV cache freed; the partial answer is
    stored as cancelled). 204, also when nothing is generating (a second cancel is a no-op)."""
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=request.api_user
    )
    await turnstream.stop_anywhere(conversation_id=conversation.conversation_id)
    return HttpResponse(status=204)
