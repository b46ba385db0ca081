"""Generation runs as its own task per turn; HTTP responses only read its events.

DESIGN.md's disconnect rule needs the generating task to outlive any one HTTP response, so each
answer is a :class:`TurnStream`: a task that drives the engine and appends numbered events
(``token`` / ``done`` / ``error``) to a list, and any number of readers that replay the list
from a given event id and then follow it live. This is what lets a later issue resume a stream
with ``Last-Event-ID`` without rewriting the views.

Readers are counted. When the last one leaves before the answer is finished, the generation is
aborted after ``settings.CHAT_STREAM_DISCONNECT_GRACE_S`` seconds (0: at once) unless a reader
comes back; a generation nobody attaches to within ``CHAT_STREAM_ATTACH_TIMEOUT_S`` is aborted
too. An explicit stop aborts at once.

All of this lives in the server process's event loop; the registry is process-local.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings

from conversations import cache, retention, selectors, services, summaries, turnlog, writeback
from conversations.models import Turn
from conversations.rendering import markdown_to_safe_html
from core.db import run_in_db_thread
from core.sse import sse_comment, sse_event
from conversations.admission import (  # noqa: F401 - views reach these through this module
    ContentBlocked,
    TurnPlan,
    caller_of,
    refuse_unavailable,
    input_check_discard,
    input_check_start,
    memory_query_start,
    turn_plan,
)
from gateway import gate
from inference.engine import EngineUnavailable, GenerationOptions
from inference.pools import pool_engine
from inference.serving import pool_generate
from moderation.gate import OutputGate, withdrawn_message
from moderation.verdicts import Verdict
from usage import services as usage_services

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    """One SSE event of a turn stream; ``event_id`` counts from 1 within the stream."""

    event_id: int
    event: str
    data: dict[str, Any]


@dataclass
class TurnStream:
    """The in-flight answer to one user turn."""

    conversation_id: UUID
    question_id: UUID
    answer_id: UUID = field(default_factory=uuid.uuid4)
    # Zero-retention conversation (conversations/retention.py): short-lived Redis copies only.
    zero_retention: bool = False
    # The answer this one regenerates (conversations/versions.py), and how many earlier
    # exchanges its prompt left out or took from the summary (Turn.context_trimmed).
    replaces_id: UUID | None = None
    context_trimmed: int = 0
    # How this answer was admitted (pool, caller, prompt, rate-limit reservation): see TurnPlan.
    plan: TurnPlan | None = None
    # Set by the output gate when it flags the answer (moderation/gate.py): the generation is
    # aborted and the answer stored as blocked, without its text.
    blocked_verdict: Verdict | None = None
    events: list[StreamEvent] = field(default_factory=list)
    finished: bool = False
    status: str | None = None
    task: asyncio.Task | None = None
    readers: int = 0
    stop_requested: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _abandon_handle: asyncio.TimerHandle | None = None
    log: turnlog.TurnLogWriter | None = None

    def __post_init__(self) -> None:
        # Mirror to Redis so another process can resume this stream (conversations/turnlog.py).
        zdr = (settings.CHAT_ZDR_TTL_S, settings.CHAT_ZDR_STREAM_LINGER_S) if self.zero_retention else ()
        self.log = turnlog.TurnLogWriter(self.answer_id, self.question_id, self.conversation_id, *zdr)

    def publish(self, event: str, data: dict[str, Any]) -> None:
        """Append an event, wake every reader, and queue it for the Redis mirror."""
        event_id = len(self.events) + 1
        self.events.append(StreamEvent(event_id, event, data))
        self.log.append(event_id, event, data)
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """Mark the stream finished: readers drain what is left and end."""
        self.log.close()
        self.finished = True
        self._changed.set()
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()

    async def follow(
        self, after: int = 0, idle_s: float | None = None
    ) -> AsyncIterator[StreamEvent | None]:
        """Yield events with id > ``after``, then live ones, until the stream is finished.

        If ``idle_s`` seconds pass without a new event, yields None (the caller sends a
        keep-alive). Counts as a reader while iterating; when the last reader goes before the
        answer is finished, the disconnect rule (module docstring) decides when to abort.
        """
        self._attach()
        try:
            index = max(after, 0)
            while True:
                changed = self._changed
                while index < len(self.events):
                    yield self.events[index]
                    index += 1
                if self.finished:
                    return
                try:
                    await asyncio.wait_for(changed.wait(), idle_s)
                except TimeoutError:
                    yield None
        finally:
            self._detach()

    def _attach(self) -> None:
        self.readers += 1
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()
            self._abandon_handle = None

    def _detach(self) -> None:
        self.readers -= 1
        if self.readers == 0 and not self.finished:
            self._schedule_abandon(settings.CHAT_STREAM_DISCONNECT_GRACE_S)

    def _schedule_abandon(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        if self._abandon_handle is not None:
            self._abandon_handle.cancel()
        if delay_s <= 0:
            self._abandon_handle = None
            self._abandon()
        else:
            self._abandon_handle = loop.call_later(delay_s, self._abandon)

    def _abandon(self) -> None:
        if self.readers == 0 and not self.finished:
            logger.info("no reader for turn %s: aborting generation", self.answer_id)
            self.stop()

    def stop(self) -> None:
        """Abort the generation now (explicit stop, or abandoned). A no-op once finished or
        already stopping."""
        if self.stop_requested:
            return
        self.stop_requested = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def wait(self) -> None:
        """Wait until the answer is stored and the stream closed."""
        if self.task is not None:
            await asyncio.shield(self.task)


async def follow_sse(stream: TurnStream, after: int = 0) -> AsyncIterator[bytes]:
    """A turn stream as SSE bytes: a comment at once (the response starts before the first
    token), every event with its ``id:``, and a keep-alive comment after
    ``settings.CHAT_SSE_KEEPALIVE_S`` seconds without one."""
    yield sse_comment("stream")
    # aclosing: when the client goes, the reader detaches now, not whenever GC finalises it.
    async with aclosing(stream.follow(after=after, idle_s=settings.CHAT_SSE_KEEPALIVE_S)) as events:
        async for event in events:
            if event is None:
                yield sse_comment("keep-alive")
            else:
                yield sse_event(event.event, event.data, event.event_id)


def done_payload(
    *,
    answer_id: UUID,
    status: str,
    text: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
    cost_usd=None,
    pool: str = "",
    model_version: str = "",
) -> dict:
    """The ``done`` event's data: turn id, status, usage (prompt, cached and completion tokens,
    cost in USD as a decimal string, or null when unknown), the pool and model version that
    answered, and the answer's sanitised HTML."""
    return {
        "turn_id": str(answer_id),
        "status": status,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens or 0,
            "completion_tokens": completion_tokens,
            "cost_usd": str(cost_usd) if cost_usd is not None else None,
        },
        "pool": pool,
        "model_version": model_version,
        "html": markdown_to_safe_html(text),
    }


