"""Sending a message: a new turn (in a new or existing chat, with its files) and the edit of a
message, which starts a branch beside it (conversations/versions.py).

Async: submitting starts the answer in the generation registry, which lives in the event loop
(conversations/submit.py). The answer itself is read from conversations/stream_views.py.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts.callers import acaller_for
from attachments import services as attachment_services
from conversations import deletion, locks, plan, selectors, services, submit
from conversations.chat_context import (
    error_response,
    exchange_context,
    is_htmx,
    messages_response,
    model_choices,
    sidebar_context,
)
from gateway import gate
from projects import selectors as project_selectors


def _refused_response(request: HttpRequest, message: str) -> HttpResponse:
    """The input gate refused the message: a 400 whose notice (``message``: the category in
    plain words, moderation/verdicts.py) is added to the message column (htmx), so the person
    sees it where the answer would have been; the composer keeps the text (it is cleared only
    on success, static/chat/chat.js). Without htmx, the notice as a page."""
    html = render_to_string("chat/_refused.html", {"message": message}, request=request)
    response = HttpResponse(html, status=400)
    if is_htmx(request):
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
        return error_response(request, exc.messages[0], 400)
    try:  # files sent with the message (multipart): checked before anything is stored
        uploads = await sync_to_async(attachment_services.uploads_read)(files=request.FILES.getlist("files"))
    except attachment_services.AttachmentRejected as exc:
        return error_response(request, exc.message, exc.status)
    caller = await acaller_for(user)
    if conversation_id is None:
        try:
            # The chosen model is checked for the tier before anything is created.
            gate.route_for(caller, model)
        except gate.Refused as exc:
            return error_response(request, exc.message, exc.status, exc.headers)
        try:
            conversation = await sync_to_async(services.conversation_create)(
                owner=user, model=model, temporary=temporary and project is None, project=project
            )
        except ValidationError as exc:  # e.g. the home region has no database here
            return error_response(request, exc.messages[0], 400)
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
        return error_response(request, str(exc), 409)
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
        return error_response(request, exc.message, exc.status, exc.headers)
    url = reverse("conversation", args=[conversation.conversation_id])
    if not is_htmx(request):
        return HttpResponseRedirect(url, status=303)
    context = {
        **exchange_context(
            conversation,
            selectors.Exchange(question=question, answer=None),
            answer_id=stream.answer_id if stream is not None else None,
        ),
        "created": created,
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "system_prompt_max": services.SYSTEM_PROMPT_MAX_CHARS,
        **await sync_to_async(model_choices)(user, conversation),
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
        return error_response(request, exc.messages[0], 400)
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
        return error_response(request, str(exc), 409)
    except plan.ContentBlocked as exc:
        question, stream = exc.question, None
    except gate.Refused as exc:
        return error_response(request, exc.message, exc.status, exc.headers)
    if not is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    streaming = {question.turn_id: stream.answer_id} if stream is not None else {}
    return await sync_to_async(messages_response)(request, conversation, streaming=streaming)
