"""A stored tool round (issue 30, conversations/toolrounds.py), written as the product writes
it: the question (services.turn_append_user), the answer that calls functions (an assistant turn
with ``tool_calls`` and finish_reason ``tool_calls``), the client's results
(services.turn_append_tools) and the answer after them (``continues`` = the calling answer, same
question). For the page, export, import and sharing tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from conversations import services
from conversations.models import Conversation, Turn

# (function name, arguments as a JSON text, result text)
WEATHER_CALLS = (
    ("get_weather", json.dumps({"city": "Paris"}), '{"temp_c": 21, "sky": "clear"}'),
    ("get_time", json.dumps({"tz": "Europe/Paris"}), "14:05"),
)


@dataclass(frozen=True)
class Round:
    question: Turn
    calling: Turn | None
    results: list[Turn]
    answer: Turn


def tool_round_seed(
    conversation: Conversation,
    *,
    question: str = "What is the weather in Paris?",
    calls=WEATHER_CALLS,
    answer: str = "It is 21 degrees and clear.",
) -> Round:
    """Append one exchange whose answer was written after ``calls`` (name, arguments, result)
    to ``conversation``'s branch shown; returns its turns."""
    parent = conversation.turns.filter(role=Turn.Role.USER).order_by("-created_at").first()
    asked = services.turn_append_user(
        conversation=conversation, content=question, parent_id=parent.turn_id if parent else None
    )
    now = timezone.now()
    if not calls:  # an ordinary exchange, for contrast
        plain = Turn.objects.create(
            conversation=conversation, role=Turn.Role.ASSISTANT, content=answer, reply_to_id=asked.turn_id,
            finish_reason="stop", created_at=now + timedelta(milliseconds=1),
        )  # fmt: skip
        Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=plain.created_at)
        conversation.last_turn_at = plain.created_at
        return Round(question=asked, calling=None, results=[], answer=plain)
    tool_calls = [
        {"id": f"call_{asked.turn_id.hex[:6]}_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args, _) in enumerate(calls)
    ]
    calling = Turn.objects.create(
        conversation=conversation, role=Turn.Role.ASSISTANT, content="", reply_to_id=asked.turn_id,
        tool_calls=tool_calls, finish_reason="tool_calls", status=Turn.Status.COMPLETE,
        created_at=now,
    )  # fmt: skip
    results = services.turn_append_tools(
        conversation=conversation, answer=calling,
        results=[(call["id"], result) for call, (_, _, result) in zip(tool_calls, calls, strict=True)],
    )  # fmt: skip
    final = Turn.objects.create(
        conversation=conversation, role=Turn.Role.ASSISTANT, content=answer, reply_to_id=asked.turn_id,
        continues_id=calling.turn_id, finish_reason="stop", status=Turn.Status.COMPLETE,
        created_at=results[-1].created_at + timedelta(milliseconds=1),
    )  # fmt: skip
    Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=final.created_at)
    conversation.last_turn_at = final.created_at
    return Round(question=asked, calling=calling, results=results, answer=final)


def conversation_with_round(owner, **fields) -> tuple[Conversation, Round]:
    """A new conversation of ``owner`` holding one tool round (:func:`tool_round_seed`)."""
    conversation = services.conversation_create(owner=owner)
    return conversation, tool_round_seed(conversation, **fields)