def answer_done_payload(answer: Turn) -> dict:
    """:func:`done_payload` for a stored (or held) assistant turn."""
    return done_payload(
        answer_id=answer.turn_id,
        status=answer.status,
        text=answer.content,
        prompt_tokens=answer.prompt_tokens or 0,
        completion_tokens=answer.token_count,
        cached_tokens=answer.cached_tokens,
        cost_usd=answer.cost_usd,
        pool=answer.pool,
        model_version=answer.model_version,
    )


def moderation_payload(answer: Turn) -> dict:
    """The ``moderation`` event's data: the output gate withdrew this answer. ``retract``: the
    client removes the partial answer it showed; ``message``: the notice to show instead;
    ``categories``: why; ``usage``: the tokens generated before it was stopped (charged)."""
    verdict = answer.moderation_verdict or {}
    categories = verdict.get("categories") or []
    return {
        "turn_id": str(answer.turn_id),
        "status": answer.status,
        "retract": True,
        "categories": categories,
        "message": withdrawn_message(categories),
        "usage": answer_done_payload(answer)["usage"],
        "pool": answer.pool,
    }


async def stored_answer_sse(answer: Turn) -> AsyncIterator[bytes]:
    """SSE for an answer already stored and no longer streaming: one ``done`` event (id 1), or
    ``moderation`` for an answer the output gate withdrew."""
    if answer.status == Turn.Status.BLOCKED:
        yield sse_event("moderation", moderation_payload(answer), 1)
    else:
        yield sse_event("done", answer_done_payload(answer), 1)


async def follow_remote_sse(answer_id: UUID, after: int = 0) -> AsyncIterator[bytes]:
    """Like :func:`follow_sse`, for a turn generated by another process: read from its Redis
    event log (conversations/turnlog.py)."""
    yield sse_comment("stream")
    async with aclosing(
        turnlog.follow(answer_id, after=after, idle_s=settings.CHAT_SSE_KEEPALIVE_S)
    ) as events:
        async for item in events:
            if item is None:
                yield sse_comment("keep-alive")
            else:
                event_id, event, data = item
                yield sse_event(event, data, event_id)


