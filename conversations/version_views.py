"""The versions of a message and of an answer (``< i/n >``, conversations/versions.py): switching
to a message's branch, regenerating or continuing an answer, and showing (or choosing) one
version of an answer.

Regenerating and continuing start an answer in the generation registry (it lives in the event
loop), so those views are ``async def``; the others are sync.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods, require_POST

from conversations import locks, page_selectors, selectors, services, submit
from conversations.chat_context import error_response, exchange_context, is_htmx, messages_response
from core.rendering import markdown_to_safe_html
from gateway import gate


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
    if not is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    return messages_response(request, conversation)


async def _answer_restart(request: HttpRequest, conversation_id: UUID, turn_id: UUID, start) -> HttpResponse:
    """What regenerate and continue share: the user's answer ``turn_id``, its earlier versions,
    ``start(conversation=..., answer=...)`` (conversations/submit.py: -> (question, stream)), its
    refusals as error responses (409 busy, the gate's status), a redirect without htmx; with htmx
    the streaming answer fragment, whose ``< i/n >`` lists the new answer last among the versions
    (a continuation takes the place of the answer it continues) and, for a continuation, the
    text so far before the new text. 404 for an answer or conversation that is not the user's."""
    user = await request.auser()
    conversation = await selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=user
    )
    answer = await sync_to_async(selectors.answer_get)(conversation=conversation, turn_id=turn_id)
    earlier = await sync_to_async(selectors.answer_versions)(answer=answer)
    try:
        question, stream = await start(conversation=conversation, answer=answer)
    except locks.ConversationBusy as exc:
        return error_response(request, str(exc), 409)
    except gate.Refused as exc:
        return error_response(request, exc.message, exc.status, exc.headers)
    if not is_htmx(request):
        return redirect("conversation", conversation_id=conversation.conversation_id)
    continuing = start is submit.answer_continue
    ids = [a.turn_id for a in earlier if not (continuing and a.turn_id == answer.turn_id)] + [stream.answer_id]
    context = exchange_context(
        conversation,
        selectors.Exchange(question=question, answer=None),
        answer_id=stream.answer_id,
        versions={"index": len(ids), "total": len(ids), "prev": ids[-2] if len(ids) > 1 else None, "next": None},
    )  # fmt: skip
    if continuing:
        context = {**context, "prefix": answer.content, "prefix_html": markdown_to_safe_html(answer.content)}
    return HttpResponse(
        await sync_to_async(render_to_string)("chat/_answer_streaming.html", context, request=request)
    )


@require_POST
@login_required
async def answer_regenerate(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Regenerate answer ``turn_id``: a new assistant turn that replaces it, with the same
    question (append-only). Responds with the streaming answer fragment (htmx: in place of the
    old answer; ``< n/n >`` once done) or redirects. 404 for an answer or conversation that is
    not the user's, 409 while an answer is still being written."""
    return await _answer_restart(request, conversation_id, turn_id, submit.answer_regenerate)


@require_POST
@login_required
async def answer_continue(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Continue answer ``turn_id``, which was cut off at its token budget: a new assistant turn
    that continues it (conversations/submit.py ``answer_continue``). Responds with the streaming
    answer fragment holding the text so far (htmx: in place of the cut-off answer; the new text
    streams after it) or redirects. 400 for an answer that was not cut off, 404 for an answer or
    conversation that is not the user's, 409 while an answer is still being written."""
    return await _answer_restart(request, conversation_id, turn_id, submit.answer_continue)


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
        tool_uses=tuple(page_selectors.answer_tool_uses(answer=answer)),
    )  # fmt: skip
    return render(request, "chat/_answer.html", exchange_context(conversation, exchange))
