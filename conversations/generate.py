"""Answering one conversation turn: the pipeline's run (gateway/run.py: generate with the output
gate beside the stream, one tally, one settle) rendered as turn-stream events, then persisted.

:func:`generation_start` starts the task for an admitted plan (conversations/plan.py); the task
publishes ``token`` events as the engine sends text and ends with exactly one terminal event
(conversations/events.py), after the answer is durable and settled. An answer asked for with
tools (the plan's ``tools``, inference/tool_format.py) is constrained as ``/v1/chat/completions``
constrains it, streams only its text (a ``<tool_call>`` block is held back), and publishes one
``tool_call`` event per call it made before its terminal event; it is stored with its
``tool_calls`` and ``finish_reason`` ``tool_calls`` (conversations/toolrounds.py).
"""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from uuid import UUID

from django.conf import settings

from conversations import answer_lock, cache, cancels, held, summaries, toolrounds, writeback
from conversations.events import error_payload, terminal_event
from conversations.locks import ensure_idle
from conversations.models import Turn
from conversations.turnplan import TurnPlan
from conversations.turnstream import TurnStream, stream_for_answer, stream_register, stream_release
from core.db import run_in_db_thread
from core.regions import new_turn_id
from gateway import run
from inference.engine import EngineUnavailable, GenerationOptions
from inference.tool_format import ToolCalling, ToolStream
from moderation.verdicts import Verdict

logger = logging.getLogger(__name__)


def generation_start(
    *,
    conversation_id: UUID,
    question: Turn,
    plan: TurnPlan,
    answer_id: UUID | None = None,
    zero_retention: bool = False,
    replaces_id: UUID | None = None,
    claimed: bool = False,
    continues: Turn | None = None,
) -> TurnStream:
    """Start answering ``question`` (a stored user turn) as a background task; return its stream.

    ``plan``: the admitted prompt, pool and budget (conversations/plan.py ``turn_plan``).
    ``zero_retention``: the conversation keeps nothing in PostgreSQL and only short-lived copies
    in Redis. ``replaces_id``: the answer the new one regenerates (stored as its ``replaces``).
    ``claimed``: the caller holds the conversation's claim (conversations/locks.py).
    ``continues``: the cut-off answer this one continues (Continue; ``plan``'s prompt ends with
    its text): the stored answer is its text, then the new; or the answer whose tool calls it
    follows (conversations/toolrounds.py): the stored answer is only the new text. Must be
    called from the server's event loop. Raises ConversationBusy if the conversation is already
    generating. The task holds the stream in the registry until its answer is stored.
    """
    if not claimed:
        ensure_idle(conversation_id)
    cancels.ensure_cancel_listener(_stop_local)
    stream = TurnStream(
        conversation_id=conversation_id,
        question_id=question.turn_id,
        answer_id=answer_id or new_turn_id(conversation_id),
        zero_retention=zero_retention,
        replaces_id=replaces_id,
        context_trimmed=plan.context_trimmed,
        plan=plan,
        continues_id=continues.turn_id if continues is not None else None,
        prefix=continues.content if continues is not None and not toolrounds.made_calls(continues) else "",
    )
    stream_register(stream)
    stream.task = asyncio.get_running_loop().create_task(
        _generate(stream, question), name=f"turn-{stream.answer_id}"
    )
    stream._schedule_abandon(settings.CHAT_STREAM_ATTACH_TIMEOUT_S)
    return stream


def _stop_local(answer_id: UUID) -> None:
    """Stop ``answer_id`` if it generates here (another process published its cancel)."""
    stream = stream_for_answer(answer_id)
    if stream is not None:
        stream.stop()


def _options(max_tokens: int, conversation_id: UUID, tools: ToolCalling | None = None) -> GenerationOptions:
    """Sampling for a turn; ``tools``: its function calling, whose ``required`` or named choice
    constrains the answer (structured output, inference/tool_format.py ``guided_schema``)."""
    return GenerationOptions(
        max_tokens=max_tokens,
        temperature=settings.CHAT_TEMPERATURE,
        stop=tuple(settings.CHAT_STOP),
        affinity=str(conversation_id),  # its turns go to one node of a pool (prefix cache)
        json_schema=tools.guided_schema() if tools is not None else None,
    )