class ConversationBusy(Exception):
    """The conversation is still generating an answer; a new message must wait or stop it."""


_streams: dict[UUID, TurnStream] = {}  # question (user turn) id -> stream
_by_answer: dict[UUID, TurnStream] = {}  # answer (assistant turn) id -> stream
_busy: dict[UUID, TurnStream] = {}  # conversation id -> its in-flight stream
_claimed: set[UUID] = set()  # conversations whose next user turn is being written


def stream_for_question(question_id: UUID) -> TurnStream | None:
    """The in-flight (or just finished, still held) stream answering ``question_id``."""
    return _streams.get(question_id)


def stream_for_answer(answer_id: UUID) -> TurnStream | None:
    """The stream writing assistant turn ``answer_id``, while it is held."""
    return _by_answer.get(answer_id)


def stream_for_conversation(conversation_id: UUID) -> TurnStream | None:
    """The conversation's unfinished stream, if one is generating."""
    stream = _busy.get(conversation_id)
    return stream if stream is not None and not stream.finished else None


def ensure_idle(conversation_id: UUID) -> None:
    """Raise ConversationBusy if the conversation is generating an answer right now (or a
    message to it is being stored)."""
    if stream_for_conversation(conversation_id) is not None or conversation_id in _claimed:
        raise ConversationBusy(BUSY_MESSAGE)


BUSY_MESSAGE = "An answer is still being written in this conversation. Wait for it or press Stop."


async def stop_anywhere(*, conversation_id: UUID, answer_id: UUID | None = None) -> None:
    """Stop the conversation's generating answer (``answer_id`` if given), whichever server
    process runs it, and return once it is stored as cancelled (bounded wait)."""
    stream = stream_for_answer(answer_id) if answer_id else stream_for_conversation(conversation_id)
    if stream is not None and stream.conversation_id == conversation_id:
        stream.stop()
        await stream.wait()
        return
    holder = await turnlog.conversation_holder(conversation_id)
    if holder is not None and (answer_id is None or holder == answer_id):
        await turnlog.cancel_elsewhere(holder)


def _stop_local(answer_id: UUID) -> None:
    stream = stream_for_answer(answer_id)
    if stream is not None:
        stream.stop()


@contextlib.asynccontextmanager
async def _claim(conversation_id: UUID, answer_id: UUID) -> AsyncIterator[None]:
    """Claim the conversation for a new answer ``answer_id`` for the block's duration.

    Checked and claimed in this process with no await in between (so atomic in the event loop),
    then across server processes with Redis SET NX (conversations/turnlog.py): of two requests
    at the same moment one proceeds and the other gets ConversationBusy with nothing stored
    (PF-P1). If the block raises, the cross-process lock is released again.
    """
    ensure_idle(conversation_id)
    _claimed.add(conversation_id)
    try:
        if not await turnlog.conversation_lock(conversation_id, answer_id):
            raise ConversationBusy(BUSY_MESSAGE)
        try:
            yield
        except BaseException:
            await turnlog.conversation_unlock(conversation_id, answer_id)
            raise
    finally:
        _claimed.discard(conversation_id)


