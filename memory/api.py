"""``/v1/users/{id}/memory``: a user's long-term memory over the API (issue 7).

``GET`` lists the facts; ``PATCH {"add": [text], "remove": [fact_id], "memory_enabled": bool}``
changes them (removals first, then additions, then the switch, in one transaction) and answers
with the resulting list. A caller can only see or touch their own memory: any other user id is a
404, never a 403 (existence is not revealed).
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, JsonResponse
from pydantic import Field

from core.errors import ApiError
from core.http import api_view, parse_json
from core.schemas import Strict, Text
from memory import selectors, services
from memory.models import UserMemory

# Most facts one PATCH may add (each is embedded in the request: ~5-15 ms of CPU apiece).
ADD_MAX = 50


class MemoryPatch(Strict):
    """The PATCH body; unknown fields are refused. Fact length (``CHAT_MEMORY_FACT_CHARS``) and
    blankness are checked by services.memory_fact_clean, as for the page."""

    add: list[Text] = Field(default_factory=list, max_length=ADD_MAX)
    remove: list[UUID] = Field(default_factory=list, max_length=10_000)
    memory_enabled: bool | None = None


def fact_json(fact: UserMemory) -> dict:
    """One fact in the API's shape."""
    return {
        "fact_id": str(fact.fact_id),
        "text": fact.text,
        "source": fact.source,
        "source_conversation_id": str(fact.source_conversation_id) if fact.source_conversation_id else None,
        "created_at": fact.created_at.isoformat(),
    }


def _memory_json(user) -> dict:
    return {"memory_enabled": user.memory_enabled, "facts": [fact_json(f) for f in selectors.memory_list(user=user)]}


def _patch(user, body: MemoryPatch) -> dict:
    try:
        with transaction.atomic():
            services.memory_remove(user=user, fact_ids=body.remove)
            services.memory_add(user=user, texts=body.add, source=UserMemory.Source.MANUAL)
            if body.memory_enabled is not None:
                services.memory_set_enabled(user=user, enabled=body.memory_enabled)
    except ValidationError as exc:
        raise ApiError(400, "invalid_request", exc.messages[0]) from None
    return _memory_json(user)


@api_view("GET", "PATCH")
async def user_memory(request: HttpRequest, user_id: int) -> JsonResponse:
    """``GET`` -> 200 ``{"memory_enabled", "facts": [{"fact_id", "text", "source",
    "source_conversation_id", "created_at"}]}``, newest first. ``PATCH`` -> 200 with the same
    shape after the change. A near-duplicate of a stored fact is skipped (not an error).
    404 when ``user_id`` is not the caller's; 400 for a body that does not match
    (unknown fields, wrong JSON types, malformed fact ids, more than ``ADD_MAX`` facts, an empty
    fact or one over ``CHAT_MEMORY_FACT_CHARS`` characters, more than
    ``CHAT_MEMORY_MAX_FACTS_PER_USER`` in all); 415 when it is not JSON."""
    user = request.api_user
    if user_id != user.pk:
        raise Http404("No such user.")
    if request.method == "PATCH":
        body = parse_json(request, MemoryPatch)
        if not body.add and not body.remove and body.memory_enabled is None:
            raise ApiError(400, "invalid_request", "Nothing to change: send 'add', 'remove' or 'memory_enabled'.")
        if len(body.remove) > settings.CHAT_MEMORY_MAX_FACTS_PER_USER:
            raise ApiError(400, "invalid_request", "Too many fact ids in 'remove'.")
        return JsonResponse(await sync_to_async(_patch)(user, body))
    return JsonResponse(await sync_to_async(_memory_json)(user))
