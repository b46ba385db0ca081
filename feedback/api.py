"""``POST /v1/conversations/{id}/turns/{turn_id}/feedback``: rate an answer over the API."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.http import HttpRequest, JsonResponse

from core.errors import ApiError
from core.http import api_view, parse_json
from core.schemas import Strict, Text
from conversations.selectors import conversation_get_for_user
from feedback import selectors, services
from feedback.models import Feedback


class FeedbackCreate(Strict):
    """The body; unknown fields are refused. The comment's length is checked by
    services.comment_clean (``COMMENT_MAX_CHARS``), as for the page."""

    rating: Literal["up", "down"]
    comment: Text = ""


def feedback_json(row: Feedback) -> dict:
    """One rating in the API's shape."""
    return {
        "feedback_id": str(row.feedback_id),
        "conversation_id": str(row.conversation_id),
        "turn_id": str(row.turn_id),
        "rating": row.rating,
        "comment": row.comment,
        "pool": row.pool,
        "model_version": row.model_version,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
    }


def _rate(user, conversation_id: UUID, turn_id: UUID, body: FeedbackCreate) -> dict:
    conversation = conversation_get_for_user(conversation_id=conversation_id, user=user)
    turn = selectors.feedback_turn_get(conversation=conversation, turn_id=turn_id)
    try:
        row = services.feedback_set(
            conversation=conversation, answer=turn, user=user, rating=body.rating, comment=body.comment
        )
    except ValidationError as exc:
        raise ApiError(400, "invalid_request", exc.messages[0]) from None
    return feedback_json(row)


@api_view("POST")
async def answer_feedback(request: HttpRequest, conversation_id: UUID, turn_id: UUID) -> JsonResponse:
    """``POST {"rating": "up" | "down", "comment"?: str}`` -> 200 ``{"feedback_id",
    "conversation_id", "turn_id", "rating", "comment", "pool", "model_version", "created_at", "updated_at"}``.
    One rating per user and answer: posting again replaces the rating and the comment (an
    omitted comment clears it). 404 when the conversation is not the caller's or has no turn
    ``turn_id``; 400 when the turn is the user's message rather than an answer, for a rating
    other than up/down, unknown fields, or a comment over ``COMMENT_MAX_CHARS`` characters;
    415 when the body is not JSON."""
    body = parse_json(request, FeedbackCreate)
    return JsonResponse(await sync_to_async(_rate)(request.api_user, conversation_id, turn_id, body))