async def turn_submit(
    *,
    conversation,
    content: str,
    caller: gate.Caller | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    explicit_max_tokens: bool = False,
    replaces: Turn | None = None,
) -> tuple[Turn, TurnStream]:
    """Store a user message and start answering it; returns (user turn, answer stream).

    ``caller``: whose tier, limits and pins apply (default: the conversation's owner in its
    organisation). ``model``: the pool this message asks for (becomes the conversation's
    model); ``max_tokens`` / ``explicit_max_tokens``: see gate.answer_budget. ``replaces``: the
    user turn this message edits (a user turn of this conversation, checked by the caller);
    the edit is a new turn in its place (conversations/versions.py).

    The conversation is claimed *before* anything is written (check and claim with no await
    between them, so atomic in the event loop): of two messages sent at the same moment one is
    answered and the other gets ConversationBusy with nothing stored (PF-P1). The answer is
    admitted (:func:`turn_plan`: route, shed, prompt, rate limits) before the message is
    stored, so a refused message leaves nothing behind.
    The message then passes the input moderation gate: a flagged one is stored with its
    verdict and status ``blocked`` and never answered (ContentBlocked); a failed check refuses
    the turn with nothing stored (503, unless the organisation chose fail-open).
    Raises ValidationError for an invalid message, ConversationBusy while an answer is written,
    gate.Refused when the answer is not admitted (ContentBlocked when moderation stopped it).
    """
    conversation_id = conversation.conversation_id
    answer_id = uuid.uuid4()
    text = services.message_clean(content)
    # Memory retrieval's query embedding starts now, beside the claim, caller and history reads.
    memory_query = memory_query_start(text)
    caller = await caller_of(conversation, caller)
    async with _claim(conversation_id, answer_id):
        draft = Turn(
            conversation_id=conversation_id, role=Turn.Role.USER, content=text,
            replaces_id=replaces.turn_id if replaces is not None else None,
        )  # fmt: skip
        # The input gate's classifiers run beside admission; their verdict is read after it.
        check = input_check_start(caller, text)
        try:
            plan = await turn_plan(
                conversation=conversation, caller=caller, question=draft, model=model,
                max_tokens=max_tokens, explicit_max_tokens=explicit_max_tokens, planned=True,
                memory_query=memory_query,
            )  # fmt: skip
        except BaseException:
            await input_check_discard(check)
            raise
        verdict = await check if check is not None else None
        blocked = verdict is not None and verdict.flagged
        if blocked and "moderation_unavailable" in verdict.categories:
            await refuse_unavailable(plan, verdict)
        previous_turn_at = conversation.last_turn_at  # the append moves it
        try:
            question = await sync_to_async(services.turn_append_user)(
                conversation=conversation, content=text, replaces=replaces,
                moderation_verdict=verdict.as_json() if verdict is not None else None,
                blocked=blocked,
            )  # fmt: skip
            if model and model != conversation.model:
                await sync_to_async(services.conversation_model_set)(conversation=conversation, model=model)
        except BaseException:
            await gate.settle(plan.decision, prompt_tokens=0, completion_tokens=0)
            raise
        # Write-through to the hot cache (conversations/cache.py); never raises.
        await cache.aturn_cached(question, after=previous_turn_at)
        if blocked:  # stored with its verdict; the engine never sees it
            await gate.settle(plan.decision, prompt_tokens=0, completion_tokens=0)
            raise ContentBlocked(question, verdict)
        zero_retention = await sync_to_async(retention.conversation_zero_retention)(conversation)
        stream = generation_start(
            conversation_id=conversation_id,
            question=question,
            plan=plan,
            answer_id=answer_id,
            zero_retention=zero_retention,
            _claimed_by_caller=True,
        )
    return question, stream


async def answer_regenerate(
    *,
    conversation,
    answer: Turn,
    caller: gate.Caller | None = None,
    model: str | None = None,
    max_tokens: int | None = None,
    explicit_max_tokens: bool = False,
) -> tuple[Turn, TurnStream]:
    """Answer ``answer``'s question again; returns (that question, the new answer's stream).

    Append-only (conversations/versions.py): the new answer is a new assistant turn with
    ``replaces`` = ``answer`` and the same ``reply_to``; the old one stays as an earlier
    version. Claimed and admitted as in :func:`turn_submit` (PF-P1). ``answer`` must be an
    assistant turn of ``conversation`` (checked by the caller). Raises ConversationBusy while
    an answer is written, Http404 if its question is gone, gate.Refused when not admitted.
    """
    conversation_id = conversation.conversation_id
    answer_id = uuid.uuid4()
    caller = await caller_of(conversation, caller)
    async with _claim(conversation_id, answer_id):
        question = await sync_to_async(selectors.user_turn_get)(
            conversation=conversation, turn_id=answer.reply_to_id
        )
        plan = await turn_plan(
            conversation=conversation, caller=caller, question=question, model=model,
            max_tokens=max_tokens, explicit_max_tokens=explicit_max_tokens,
        )  # fmt: skip
        zero_retention = await sync_to_async(retention.conversation_zero_retention)(conversation)
        stream = generation_start(
            conversation_id=conversation_id,
            question=question,
            plan=plan,
            answer_id=answer_id,
            zero_retention=zero_retention,
            replaces_id=answer.turn_id,
            _claimed_by_caller=True,
        )
    return question, stream


