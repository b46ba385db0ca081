"""``{% attachment_chips conversation question %}``: the files sent with a message, as chips
with a download link and, when the file was cut for the prompt, how much of it went in."""

from __future__ import annotations

from django import template
from django.conf import settings

from attachments import selectors

register = template.Library()

# One query per conversation per render: the page renders every exchange's chips.
_CACHE = "_attachments_by_turn"


@register.inclusion_tag("attachments/_chips.html")
def attachment_chips(conversation, question) -> dict:
    """Context for templates/attachments/_chips.html: ``attachments`` sent with ``question``."""
    if conversation is None or question is None:
        return {"attachments": []}
    by_turn = conversation.__dict__.get(_CACHE)
    if by_turn is None:
        by_turn = selectors.attachments_by_turn(conversation=conversation)
        conversation.__dict__[_CACHE] = by_turn
    return {"attachments": by_turn.get(question.turn_id, [])}


@register.simple_tag
def attachment_max_bytes() -> int:
    """settings.CHAT_ATTACHMENT_MAX_BYTES, for the composer's size check in the browser."""
    return settings.CHAT_ATTACHMENT_MAX_BYTES
