"""The rating buttons under each answer (htmx). Thin: parse, check access, call the service,
render the buttons again with the chosen state."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from conversations.selectors import conversation_get_for_user
from feedback import selectors, services


def rating_context(*, conversation, answer_id: UUID, feedback, saved: bool = False, error: str = "") -> dict:
    """Context of ``feedback/_rating.html``: the buttons of one answer, ``feedback`` the user's
    current rating of it (a Feedback row, or None)."""
    return {
        "show": True,
        "conversation": conversation,
        "answer_id": answer_id,
        "feedback": feedback,
        "rating": feedback.rating if feedback is not None else "",
        "comment_max_chars": services.COMMENT_MAX_CHARS,
        "saved": saved,
        "error": error,
    }


@require_POST
@login_required
def answer_feedback(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> HttpResponse:
    """Rate answer ``turn_id``: form fields ``rating`` (``up`` | ``down``) and ``comment``
    (optional; replaces the previous one). Responds with the buttons showing the chosen state
    (htmx: they replace themselves) or redirects back to the conversation (303).

    Only the conversation's owner rates its answers: 404 for a conversation that is not the
    user's (nor anyone's) and for a turn it does not have; 400 with a message for a user turn,
    a bad rating or comment; nothing is stored in those cases."""
    conversation = conversation_get_for_user(conversation_id=conversation_id, user=request.user)
    turn = selectors.feedback_turn_get(conversation=conversation, turn_id=turn_id)
    try:
        row = services.feedback_set(
            conversation=conversation, answer=turn, user=request.user,
            rating=request.POST.get("rating", ""), comment=request.POST.get("comment", ""),
        )  # fmt: skip
    except ValidationError as exc:
        return _refused(request, conversation, turn_id, exc.messages[0])
    if request.headers.get("HX-Request") != "true":
        url = reverse("conversation", args=[conversation.conversation_id])
        return HttpResponseRedirect(f"{url}#turn-{turn_id}", status=303)
    context = rating_context(conversation=conversation, answer_id=turn_id, feedback=row, saved=True)
    return render(request, "feedback/_rating.html", context)


def _refused(request: HttpRequest, conversation, turn_id: UUID, message: str) -> HttpResponse:
    """400: the buttons again with ``message`` (htmx), or a page saying it with a way back."""
    if request.headers.get("HX-Request") == "true":
        current = selectors.feedback_by_answer(conversation=conversation, user=request.user)
        context = rating_context(
            conversation=conversation, answer_id=turn_id, feedback=current.get(turn_id), error=message
        )
        return render(request, "feedback/_rating.html", context, status=400)
    return render(
        request, "feedback/refused.html", {"conversation": conversation, "message": message}, status=400
    )