def generation_start(
    *,
    conversation_id: UUID,
    question: Turn,
    plan: TurnPlan,
    answer_id: UUID | None = None,
    zero_retention: bool = False,
    replaces_id: UUID | None = None,
    _claimed_by_caller: bool = False,
) -> TurnStream:
    """Start answering ``question`` (a stored user turn) as a background task; return its stream.

    ``plan``: the admitted prompt, pool and budget (:func:`turn_plan`). ``zero_retention``: the
    conversation keeps nothing in PostgreSQL and only short-lived copies in Redis.
    ``replaces_id``: the answer the new one regenerates (stored as its ``replaces``). Must be
    called from the server's event loop. Raises ConversationBusy if the conversation is already
    generating. The task holds the stream in the registry until its answer is stored.
    """
    if not _claimed_by_caller:
        ensure_idle(conversation_id)
    turnlog.ensure_cancel_listener(_stop_local)
    stream = TurnStream(
        conversation_id=conversation_id,
        question_id=question.turn_id,
        answer_id=answer_id or uuid.uuid4(),
        zero_retention=zero_retention,
        replaces_id=replaces_id,
        context_trimmed=plan.context_trimmed,
        plan=plan,
    )
    _streams[question.turn_id] = stream
    _by_answer[stream.answer_id] = stream
    _busy[conversation_id] = stream
    stream.task = asyncio.get_running_loop().create_task(
        _generate(stream, question), name=f"turn-{stream.answer_id}"
    )
    stream._schedule_abandon(settings.CHAT_STREAM_ATTACH_TIMEOUT_S)
    return stream


def _options(max_tokens: int) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=max_tokens,
        temperature=settings.CHAT_TEMPERATURE,
        stop=tuple(settings.CHAT_STOP),
    )


_db = run_in_db_thread


