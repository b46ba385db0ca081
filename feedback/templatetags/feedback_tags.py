"""``{% feedback_widget conversation answer %}``: the thumbs up / down buttons of one answer."""

from __future__ import annotations

from uuid import UUID

from django import template

from feedback import selectors
from feedback.views import rating_context

register = template.Library()


def _ratings(request, conversation) -> dict:
    """The signed-in user's ratings of ``conversation``'s answers, read once per request and
    conversation (a page with fifty answers is one query)."""
    cache = getattr(request, "_feedback_ratings", None)
    if cache is None:
        cache = request._feedback_ratings = {}
    key = conversation.conversation_id
    if key not in cache:
        cache[key] = selectors.feedback_by_answer(conversation=conversation, user=request.user)
    return cache[key]


@register.inclusion_tag("feedback/_rating.html", takes_context=True)
def feedback_widget(context, conversation, answer) -> dict:
    """The rating buttons of ``answer`` (a Turn, or an answer's turn id while it is being
    streamed) with the user's current rating shown. Shown only to the conversation's owner,
    the one person who may rate its answers (feedback/views.py); empty for anyone else."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if conversation is None or user is None or not user.is_authenticated:
        return {"show": False}
    if conversation.owner_id != user.pk:
        return {"show": False}
    answer_id = answer if isinstance(answer, UUID) else getattr(answer, "turn_id", None)
    if answer_id is None:
        return {"show": False}
    if isinstance(answer, UUID):  # being streamed: nothing rated yet
        feedback = None
    else:
        feedback = _ratings(request, conversation).get(answer_id)
    return rating_context(conversation=conversation, answer_id=answer_id, feedback=feedback)