def _texts(deltas: list[dict]) -> list[str]:
    """The text of a ToolStream's content deltas (its call deltas are read from the whole
    answer at the end: :func:`_tool_outcome`)."""
    return [d["content"] for d in deltas if d.get("content")]


def _finish_reason(answer: run.Answer, outcome: tuple[str, list[dict]] | None) -> str:
    """Why the answer ended, as stored and sent: ``tool_calls`` when it called functions (its
    settled status stays that of a model that stopped: complete), else the pipeline's."""
    return toolrounds.TOOL_CALLS if outcome and outcome[1] else (answer.finish_reason or "")


def _tool_outcome(tools: ToolCalling, answer: run.Answer) -> tuple[str, list[dict]]:
    """(content to store, calls) of a finished answer asked for with ``tools``: the calls it
    made and its text without them; its whole text and no calls when it ended otherwise than
    by itself (cut off, stopped, withdrawn, failed) or made none."""
    if answer.finish_reason not in (None, "stop"):
        return answer.text, []
    content, calls = tools.parse(answer.text)
    return (content or ""), calls


async def _generate(stream: TurnStream, question: Turn) -> None:
    """Drive the pipeline for one answer, publish its events, store the turn exactly once."""
    plan = stream.plan
    answer = run.Answer(run.Tally(prompt_tokens=len(plan.token_ids)))
    error: str | None = None
    output_gate = run.output_gate_for(plan.admitted, _on_flag(stream))
    tools = plan.tools if plan.tools is not None and plan.tools.mode != "none" else None
    shown = ToolStream(tools) if tools is not None else None
    options = _options(plan.max_tokens, stream.conversation_id, tools)
    try:
        async for text in run.generate(
            plan.admitted, plan.token_ids, options, str(stream.answer_id), answer,
            output_gate=output_gate, resume_attempts=settings.CHAT_ENGINE_RESUME_ATTEMPTS,
        ):  # fmt: skip
            for piece in _texts(shown.feed(text)) if shown is not None else [text]:
                stream.publish("token", {"text": piece})
    except asyncio.CancelledError:
        pass  # Stop, abandoned, deleted or withdrawn: answer.finish_reason says which
    except EngineUnavailable as exc:
        error = f"The model is unavailable right now ({exc}). Try again in a minute."
    except Exception:  # noqa: BLE001 - any failure must still end the stream readably
        logger.exception("generation failed for turn %s", stream.answer_id)
        answer.finish_reason = run.ERROR
        error = "Something went wrong while writing the answer. Try again."
    answer.flagged = answer.flagged or stream.blocked_verdict
    if answer.flagged is not None:
        answer.finish_reason = run.MODERATION
    if answer.finish_reason == run.MODERATION and answer.flagged is not None:
        # Before the terminal event: whoever hears "withdrawn" can find it under review.
        await _withdrawn_keep(stream, answer)
    outcome = None
    if tools is not None and error is None and answer.finish_reason != run.MODERATION:
        outcome = _tool_outcome(tools, answer)
        if not outcome[1]:  # no call: the text held back (a block that did not parse) is text after all
            for piece in _texts(shown.close()):
                stream.publish("token", {"text": piece})
        for index, call in enumerate(outcome[1]):
            stream.publish("tool_call", {"index": index, **call})
    await _finish(stream, question, answer, error, outcome)
    if plan.want_summary and not stream.zero_retention:
        await run_in_db_thread(summaries.summary_request, conversation_id=stream.conversation_id)