@dataclass
class _Usage:
    """Token counts of one answer so far (running totals from the engine)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


async def _generate(stream: TurnStream, question: Turn) -> None:
    """Drive the engine for one answer, publish its events, store the turn exactly once."""
    plan = stream.plan
    engine = pool_engine(plan.route.pool)
    parts: list[str] = []
    usage = _Usage(prompt_tokens=len(plan.token_ids))
    status = Turn.Status.FAILED
    error: str | None = None
    output_gate = _output_gate(stream)
    try:
        await engine.ensure_started()
        earlier_tokens = 0  # completion tokens of attempts before an engine restart
        for attempt in range(settings.CHAT_ENGINE_RESUME_ATTEMPTS + 1):
            # After an engine restart the prompt is prefilled again with the text already
            # streamed, so the answer continues where it stopped and nothing sent is lost.
            ids = plan.token_ids + (engine.encode_text("".join(parts)) if parts else [])
            budget = plan.max_tokens - earlier_tokens
            request_id = str(stream.answer_id) + (f"-r{attempt}" if attempt else "")
            try:
                async for delta in pool_generate(
                    plan.route, ids, _options(budget), request_id, tier=plan.caller.usage_tier
                ):
                    usage.completion_tokens = earlier_tokens + delta.completion_tokens
                    if attempt == 0:
                        usage.cached_tokens = max(usage.cached_tokens, delta.cached_tokens)
                    if delta.text:
                        parts.append(delta.text)
                        stream.publish("token", {"text": delta.text})
                        if output_gate is not None:
                            output_gate.feed(delta.text)  # checked beside the stream, after sending
                break
            except EngineUnavailable:
                if attempt == settings.CHAT_ENGINE_RESUME_ATTEMPTS:
                    raise
                logger.warning("engine died during turn %s; continuing after restart", stream.answer_id)
                earlier_tokens = usage.completion_tokens
                await engine.wait_ready(settings.CHAT_ENGINE_RESTART_WAIT_S)
        status = Turn.Status.COMPLETE
        if output_gate is not None and await output_gate.finish() is not None and output_gate.flagged:
            stream.blocked_verdict = output_gate.flagged
            status = Turn.Status.BLOCKED
    except asyncio.CancelledError:
        status = Turn.Status.BLOCKED if stream.blocked_verdict is not None else Turn.Status.CANCELLED
    except EngineUnavailable as exc:
        error = f"The model is unavailable right now ({exc}). Try again in a minute."
    except Exception:  # noqa: BLE001 - any failure must still end the stream readably
        logger.exception("generation failed for turn %s", stream.answer_id)
        error = "Something went wrong while writing the answer. Try again."
    if output_gate is not None:
        output_gate.cancel()
    verdict = stream.blocked_verdict or (output_gate.verdict if output_gate is not None else None)
    # A blocked answer keeps its verdict and none of the flagged text.
    text = "" if status == Turn.Status.BLOCKED else "".join(parts)
    await _finish(stream, question, text, status, error, usage, verdict)
    if plan.want_summary and not stream.zero_retention:
        await _db(summaries.summary_request, conversation_id=stream.conversation_id)


def _output_gate(stream: TurnStream) -> OutputGate | None:
    """The output moderation gate of ``stream`` (None while settings.CHAT_MODERATION_OUTPUT is
    off). When it flags, the generation is aborted at once (``stop``) and stored as blocked."""
    if not settings.CHAT_MODERATION_OUTPUT:
        return None

    def on_flag(verdict: Verdict) -> None:
        stream.blocked_verdict = verdict
        if stream.task is not None and not stream.task.done() and stream.task is not asyncio.current_task():
            stream.task.cancel()

    return OutputGate(stream.plan.policy, on_flag)


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


async def _finish(
    stream: TurnStream,
    question: Turn,
    text: str,
    status: str,
    error: str | None,
    usage: _Usage,
    verdict: Verdict | None = None,
) -> None:
    """Make the answer durable (shielded: a second cancel cannot lose it), then publish the end.

    Durable means held in Redis with its write-back queued, or inserted at once when Redis is
    down (conversations/writeback.py). Then the unused part of the TPM reservation is refunded
    and the usage ledger gets the answer's tokens and cost, once per answer, cancelled ones
    included (PF-R5); only then is ``done`` sent."""
    pool = stream.plan.route.pool
    # Rounded as the usage ledger stores it (8 decimal places, half up), so the turn, the
    # `done` event and the ledger agree to the last digit.
    cost = pool.cost(
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
    ).quantize(usage_services.COST_QUANTUM, rounding=ROUND_HALF_UP)
    record = writeback.answer_record(
        conversation_id=stream.conversation_id,
        turn_id=stream.answer_id,
        reply_to_id=question.turn_id,
        content=text,
        status=status,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        zero_retention=stream.zero_retention,
        replaces_id=stream.replaces_id,
        context_trimmed=stream.context_trimmed,
        pool=pool.name,
        model_version=pool.version,
        cached_tokens=usage.cached_tokens,
        cost_usd=cost,
        moderation_verdict=verdict.as_json() if verdict is not None else None,
    )
    store = writeback.answer_finish(record=record)
    answer = writeback.record_turn(record)
    try:
        await _despite_cancellation(store)
        # Write-through: the next prompt and the page see the answer before PostgreSQL has it
        # (conversations/cache.py); never raises.
        await _despite_cancellation(cache.aturn_cached(answer, after=question.created_at))
    except Exception:  # noqa: BLE001
        logger.exception("could not store answer %s", stream.answer_id)
        error = error or "The answer could not be saved. Try again."
        status = Turn.Status.FAILED
    stream.status = status
    # Charged and refunded before the client hears the end: a next request sent the moment
    # `done` arrives sees the refunded tokens, and the usage page already lists this answer.
    await _despite_cancellation(_account(stream, status, usage, cost))
    # The conversation is free before the client hears the end: a next message sent the moment
    # `done` arrives must not get a 409 from a lock still held while the event log flushes.
    if _busy.get(stream.conversation_id) is stream:
        del _busy[stream.conversation_id]
    await _despite_cancellation(turnlog.conversation_unlock(stream.conversation_id, stream.answer_id))
    if error is not None:
        stream.publish("error", {"turn_id": str(stream.answer_id), "message": error})
    elif status == Turn.Status.BLOCKED:
        stream.publish("moderation", moderation_payload(answer))
    else:
        stream.publish("done", answer_done_payload(answer))
    stream.close()
    await _despite_cancellation(stream.log.wait_flushed())
    # Keep the finished stream briefly so a reader that connects late still gets the end.
    loop = asyncio.get_running_loop()
    loop.call_later(settings.CHAT_STREAM_RETAIN_S, _streams.pop, stream.question_id, None)
    loop.call_later(settings.CHAT_STREAM_RETAIN_S, _by_answer.pop, stream.answer_id, None)


async def _account(stream: TurnStream, status: str, usage: _Usage, cost) -> None:
    """Refund the unused TPM reservation and write the usage ledger row for this answer
    (usage/services.py). Never raises: the answer is already delivered and stored."""
    plan = stream.plan
    await gate.settle(
        plan.decision, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens
    )
    try:
        await _db(
            usage_services.usage_record,
            user=plan.caller.user_id,
            org=plan.caller.org_id,
            turn_id=stream.answer_id,
            conversation_id=stream.conversation_id,
            route_pool=plan.route.pool,
            tier=plan.caller.usage_tier,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            status=status,
        )
    except Exception:  # noqa: BLE001 - billing must not break the chat; logged for the operator
        logger.exception("could not record usage of turn %s", stream.answer_id)
