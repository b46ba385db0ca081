"""Chat pages (server-rendered, htmx) and the per-turn event stream.

Thin: parse, call a service or selector, render. Only the views that touch the generation
registry (it lives in the event loop) or stream are ``async def``.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.callers import acaller_for, caller_for
from attachments import services as attachment_services
from conversations import deletion, locks, plan, selectors, services, sidebar, submit, turnlog, turnstream
from conversations.models import Conversation, Turn
from conversations.rendering import markdown_to_safe_html
from core.db import release_db_connection
from core.sse import last_event_id, sse_event, sse_response
from gateway import gate
from inference.pools import pool_set
from moderation.gate import verdict_message, withdrawn_message
from projects import selectors as project_selectors


def _is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def sidebar_context(user, cookies: dict, *, current_id: UUID | None) -> dict:
    """The sidebar's list (templates/chat/_conversation_list.html): ``groups`` (conversations/
    sidebar.py: Pinned, Today, ... by month, in the time zone of the browser's ``tz`` cookie)
    and ``current_id``, the conversation shown beside it (its row is marked), or None. Reads
    the database: call it from sync code. (The Projects section above the list is a template
    tag: projects/templatetags/project_tags.py.) Also used by the project pages."""
    tz = sidebar.time_zone_from(cookies.get(sidebar.TIME_ZONE_COOKIE), settings.TIME_ZONE)
    return {
        "groups": sidebar.sidebar_groups(
            selectors.conversation_list(user=user), now=timezone.now(), tz=tz
        ),
        "current_id": current_id,
    }


def _current_conversation_id(request: HttpRequest) -> UUID | None:
    """The conversation whose page sent this htmx request (its ``HX-Current-URL``), or None:
    a sidebar refreshed from there keeps that row marked."""
    url = request.headers.get("HX-Current-URL", "")
    try:
        match = resolve(urlsplit(url).path) if url else None
    except Resolver404:
        return None
    if match is None or match.url_name != "conversation":
        return None
    return match.kwargs["conversation_id"]


def _page_context(request: HttpRequest, conversation: Conversation | None) -> dict:
    exchanges, earlier = _exchanges_context(conversation)
    return {
        "conversation": conversation,
        **sidebar_context(
            request.user, request.COOKIES,
            current_id=conversation.conversation_id if conversation is not None else None,
        ),  # fmt: skip
        "exchanges": exchanges,
        "earlier": earlier,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "system_prompt_max": services.SYSTEM_PROMPT_MAX_CHARS,
        **_model_choices(request.user, conversation),
    }


def _exchanges_context(
    conversation: Conversation | None, *, streaming: dict | None = None, before: UUID | None = None
) -> tuple[list[dict], UUID | None]:
    """The template contexts of a page of the exchanges of the branch shown (templates/chat/
    _messages.html; selectors.exchange_page: the newest EXCHANGES_PAGE above ``before``), and
    the cursor of the page before them (None: they start the conversation). ``streaming``:
    question turn id -> the id its answer being written will have (its actions appear when it
    is done). Raises selectors.BadCursor for a ``before`` not on the branch shown."""
    if conversation is None:
        return [], None
    streaming = streaming or {}
    page = selectors.exchange_page(conversation=conversation, before=before)
    contexts = []
    for x in page.exchanges:
        answer_id = streaming.get(x.question.turn_id)
        if answer_id is not None:  # the page follows its stream (done may be sent at once)
            x = dataclasses.replace(x, answer=None, answers=())
        elif x.answer is None and not _blocked(x.question):
            # Being written (a page loaded mid-answer): its id gives the bubble the action row
            # a freshly sent answer has, shown when the stream ends. None if Redis does not
            # know it (then the page shows the stored answer once it is reloaded).
            answer_id = turnlog.answer_for_question_sync(
                x.question.turn_id, conversation_id=conversation.conversation_id
            )
        contexts.append(_exchange_context(conversation, x, answer_id=answer_id))
    return contexts, page.earlier


def _model_choices(user, conversation: Conversation | None) -> dict:
    """The composer's model picker: the pools the user's tier (or a feature flag) allows, and
    the one selected (the conversation's model if the tier still allows it, else the pool the
    router gives the user by default)."""
    pools = pool_set().for_tier(user.tier, user.feature_flags or ())
    names = [p.name for p in pools]
    selected = conversation.model if conversation is not None else ""
    if selected not in names:
        try:
            selected = gate.route_for(caller_for(user)).pool.name
        except gate.Refused:
            selected = names[0] if names else ""
    return {"models": pools, "selected_model": selected}


def _exchange_context(
    conversation: Conversation,
    exchange: selectors.Exchange,
    *,
    answer_id: UUID | None = None,
    versions: dict | None = None,
) -> dict:
    """Template context of one exchange. ``answer_id``: the id the answer being streamed will
    have (its actions appear when it is done); ``versions``: the ``< i/n >`` state of an answer
    being streamed (:func:`_versions`); a stored answer's comes from ``exchange.answers``."""
    answer = exchange.answer
    if answer is not None:
        versions = _versions(exchange.answers or (answer,), answer)
    question = exchange.question
    return {
        "conversation": conversation,
        "question": question,
        # ``< i/n >`` of the message among its versions (branches, conversations/versions.py).
        "question_versions": _versions(exchange.questions, question) if question and exchange.questions else None,
        "answer": answer,
        "answer_html": markdown_to_safe_html(answer.content) if answer else "",
        # Unanswered: the page (re)attaches to the live stream, or starts it after a restart;
        # a message the input gate blocked is never answered (it shows why instead).
        "streaming": answer is None and not _blocked(exchange.question),
        "blocked_message": _blocked_message(exchange.question),
        "withdrawn_message": (
            withdrawn_message((answer.moderation_verdict or {}).get("categories") or [])
            if answer is not None and answer.status == Turn.Status.BLOCKED else ""
        ),
        "answer_id": answer_id,
        "versions": versions,
        # "Used N tools" above an answer written after tool calls (templates/chat/_tool_uses.html).
        "tool_uses": exchange.tool_uses,
    }


