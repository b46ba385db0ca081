"""Actions on a whole conversation, from the sidebar or its page's header: rename, pin, search
the sidebar's list, delete, set its own instructions, and discard a temporary chat as its page
closes.

Thin: parse, call a service or selector, render; delete and discard are ``async def`` (they may
stop an answer in the generation registry, which lives in the event loop).
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from conversations import deletion, search_selectors, selectors, services, sidebar
from conversations.chat_context import (
    current_conversation_id,
    is_htmx,
    page_context,
    sidebar_context,
)
from conversations.models import Conversation


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
        if is_htmx(request):
            # The message goes beside the title box; the sidebar (the form's target) stays.
            response["HX-Retarget"] = "#rename-error"
            response["HX-Reswap"] = "innerHTML"
        return response
    if is_htmx(request):
        # The sidebar, and a <title> htmx puts on the tab when the page shows this conversation
        # (renamed from its header, or from its own row in the sidebar), not from another's row.
        current_id = current_conversation_id(request)
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
    if is_htmx(request):
        return render(
            request,
            "chat/_sidebar.html",
            sidebar_context(request.user, request.COOKIES, current_id=current_conversation_id(request)),
        )
    return redirect("conversation", conversation_id=conversation.conversation_id)


# Most matches the sidebar search lists.
SIDEBAR_SEARCH_LIMIT = 50


@require_GET
@login_required
def conversation_search(request: HttpRequest) -> HttpResponse:
    """``GET ?q=``: the sidebar's conversation list, filtered by a full-text search over the
    user's own conversations (search_selectors.conversation_search); a blank ``q``: all of them.
    htmx gets the list fragment; a plain request the chat page with the filtered sidebar.
    400 (the list fragment with the message) for a bad ``q`` (over 200 characters, NUL)."""
    q = request.GET.get("q", "")
    context = {"q": q, "current_id": current_conversation_id(request)}
    try:
        text = search_selectors.search_query_clean(q)
        if text:
            found = search_selectors.conversation_search(user=request.user, q=q, limit=SIDEBAR_SEARCH_LIMIT)
            snippets = search_selectors.search_snippets(conversations=found, q=q)
            context.update(searching=True, results=[_search_result(c, snippets, text) for c in found])
        else:
            context.update(sidebar_context(request.user, request.COOKIES, current_id=context["current_id"]))
    except ValidationError as exc:
        context.update(searching=True, results=[], search_error=exc.messages[0])
        return render(request, "chat/_conversation_list.html", context, status=400)
    if is_htmx(request):
        return render(request, "chat/_conversation_list.html", context)
    return render(request, "chat/page.html", {**page_context(request, None), **context})


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
    if is_htmx(request):
        current_id = current_conversation_id(request)
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
    if is_htmx(request):
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
