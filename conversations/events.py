"""The events of a turn stream, written once for every writer and reader.

A turn stream (conversations/turnstream.py, mirrored to Redis by conversations/turnlog.py) is a
numbered list of SSE events: ``token`` (``{"text"}``) any number of times, for an answer that
calls functions one ``tool_call`` per call (``{"index", "id", "type": "function", "function":
{"name", "arguments"}}``, OpenAI's ``tool_calls`` item), then exactly one terminal event:

- ``done``: the answer is stored; ``finish_reason`` ``stop`` (the model ended), ``length`` (the
  completion budget ran out: the answer is cut off), ``tool_calls`` (it called functions: the
  event carries them as ``tool_calls`` too, so a stream resumed after it still sees them) or
  ``cancelled`` (Stop, or nobody came back within the grace period);
- ``moderation``: the output gate withdrew the answer (``finish_reason`` ``moderation``; the
  client removes what it showed);
- ``error``: the answer failed (``finish_reason`` ``error``; a message a person can act on).

:data:`TERMINAL_EVENTS` is the one list every reader ends on (in this process, from Redis in
another, and the cross-process cancel's wait).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

from conversations.models import Turn
from core.rendering import markdown_to_safe_html
from core.sse import sse_event
from moderation.gate import withdrawn_message

TERMINAL_EVENTS = frozenset({"done", "moderation", "error"})


def finish_reason_of(answer: Turn, finish_reason: str | None = None) -> str:
    """Why a stored (or held) answer ended: ``finish_reason`` when the stream knew it, else
    from the answer's status (``cancelled``, ``moderation`` for blocked, ``error`` for failed,
    else ``stop``)."""
    if finish_reason:
        return finish_reason
    return {
        Turn.Status.CANCELLED: "cancelled",
        Turn.Status.BLOCKED: "moderation",
        Turn.Status.FAILED: "error",
    }.get(answer.status, getattr(answer, "finish_reason", "") or "stop")


def usage_payload(answer: Turn) -> dict:
    """An answer's usage: prompt, cached and completion tokens, cost in USD as a decimal string
    (null when unknown)."""
    return {
        "prompt_tokens": answer.prompt_tokens or 0,
        "cached_tokens": answer.cached_tokens or 0,
        "completion_tokens": answer.token_count,
        "cost_usd": str(answer.cost_usd) if answer.cost_usd is not None else None,
    }


def done_payload(answer: Turn, finish_reason: str | None = None) -> dict:
    """The ``done`` event's data for a stored (or held) assistant turn: turn id, status,
    ``finish_reason`` (module docstring), usage, the pool and model version that answered, and
    the answer's sanitised HTML; ``tool_calls`` for an answer that called functions."""
    payload = {
        "turn_id": str(answer.turn_id),
        "status": answer.status,
        "finish_reason": finish_reason_of(answer, finish_reason),
        "usage": usage_payload(answer),
        "pool": answer.pool,
        "model_version": answer.model_version,
        "html": markdown_to_safe_html(answer.content),
    }
    if getattr(answer, "tool_calls", None):
        payload["tool_calls"] = answer.tool_calls
    return payload


def moderation_payload(answer: Turn) -> dict:
    """The ``moderation`` event's data: the output gate withdrew this answer. ``retract``: the
    client removes the partial answer it showed; ``message``: the notice to show instead;
    ``categories``: why; ``usage``: the tokens generated before it was stopped (charged)."""
    verdict = answer.moderation_verdict or {}
    categories = verdict.get("categories") or []
    return {
        "turn_id": str(answer.turn_id),
        "status": answer.status,
        "finish_reason": "moderation",
        "retract": True,
        "categories": categories,
        "message": withdrawn_message(categories),
        "usage": usage_payload(answer),
        "pool": answer.pool,
    }


def error_payload(answer_id: UUID, message: str) -> dict:
    """The ``error`` event's data: the answer's id and a message a person can act on."""
    return {"turn_id": str(answer_id), "finish_reason": "error", "message": message}


def terminal_event(answer: Turn, finish_reason: str | None = None) -> tuple[str, dict]:
    """The terminal event (name, data) of a stored answer: ``moderation`` for one the output
    gate withdrew, else ``done``."""
    if answer.status == Turn.Status.BLOCKED:
        return "moderation", moderation_payload(answer)
    return "done", done_payload(answer, finish_reason)


async def stored_answer_sse(answer: Turn) -> AsyncIterator[bytes]:
    """SSE for an answer already stored and no longer streaming: its terminal event (id 1)."""
    event, data = terminal_event(answer)
    yield sse_event(event, data, 1)