async def _withdrawn_keep(stream: TurnStream, answer: run.Answer) -> None:
    """Keep a withdrawn answer's text for review by its owner's organisation's admins or the
    site's admins (moderation/services.py; never for zero retention). Never raises: the answer
    is already settled and its client told."""
    from moderation import services as moderation_services  # noqa: PLC0415

    caller = stream.plan.admitted.caller
    try:
        await run_in_db_thread(
            moderation_services.withdrawn_answer_keep, conversation_id=stream.conversation_id,
            turn_id=stream.answer_id, owner_id=caller.user_id, org_id=caller.org_id,
            text=stream.prefix + answer.text, window=answer.flagged_window,
            verdict=answer.flagged.as_json(), zero_retention=stream.zero_retention,
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - review is a record, not part of the answer
        logger.exception("could not keep withdrawn answer %s for review", stream.answer_id)


def _on_flag(stream: TurnStream):
    """When the output gate flags the answer, abort its generation at once (it is stored as
    blocked, without its text)."""

    def on_flag(verdict: Verdict) -> None:
        stream.blocked_verdict = verdict
        task = stream.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    return on_flag


async def _despite_cancellation(awaitable) -> object:
    """Await ``awaitable`` to the end even if this task is cancelled meanwhile (a second Stop
    while the answer is being stored must not leave it unstored or the stream unclosed)."""
    task = asyncio.ensure_future(awaitable)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            continue


def _record(stream: TurnStream, question: Turn, answer: run.Answer, outcome: tuple[str, list[dict]] | None = None) -> dict:
    """The held record of the answer (conversations/held.py): a blocked answer keeps its
    verdict and none of the flagged text; its cost from the one cost function. ``outcome``:
    (content, calls) of an answer asked for with tools (:func:`_tool_outcome`)."""
    admitted = stream.plan.admitted
    pool = admitted.route.pool
    verdict = answer.flagged or answer.verdict
    return held.answer_record(
        conversation_id=stream.conversation_id,
        turn_id=stream.answer_id,
        reply_to_id=question.turn_id,
        # Continue: the plan's prompt ends with the continued text; the answer is it, then the new.
        content="" if answer.finish_reason == run.MODERATION else stream.prefix + (outcome[0] if outcome else answer.text),
        status=answer.status,
        prompt_tokens=answer.tally.prompt_tokens,
        completion_tokens=answer.tally.completion_tokens,
        zero_retention=stream.zero_retention,
        replaces_id=stream.replaces_id,
        context_trimmed=stream.context_trimmed,
        pool=pool.name,
        model_version=pool.version,
        cached_tokens=answer.tally.cached_tokens,
        # A withdrawn answer is not the user's cost (issue 28; the ledger has it as the operator's).
        cost_usd=Decimal(0) if answer.finish_reason == run.MODERATION else run.answer_cost(admitted, answer.tally),
        moderation_verdict=verdict.as_json() if verdict is not None else None,
        finish_reason=_finish_reason(answer, outcome),
        continues_id=stream.continues_id,
        ttft_ms=answer.ttft_ms,
        tpot_ms=answer.tpot_ms,
        tool_calls=outcome[1] if outcome else None,
    )


async def _finish(
    stream: TurnStream, question: Turn, answer: run.Answer, error: str | None, outcome: tuple[str, list[dict]] | None = None
) -> None:
    """Make the answer durable (shielded: a second cancel cannot lose it), settle it, free the
    conversation, then publish the terminal event.

    Durable means held in Redis with its write-back queued, or inserted at once when Redis is
    down (conversations/writeback.py). Settled means the unused part of the TPM reservation is
    refunded and the usage ledger has the answer's tokens and cost, once per answer, cancelled
    ones included (PF-R5). Whatever fails here (a record that cannot be built or stored) ends
    the stream with ``error``, never leaves the conversation busy."""
    status = answer.status
    stored: Turn | None = None
    try:
        record = _record(stream, question, answer, outcome)
        stored = held.record_turn(record)
        await _despite_cancellation(writeback.answer_finish(record=record))
        # Write-through: the next prompt and the page see the answer before PostgreSQL has it
        # (conversations/cache.py); never raises.
        await _despite_cancellation(cache.aturn_cached(stored, after=question.created_at))
    except Exception:  # noqa: BLE001
        logger.exception("could not store answer %s", stream.answer_id)
        error = error or "The answer could not be saved. Try again."
        status = Turn.Status.FAILED
    stream.status = status
    # Settled before the client hears the end: a next request sent the moment it arrives sees
    # the refunded tokens, and the usage page already lists this answer.
    await _despite_cancellation(
        run.settle(
            stream.plan.admitted, answer.tally, status=status, turn_id=stream.answer_id,
            conversation_id=stream.conversation_id, zero_retention=stream.zero_retention,
        )
    )  # fmt: skip
    # The conversation is free before the client hears the end: a next message sent the moment
    # it arrives must not get a 409 from a lock still held while the event log flushes.
    stream_release(stream)
    await _despite_cancellation(answer_lock.conversation_unlock(stream.conversation_id, stream.answer_id))
    if error is not None or stored is None:
        stream.publish("error", error_payload(stream.answer_id, error or "The answer failed."))
    else:
        stream.publish(*terminal_event(stored, _finish_reason(answer, outcome)))
    stream.close()
    await _despite_cancellation(stream.log.wait_flushed())