def _blocked(question: Turn | None) -> bool:
    return question is not None and question.status == Turn.Status.BLOCKED


def _blocked_message(question: Turn | None) -> str:
    """Why the input gate blocked ``question`` (moderation/verdicts.py), or ""."""
    if not _blocked(question):
        return ""
    return verdict_message(question.moderation_verdict or {})


def _versions(answers, answer: Turn) -> dict:
    """``< i/n >`` of ``answer`` among ``answers`` (its versions, oldest first): 1-based
    ``index``, ``total``, and the ids of the ``prev`` / ``next`` versions (None at the ends)."""
    ids = [a.turn_id for a in answers]
    if answer.turn_id not in ids:
        ids.append(answer.turn_id)
    i = ids.index(answer.turn_id)
    return {
        "index": i + 1,
        "total": len(ids),
        "prev": ids[i - 1] if i > 0 else None,
        "next": ids[i + 1] if i + 1 < len(ids) else None,
    }


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """A new, empty chat; the conversation is created by its first message."""
    return render(request, "chat/page.html", _page_context(request, None))


@require_GET
@login_required
def conversation_detail(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """The whole conversation: the user's own, or (read-only, workspaces/) one shared with a
    workspace they are in. 404 otherwise."""
    conversation = selectors.conversation_view_for_user(
        conversation_id=conversation_id, user=request.user
    )
    if conversation.owner_id != request.user.pk:
        from workspaces.views import shared_conversation_page  # noqa: PLC0415

        return shared_conversation_page(request, conversation)
    return render(request, "chat/page.html", _page_context(request, conversation))


def _error_response(
    request: HttpRequest, message: str, status: int, headers: dict[str, str] | None = None
) -> HttpResponse:
    """A message the person can act on, shown above the message box (htmx) or as a page.
    ``headers``: e.g. a refusal's Retry-After and X-RateLimit-* (gateway/gate.py)."""
    html = render_to_string("chat/_error.html", {"message": message}, request=request)
    response = HttpResponse(html, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    if _is_htmx(request):
        response["HX-Retarget"] = "#composer-error"
        response["HX-Reswap"] = "innerHTML"
    return response


def _refused_response(request: HttpRequest, message: str) -> HttpResponse:
    """The input gate refused the message: a 400 whose notice (``message``: the category in
    plain words, moderation/verdicts.py) is added to the message column (htmx), so the person
    sees it where the answer would have been; the composer keeps the text (it is cleared only
    on success, static/chat/chat.js). Without htmx, the notice as a page."""
    html = render_to_string("chat/_refused.html", {"message": message}, request=request)
    response = HttpResponse(html, status=400)
    if _is_htmx(request):
        response["HX-Retarget"] = "#messages"
        response["HX-Reswap"] = "beforeend"
    return response


@require_POST
@login_required
async def turn_create(request: HttpRequest, conversation_id: UUID | None = None) -> HttpResponse:
    """Store the user's message and start answering it.

    Responds with the question/answer fragment whose answer bubble opens the event stream
    (htmx), or redirects to the conversation (plain form post). ``temporary`` (1/on/true) on a
    new chat makes it a temporary chat (services.conversation_create). 400 for an empty or over-long
    message, 404 for a conversation that is not the user's, 409 while an answer is still being
    written; nothing is stored in any of those cases.
    """
    user = await request.auser()
    content = request.POST.get("content", "")
    model = request.POST.get("model") or None
    # The new-chat page's "Temporary chat" switch; only a new conversation takes it.
    temporary = conversation_id is None and request.POST.get("temporary") in ("1", "on", "true")
    # A project page's composer: the new chat starts in that project (404 if not the user's).
    project = None
    if conversation_id is None and request.POST.get("project"):
        project = await _project_for_new_chat(request.POST["project"], user)
    try:
        services.message_clean(content)
        services.model_check(model)
    except ValidationError as exc:
        return _error_response(request, exc.messages[0], 400)
    try:  # files sent with the message (multipart): checked before anything is stored
        uploads = await sync_to_async(attachment_services.uploads_read)(files=request.FILES.getlist("files"))
    except attachment_services.AttachmentRejected as exc:
        return _error_response(request, exc.message, exc.status)
    caller = await acaller_for(user)
    if conversation_id is None:
        try:
            # The chosen model is checked for the tier before anything is created.
            gate.route_for(caller, model)
        except gate.Refused as exc:
            return _error_response(request, exc.message, exc.status, exc.headers)
        try:
            conversation = await sync_to_async(services.conversation_create)(
                owner=user, model=model, temporary=temporary and project is None, project=project
            )
        except ValidationError as exc:  # e.g. the home region has no database here
            return _error_response(request, exc.messages[0], 400)
        created = True
    else:
        conversation = await selectors.aconversation_get_for_user(
            conversation_id=conversation_id, user=user
        )
        created = False
    try:
        # The files go into this message's prompt; refused with it (AttachmentRejected too).
        async with attachment_services.turn_attachments(conversation=conversation, uploads=uploads) as attached:
            question, stream = await submit.turn_submit(
                conversation=conversation, content=content, model=model
            )
            await attached.link(question)
    except locks.ConversationBusy as exc:
        return _error_response(request, str(exc), 409)
    except plan.ContentBlocked as exc:
        # Never answered. A refused first message leaves no conversation behind; in an existing
        # conversation the message stays stored with its verdict (shown there with why). Either
        # way the notice goes in the message column and the text stays in the box (issue 28).
        if created:
            await deletion.aconversation_delete(conversation=conversation)
        return _refused_response(request, exc.verdict.message())
    except gate.Refused as exc:
        if created:  # nothing was said in it: do not leave an empty conversation behind
            await deletion.aconversation_delete(conversation=conversation)
        return _error_response(request, exc.message, exc.status, exc.headers)
    url = reverse("conversation", args=[conversation.conversation_id])
    if not _is_htmx(request):
        return HttpResponseRedirect(url, status=303)
    context = {
        **_exchange_context(
            conversation,
            selectors.Exchange(question=question, answer=None),
            answer_id=stream.answer_id if stream is not None else None,
        ),
        "created": created,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "system_prompt_max": services.SYSTEM_PROMPT_MAX_CHARS,
        **await sync_to_async(_model_choices)(user, conversation),
    }
    if created:
        # Built in the worker thread: listing reads the user's memberships (a query) at once.
        context.update(
            await sync_to_async(sidebar_context)(
                user, request.COOKIES, current_id=conversation.conversation_id
            )
        )
    response = HttpResponse(
        await sync_to_async(render_to_string)("chat/_turn_created.html", context, request=request)
    )
    if created:
        response["HX-Push-Url"] = url
    return response


async def _project_for_new_chat(raw_id: str, user):
    """The project a new chat is asked to start in (a project page's composer). Raises Http404
    for a malformed id or a project the user may not open (projects/selectors.py)."""
    try:
        project_id = UUID(raw_id)
    except ValueError:
        raise Http404("No such project.") from None
    return await project_selectors.aproject_get_for_user(project_id=project_id, user=user)


@require_POST
@login_required
async def turn_edit(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Edit user message ``turn_id``: append the new text as a new user turn beside it, which
    starts a branch there (append-only; conversations/versions.py: the later turns stay on the
    old branch), and stream its answer. Responds with the exchanges of the new branch (htmx:
    they take the place of the page's, ``< n/n >`` on the edited message) or redirects. 400 for
    an empty or over-long message, 404 for a turn or conversation that is not the user's, 409
    while an answer is still being written; nothing is stored in those cases."""
    user = await request.auser()
    content = request.POST.get("content", "")
    try:
        services.message_clean(content)
    except ValidationError as exc:
        return _error_response(request, exc.messages[0], 400)
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    original = await sync_to_async(selectors.user_turn_get)(conversation=conversation, turn_id=turn_id)
    try:
        async with attachment_services.turn_attachments(conversation=conversation) as attached:
            question, stream = await submit.turn_submit(
                conversation=conversation, content=content, replaces=original
            )
            await attached.link(question)  # the edit takes the original's files along
    except locks.ConversationBusy as exc:
        return _error_response(request, str(exc), 409)
    except plan.ContentBlocked as exc:
        question, stream = exc.question, None
    except gate.Refused as exc:
        return _error_response(request, exc.message, exc.status, exc.headers)
    if not _is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    streaming = {question.turn_id: stream.answer_id} if stream is not None else {}
    return await sync_to_async(_messages_response)(request, conversation, streaming=streaming)


def _messages_response(request: HttpRequest, conversation: Conversation, *, streaming: dict | None = None) -> HttpResponse:
    """The newest page of the exchanges of the branch shown, as the fragment that fills
    ``#messages`` (with the sentinel that loads the page before it)."""
    exchanges, earlier = _exchanges_context(conversation, streaming=streaming)
    context = {
        "conversation": conversation,
        "exchanges": exchanges,
        "earlier": earlier,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
    }
    return HttpResponse(render_to_string("chat/_messages.html", context, request=request))


@require_GET
@login_required
def conversation_earlier(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """``GET ?before=<question turn id>``: the page of exchanges of the branch shown above that
    question (selectors.exchange_page), as the fragment that takes the place of the page's top
    sentinel (templates/chat/_earlier.html: the sentinel of the page before it, unless this page
    starts the conversation, then the exchanges, oldest first). The cursor is the oldest
    question the page shows (the sentinel carries it). 400 with a message for a missing or
    malformed cursor, or one that is no question on the branch shown (another conversation's
    turn, an answer, a branch switched away from since: reload); 404 for a conversation that
    is not the user's."""
    conversation = selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    try:
        before = UUID(request.GET.get("before", ""))
    except ValueError:
        return _earlier_refused(request, "'before' must be the id of a message on this page.")
    try:
        exchanges, earlier = _exchanges_context(conversation, before=before)
    except selectors.BadCursor as exc:
        return _earlier_refused(request, str(exc))
    context = {
        "conversation": conversation,
        "exchanges": exchanges,
        "earlier": earlier,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
    }
    return render(request, "chat/_earlier.html", context)


def _earlier_refused(request: HttpRequest, message: str) -> HttpResponse:
    """A 400 for a bad ``earlier`` cursor: the message in place of the sentinel (htmx swaps
    4xx responses only where told to: static/chat/follow.js shows it)."""
    html = render_to_string("chat/_earlier_error.html", {"message": message}, request=request)
    return HttpResponse(html, status=400)


@require_POST
@login_required
def question_select(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Show the branch of user message ``turn_id`` (one version of a message, ``< i/n >``):
    stored as the branch chosen at its fork, so a reload and another device show it too
    (services.branch_select). Responds with the exchanges of that branch (htmx: in place of the
    page's) or redirects. 404 if it is not a message in the user's conversation."""
    conversation = selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    question = selectors.user_turn_get(conversation=conversation, turn_id=turn_id)
    tree = selectors.conversation_tree(conversation=conversation)
    services.branch_select(
        conversation=conversation, question=question, parent_id=tree.parent_of(question)
    )
    if not _is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    return _messages_response(request, conversation)


@require_POST
@login_required
async def answer_regenerate(
    request: HttpRequest, conversation_id: UUID, turn_id: UUID
) -> HttpResponse:
    """Regenerate answer ``turn_id``: a new assistant turn that replaces it, with the same
    question (append-only). Responds with the streaming answer fragment (htmx: in place of the
    old answer; ``< n/n >`` once done) or redirects. 404 for an answer or conversation that is
    not the user's, 409 while an answer is still being written."""
    user = await request.auser()
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    answer = await sync_to_async(selectors.answer_get)(conversation=conversation, turn_id=turn_id)
    earlier = await sync_to_async(selectors.answer_versions)(answer=answer)
    try:
        question, stream = await submit.answer_regenerate(conversation=conversation, answer=answer)
    except locks.ConversationBusy as exc:
        return _error_response(request, str(exc), 409)
    except gate.Refused as exc:
        return _error_response(request, exc.message, exc.status, exc.headers)
    if not _is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    total = len(earlier) + 1
    context = {
        **_exchange_context(
            conversation,
            selectors.Exchange(question=question, answer=None),
            answer_id=stream.answer_id,
            versions={"index": total, "total": total, "prev": earlier[-1].turn_id, "next": None},
        ),
    }
    return HttpResponse(
        await sync_to_async(render_to_string)("chat/_answer_streaming.html", context, request=request)
    )


@require_POST
@login_required
async def answer_continue(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Continue answer ``turn_id``, which was cut off at its token budget: a new assistant turn
    that continues it (conversations/submit.py ``answer_continue``). Responds with the streaming
    answer fragment holding the text so far (htmx: in place of the cut-off answer; the new text
    streams after it) or redirects. 400 for an answer that was not cut off, 404 for an answer or
    conversation that is not the user's, 409 while an answer is still being written."""
    user = await request.auser()
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    answer = await sync_to_async(selectors.answer_get)(conversation=conversation, turn_id=turn_id)
    earlier = await sync_to_async(selectors.answer_versions)(answer=answer)
    try:
        question, stream = await submit.answer_continue(conversation=conversation, answer=answer)
    except locks.ConversationBusy as exc:
        return _error_response(request, str(exc), 409)
    except gate.Refused as exc:
        return _error_response(request, exc.message, exc.status, exc.headers)
    if not _is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    # The continuation takes the cut-off answer's place among the versions (the newest).
    ids = [a.turn_id for a in earlier if a.turn_id != answer.turn_id] + [stream.answer_id]
    context = {
        **_exchange_context(
            conversation,
            selectors.Exchange(question=question, answer=None),
            answer_id=stream.answer_id,
            versions={"index": len(ids), "total": len(ids), "prev": ids[-2] if len(ids) > 1 else None, "next": None},
        ),
        "prefix": answer.content,
        "prefix_html": markdown_to_safe_html(answer.content),
    }
    return HttpResponse(
        await sync_to_async(render_to_string)("chat/_answer_streaming.html", context, request=request)
    )


@require_http_methods(["GET", "POST"])
@login_required
def answer_version(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """One version of an answer, as the answer fragment with its ``< i/n >`` controls (what the
    version buttons swap in). ``POST`` also makes it the version shown for its question from now
    on, after a reload and on another device (services.answer_select). 404 if it is not an
    answer in the user's conversation."""
    conversation = selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    answer = selectors.answer_get(conversation=conversation, turn_id=turn_id)
    answers = selectors.answer_versions(answer=answer)
    if request.method == "POST":
        services.answer_select(conversation=conversation, question_id=answer.reply_to_id, answer_id=answer.turn_id)
    exchange = selectors.Exchange(
        question=None, answer=answer, answers=tuple(answers),
        tool_uses=tuple(selectors.answer_tool_uses(answer=answer)),
    )  # fmt: skip
    return render(request, "chat/_answer.html", _exchange_context(conversation, exchange))


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
        return sse_response(_single_error(_blocked_message(question)))
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


@require_POST
@login_required
def conversation_rename(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Rename a conversation; responds with the refreshed sidebar (htmx) or redirects."""
    conversation = selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    try:
        services.conversation_rename(conversation=conversation, title=request.POST.get("title", ""))
    except ValidationError as exc:
        response = HttpResponse(exc.messages[0], status=400, content_type="text/plain")
        if _is_htmx(request):
            # The message goes beside the title box; the sidebar (the form's target) stays.
            response["HX-Retarget"] = "#rename-error"
            response["HX-Reswap"] = "innerHTML"
        return response
    if _is_htmx(request):
        # The sidebar, and a <title> htmx puts on the tab when the page shows this conversation
        # (renamed from its header, or from its own row in the sidebar), not from another's row.
        current_id = _current_conversation_id(request)
        shown = current_id == conversation.conversation_id or "HX-Current-URL" not in request.headers
        return render(
            request,
            "chat/_renamed.html",
            {
                **sidebar_context(request.user, request.COOKIES, current_id=current_id),
                "conversation": conversation,
                "retitle": shown,
            },
        )
    return redirect("conversation", conversation_id=conversation.conversation_id)


@require_POST
@login_required
def conversation_pin(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """``POST``: pin the conversation to the top of the sidebar, or unpin it if it is pinned
    (services.conversation_pin_toggle; kept in ``Conversation.pinned_at``, so it survives a
    reload). htmx gets the refreshed sidebar (templates/chat/_sidebar.html); a plain post is
    sent back to the conversation. 404 for a conversation that is not the user's own (a
    workspace reader cannot pin it either); 405 for any method but POST; CSRF-checked."""
    conversation = selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    services.conversation_pin_toggle(conversation=conversation)
    if _is_htmx(request):
        return render(
            request,
            "chat/_sidebar.html",
            sidebar_context(request.user, request.COOKIES, current_id=_current_conversation_id(request)),
        )
    return redirect("conversation", conversation_id=conversation.conversation_id)


# Most matches the sidebar search lists.
SIDEBAR_SEARCH_LIMIT = 50


@require_GET
@login_required
def conversation_search(request: HttpRequest) -> HttpResponse:
    """``GET ?q=``: the sidebar's conversation list, filtered by a full-text search over the
    user's own conversations (selectors.conversation_search); a blank ``q``: all of them.
    htmx gets the list fragment; a plain request the chat page with the filtered sidebar.
    400 (the list fragment with the message) for a bad ``q`` (over 200 characters, NUL)."""
    q = request.GET.get("q", "")
    context = {"q": q, "current_id": _current_conversation_id(request)}
    try:
        text = selectors.search_query_clean(q)
        if text:
            found = selectors.conversation_search(user=request.user, q=q, limit=SIDEBAR_SEARCH_LIMIT)
            snippets = selectors.search_snippets(conversations=found, q=q)
            context.update(searching=True, results=[_search_result(c, snippets, text) for c in found])
        else:
            context.update(sidebar_context(request.user, request.COOKIES, current_id=context["current_id"]))
    except ValidationError as exc:
        context.update(searching=True, results=[], search_error=exc.messages[0])
        return render(request, "chat/_conversation_list.html", context, status=400)
    if _is_htmx(request):
        return render(request, "chat/_conversation_list.html", context)
    return render(request, "chat/page.html", {**_page_context(request, None), **context})


def _search_result(conversation: Conversation, snippets: dict[UUID, str], text: str) -> dict:
    """A search result row: the conversation, ``title_html`` (its title with the typed text in
    <mark> where the title holds it, else "") and ``snippet`` (a fragment of its latest
    matching turn with the matches in <mark>, else ""); both escaped HTML (conversations/
    sidebar.py)."""
    marked = snippets.get(conversation.conversation_id)
    title = conversation.title
    return {
        "conversation": conversation,
        "title_html": sidebar.substring_snippet(title, text, width=len(title)) if text.lower() in title.lower() else "",
        "snippet": sidebar.snippet_html(marked) if marked is not None else "",
    }


@require_POST
@login_required
async def conversation_delete(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Delete a conversation and everything of it (conversations/deletion.py), stopping its
    answer if one is being written (async: the generation registry lives in the event loop);
    back to a new chat, unless it was deleted from the sidebar row of another chat that is open
    (htmx): then that chat stays, with the refreshed sidebar."""
    user = await request.auser()
    conversation = await selectors.aconversation_get_for_user(conversation_id=conversation_id, user=user)
    await deletion.aconversation_delete(conversation=conversation)
    if _is_htmx(request):
        current_id = _current_conversation_id(request)
        if current_id is not None and current_id != conversation_id:
            # Deleted from another chat's sidebar row: stay in the chat that is open.
            context = await sync_to_async(sidebar_context)(user, request.COOKIES, current_id=current_id)
            response = await sync_to_async(render)(request, "chat/_sidebar.html", context)
            response["HX-Retarget"] = "#sidebar"
            response["HX-Reswap"] = "innerHTML"
            return response
        response = HttpResponse(status=204)
        response["HX-Redirect"] = reverse("home")
        return response
    return redirect("home")


@require_POST
@login_required
def conversation_instructions(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Set the conversation's own instructions (``system_prompt``; blank clears them), used
    from its next turn. Responds with the dialog's status line (htmx) or redirects. 400 with
    the reason for text over services.SYSTEM_PROMPT_MAX_CHARS or holding NUL; 404 for a
    conversation that is not the user's (a workspace reader cannot change it)."""
    conversation = selectors.conversation_get_for_user(
        conversation_id=conversation_id, user=request.user
    )
    try:
        services.conversation_system_prompt_set(
            conversation=conversation, system_prompt=request.POST.get("system_prompt", "")
        )
    except ValidationError as exc:
        return HttpResponse(exc.messages[0], status=400, content_type="text/plain")
    if _is_htmx(request):
        message = "Saved: used from your next message."
        if not conversation.system_prompt:
            message = "Cleared."
        return HttpResponse(message, content_type="text/plain")
    return redirect("conversation", conversation_id=conversation.conversation_id)


@require_POST
@login_required
async def conversation_discard(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Delete a temporary chat as its page goes away (static/chat/temporary.js sends this with
    ``navigator.sendBeacon`` on ``pagehide``, the CSRF token in the body): 204. Everything of it
    goes through the deletion service, an answer still being written is stopped. 400 for a chat
    that is not temporary (a stray beacon never deletes a kept conversation), 404 for one that
    is not the user's."""
    user = await request.auser()
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    if not conversation.temporary:
        return HttpResponse(
            "Only a temporary chat is discarded when its page closes; delete this conversation "
            "from its menu.",
            status=400,
            content_type="text/plain",
        )
    await deletion.aconversation_delete(conversation=conversation)
    return HttpResponse(status=204)
