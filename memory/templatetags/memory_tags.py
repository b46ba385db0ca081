"""``{% memory_update_notice conversation question %}``: "Memory updated" with Undo under the
answer to a message that asked to remember or forget something (issue 28; memory/updates.py)."""

from __future__ import annotations

from django import template

from memory.updates import memory_updates_for_turns

register = template.Library()


def _updates(request, conversation) -> dict:
    """The owner's memory updates of the conversation's turns, read once per request and
    conversation (by conversation id; a page with fifty exchanges is one query)."""
    cache = getattr(request, "_memory_updates", None)
    if cache is None:
        cache = request._memory_updates = {}
    key = conversation.conversation_id
    if key not in cache:
        from memory.models import MemoryUpdate  # noqa: PLC0415

        turn_ids = MemoryUpdate.objects.filter(user=request.user, conversation_id=key).values_list("turn_id", flat=True)
        cache[key] = memory_updates_for_turns(user=request.user, turn_ids=turn_ids) if turn_ids else {}
    return cache[key]


@register.inclusion_tag("memory/_update.html", takes_context=True)
def memory_update_notice(context, conversation, question) -> dict:
    """The notice for ``question`` (a user Turn), shown to the conversation's owner only;
    nothing when the message changed no memory."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if conversation is None or question is None or user is None or not user.is_authenticated:
        return {"update": None}
    if conversation.owner_id != user.pk:
        return {"update": None}
    return {"update": _updates(request, conversation).get(question.turn_id)}
