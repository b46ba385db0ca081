"""The chat pages: a new chat, a conversation's page, and the earlier pages of its exchanges
loaded as the reader scrolls up (issue 29).

Thin: parse, call a selector, render (contexts from conversations/chat_context.py).
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from conversations import page_selectors, selectors
from conversations.chat_context import exchanges_context, page_context
from conversations.models import Conversation


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """A new, empty chat; the conversation is created by its first message."""
    return render(request, "chat/page.html", page_context(request, None))


@require_GET
@login_required
def conversation_detail(
    request: HttpRequest,
    conversation_id: UUID,
    *,
    shared_page: Callable[[HttpRequest, Conversation], HttpResponse],
) -> HttpResponse:
    """The whole conversation: the user's own, or (read-only) one shared with a workspace they
    are in. 404 otherwise.

    ``shared_page(request, conversation)`` renders a conversation the reader does not own; the
    URLconf passes it in (chatsite/urls.py: workspaces.views.shared_conversation_page), so this
    app imports nothing of the workspaces app that sits above it."""
    conversation = selectors.conversation_view_for_user(
        conversation_id=conversation_id, user=request.user
    )
    if conversation.owner_id != request.user.pk:
        return shared_page(request, conversation)
    return render(request, "chat/page.html", page_context(request, conversation))


@require_GET
@login_required
def conversation_earlier(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """``GET ?before=<question turn id>``: the page of exchanges of the branch shown above that
    question (page_selectors.exchange_page), as the fragment that takes the place of the page's top
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
        exchanges, earlier = exchanges_context(conversation, before=before)
    except page_selectors.BadCursor as exc:
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
