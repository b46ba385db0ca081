"""Every read of attachments, permission-checked through the conversation they belong to."""

from __future__ import annotations

from collections import defaultdict
from uuid import UUID

from django.http import Http404

from accounts.models import User
from attachments.models import Attachment
from conversations import selectors as conversation_selectors
from conversations.models import Conversation
from core import regions


def attachment_get_for_user(*, conversation_id: UUID, attachment_id: UUID, user: User) -> Attachment:
    """The attachment, if ``user`` may read its conversation (conversations.selectors
    ``conversation_view_for_user``: its owner, or a member of the workspace it is shared with).
    Raises Http404 if either is missing *or* not readable by them, so an id never reveals that
    someone else's file exists."""
    conversation = conversation_selectors.conversation_view_for_user(
        conversation_id=conversation_id, user=user
    )
    return attachment_in_conversation(conversation=conversation, attachment_id=attachment_id)


@regions.routed
def attachment_in_conversation(*, conversation: Conversation, attachment_id: UUID) -> Attachment:
    """The conversation's attachment ``attachment_id`` (the caller has checked who may see the
    conversation). Raises Http404 if it has none with that id."""
    try:
        return Attachment.objects.defer("text").get(conversation=conversation, attachment_id=attachment_id)
    except Attachment.DoesNotExist:
        raise Http404("No such file in this conversation.") from None


@regions.routed
def attachments_by_turn(*, conversation: Conversation, turn_ids=None) -> dict[UUID, list[Attachment]]:
    """The conversation's sent attachments grouped by the user turn they went with (only
    ``turn_ids``, if given), each list in upload order. Without their text (page chips and API
    listings need only the metadata)."""
    query = Attachment.objects.defer("text").filter(conversation=conversation, turn__isnull=False)
    if turn_ids is not None:
        query = query.filter(turn_id__in=list(turn_ids))
    grouped: dict[UUID, list[Attachment]] = defaultdict(list)
    for attachment in query.order_by("created_at", "attachment_id"):
        grouped[attachment.turn_id].append(attachment)
    return dict(grouped)

