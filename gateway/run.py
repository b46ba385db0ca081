"""The pipeline's run of one admitted request: the input gate's steps (started, discarded, its
verdict, as gateway/admission.py orders them), generate with the output gate beside the stream
and the tenant's cache salt on every engine request, one token tally, one settle
(gateway/__init__.py has the whole order).

Used by every entrypoint: conversation turns (conversations/generate.py) and the stateless
OpenAI endpoints (api/completions.py). What differs between them stays with them: a turn
persists its answer and publishes resumable events; a completion renders OpenAI chunks.

Finish reasons (the terminal event carries one, conversations/events.py): ``stop`` (the model
ended, or a stop string), ``length`` (the completion budget ran out), ``cancelled`` (Stop, a
client gone, a deletion), ``moderation`` (the output gate withdrew it), ``error`` (the engine
failed).

The service credential (background jobs, and a gateway forwarding a user's turn to its engine
process) passes no moderation gate here: background jobs summarise users' own text, and a
forwarded turn was checked by the gateway that forwarded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from uuid import UUID

from django.conf import settings
from django.db import models
from django.utils.module_loading import import_string

from core.db import run_in_db_thread
from gateway import gate
from gateway.tenancy import cache_salt_for
from inference.engine import Delta, EngineUnavailable, GenerationOptions
from inference.pools import pool_engine
from inference.router import Route
from inference.serving import pool_generate
from moderation.base import acheck
from moderation.gate import OutputGate
from moderation.verdicts import Policy, Verdict, policy_for

logger = logging.getLogger(__name__)

STOP, LENGTH, CANCELLED, MODERATION, ERROR = "stop", "length", "cancelled", "moderation", "error"
FINISH_REASONS = (STOP, LENGTH, CANCELLED, MODERATION, ERROR)


class Status(models.TextChoices):
    """The settled request's status: the same values as conversations.models.Turn.Status and
    usage.models.UsageRecord.Status (the gateway imports neither app; a test checks they
    agree)."""

    COMPLETE = "complete", "Complete"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"
    BLOCKED = "blocked", "Blocked"


@dataclass
class Admitted:
    """A request past the admission steps (gateway/gate.py): whose it is (``caller``), the pool
    that answers (``route``), the rate-limit ``decision`` (its reservation is settled once; None
    for the service credential or with Redis down), the moderation ``policy`` (thresholds,
    blocked terms, and the real system prompt for the output gate's leak check), and the
    ``tier`` it is served and charged as (``caller.usage_tier`` unless a gateway forwarded it).
    ``forwarded``: a gateway's turn reaching its engine process; the gateway settles it, so no
    ledger row is written here. ``cache_salt``: the prefix-cache salt every engine request of
    it carries (gateway/tenancy.py: the caller's tenant's unless given, as a forwarded turn
    brings its gateway's)."""

    caller: gate.Caller
    route: Route
    decision: object | None = None
    policy: Policy | None = None
    tier: str = ""
    forwarded: bool = False
    cache_salt: str = ""

    def __post_init__(self) -> None:
        self.tier = self.tier or self.caller.usage_tier
        self.cache_salt = self.cache_salt or cache_salt_for(self.caller)


@dataclass
class Tally:
    """The one token tally of an answer: ``prompt_tokens`` charged (the prompt as first sent),
    ``cached_tokens`` of it served from the prefix cache (the first attempt's, as the engine
    reported them; already within the prompt, inference/serving.py clamps them), and
    ``completion_tokens`` generated over every attempt (an engine restart continues the answer
    on a new request)."""

    prompt_tokens: int
    cached_tokens: int = 0
    completion_tokens: int = 0
    _earlier: int = 0  # completion tokens of the attempts before the current one
    _attempt: int = 0

    def add(self, delta: Delta) -> None:
        """Count one delta of the current attempt (the engine's counts are running totals)."""
        self.completion_tokens = self._earlier + delta.completion_tokens
        if self._attempt == 0:
            self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)

    def next_attempt(self) -> None:
        """The engine died; what follows comes from a new request continuing the answer."""
        self._earlier = self.completion_tokens
        self._attempt += 1


@dataclass
class Answer:
    """What one run produced so far: the text ``parts`` as sent, the ``tally``, why it ended
    (``finish_reason``, one of FINISH_REASONS; None while running), the output gate's last
    ``verdict`` and the ``flagged`` one if it withdrew the answer."""

    tally: Tally
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    verdict: Verdict | None = None
    flagged: Verdict | None = None
    flagged_window: str = ""  # the window of the answer the output gate flagged (for review)
    # time.perf_counter() seconds: made (generation starts), first and last text delta.
    started_at: float = field(default_factory=time.perf_counter)
    first_text_at: float | None = None
    last_text_at: float | None = None

    @property
    def ttft_ms(self) -> float | None:
        """Milliseconds from the start of generation (admission wait included) to the first
        text; None before any text."""
        if self.first_text_at is None:
            return None
        return round((self.first_text_at - self.started_at) * 1000, 2)

    @property
    def tpot_ms(self) -> float | None:
        """Milliseconds per output token after the first: (last text - first text) /
        (completion tokens - 1), as bench/harness.py ``tpot``; None below two tokens."""
        if self.first_text_at is None or self.last_text_at is None or self.tally.completion_tokens < 2:
            return None
        return round((self.last_text_at - self.first_text_at) * 1000 / (self.tally.completion_tokens - 1), 3)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def status(self) -> str:
        """The settled status for :attr:`finish_reason` (Status values)."""
        return {
            STOP: Status.COMPLETE, LENGTH: Status.COMPLETE, MODERATION: Status.BLOCKED,
            ERROR: Status.FAILED,
        }.get(self.finish_reason, Status.CANCELLED)  # fmt: skip


def policy_of(caller: gate.Caller, system_prompt: str = "") -> Policy:
    """``caller``'s moderation policy (their organisation's, else the defaults) with the request's
    real ``system_prompt`` for the output gate's leak check. Reads settings only (no query)."""
    base = caller.moderation or policy_for(None)
    return replace(base, system_prompt=system_prompt) if system_prompt else base


def input_check_start(caller: gate.Caller, text: str, policy: Policy | None = None) -> asyncio.Task | None:
    """Start the input gate on ``text`` now (DESIGN.md: input moderation < 50 ms, beside admission).

    The classifiers run while the caller assembles the prompt and takes the rate limits; the
    verdict is acted on after the rate limit (:func:`input_verdict`). Returns the task (its
    result is the verdict; a failing or slow classifier gives a flagged
    ``moderation_unavailable`` verdict unless the organisation fails open, PF-M2), or None while
    the gate is off (settings.CHAT_MODERATION_INPUT) or for the service credential. Cancel it
    with :func:`input_check_discard` if admission fails."""
    if not settings.CHAT_MODERATION_INPUT or caller.service:
        return None
    return asyncio.ensure_future(acheck("input", text, policy or policy_of(caller)))


async def input_check_discard(check: asyncio.Task | None) -> None:
    """Cancel a started input check whose request was not admitted (and consume its outcome)."""
    if check is None:
        return
    check.cancel()
    with contextlib.suppress(BaseException):
        await check


async def input_verdict(check: asyncio.Task | None, admitted: Admitted) -> Verdict | None:
    """The input gate's verdict (None: no check ran). A check that itself failed refuses the
    request: 503 ``moderation_unavailable`` with Retry-After, after the reserved tokens are
    given back (nothing is wrong with the message, so nothing is stored). A flagged message is
    returned for the caller to refuse: a turn stores it with its verdict first."""
    if check is None:
        return None
    verdict = await check
    if verdict.flagged and "moderation_unavailable" in verdict.categories:
        await gate.settle(admitted.decision, prompt_tokens=0, completion_tokens=0)
        raise gate.Refused(
            503, "moderation_unavailable", verdict.message(), {"Retry-After": "30"},
            details={"categories": list(verdict.categories)},
        )  # fmt: skip
    return verdict


def output_gate_for(admitted: Admitted, on_flag: Callable[[Verdict], None] | None = None) -> OutputGate | None:
    """The output gate of one answer, or None while settings.CHAT_MODERATION_OUTPUT is off or for
    the service credential. ``on_flag`` is called once with the flagged verdict (a turn stream
    cancels its generating task at once; the run also stops at the next delta)."""
    if not settings.CHAT_MODERATION_OUTPUT or admitted.caller.service:
        return None
    return OutputGate(admitted.policy or policy_of(admitted.caller), on_flag)


async def generate(
    admitted: Admitted,
    prompt_ids: list[int],
    options: GenerationOptions,
    request_id: str,
    answer: Answer,
    *,
    output_gate: OutputGate | None = None,
    resume_attempts: int = 0,
) -> AsyncIterator[str]:
    """Yield each text delta of the answer as the engine sends it (never an empty one).

    ``prompt_ids``: the assembled prompt (token ids); ``options``: sampling (its ``tier`` and
    ``cache_salt`` are set to ``admitted``'s); ``request_id``: the engine request id (``-rN`` appended on a resumed
    attempt); ``answer``: filled in as it goes (text, tally, finish reason, verdicts).

    The output gate, when given, is fed each delta after it was yielded (beside the stream,
    never delaying a token); once it flags, the run stops before the next delta (closing the
    engine request) and ``finish_reason`` is ``moderation``; at the end it checks the rest.
    ``resume_attempts``: how many times an engine that died mid-answer is waited for
    (settings.CHAT_ENGINE_RESTART_WAIT_S) and asked to continue from the prompt plus the text
    already sent (DESIGN.md: a brief TTFT spike, no data loss); 0 for non-resumable requests.

    Ends with ``answer.finish_reason`` set. On cancellation it is ``cancelled`` (or
    ``moderation`` when the gate's flag caused it) and CancelledError propagates. Raises
    EngineUnavailable when the engine cannot start or dies past the resume attempts
    (``finish_reason`` ``error``).
    """
    engine = pool_engine(admitted.route.pool)
    tally = answer.tally
    options = replace(options, tier=admitted.tier, cache_salt=admitted.cache_salt)
    try:
        for attempt in range(resume_attempts + 1):
            ids = prompt_ids + (engine.encode_text(answer.text) if answer.parts else [])
            budget = replace(options, max_tokens=max(1, options.max_tokens - tally.completion_tokens))
            rid = request_id + (f"-r{attempt}" if attempt else "")
            try:
                async with contextlib.aclosing(
                    pool_generate(admitted.route, ids, budget, rid, tier=admitted.tier)
                ) as deltas:
                    async for delta in deltas:
                        if output_gate is not None and output_gate.flagged is not None:
                            break  # withdrawn: closing the generator aborts the engine request
                        tally.add(delta)
                        answer.finish_reason = delta.finish_reason or answer.finish_reason
                        if delta.text:
                            answer.last_text_at = time.perf_counter()
                            if answer.first_text_at is None:
                                answer.first_text_at = answer.last_text_at
                            answer.parts.append(delta.text)
                            yield delta.text
                            if output_gate is not None:
                                output_gate.feed(delta.text)  # checked beside the stream, after sending
                break
            except EngineUnavailable:
                if attempt == resume_attempts:
                    raise
                logger.warning("engine died during %s; continuing after restart", request_id)
                tally.next_attempt()
                await engine.wait_ready(settings.CHAT_ENGINE_RESTART_WAIT_S)
        if output_gate is not None:
            answer.verdict = await output_gate.finish()
            answer.flagged = output_gate.flagged
        if answer.flagged is not None:
            answer.finish_reason = MODERATION
        elif answer.finish_reason not in (STOP, LENGTH):
            answer.finish_reason = STOP
    except asyncio.CancelledError:
        flagged = answer.flagged or (output_gate.flagged if output_gate is not None else None)
        answer.finish_reason = MODERATION if flagged is not None else CANCELLED
        raise
    except EngineUnavailable:
        answer.finish_reason = ERROR
        raise
    finally:
        if output_gate is not None:
            output_gate.cancel()
            answer.verdict = answer.flagged or output_gate.flagged or output_gate.verdict
            answer.flagged = answer.flagged or output_gate.flagged
            answer.flagged_window = output_gate.flagged_window


def answer_cost(admitted: Admitted, tally: Tally) -> Decimal:
    """The answer's cost in USD at the answering pool's prices, as the ledger stores it (the one
    cost function, inference/pools.py ``Pool.charge``)."""
    return admitted.route.pool.charge(
        prompt_tokens=tally.prompt_tokens,
        cached_tokens=tally.cached_tokens,
        completion_tokens=tally.completion_tokens,
    )


async def settle(
    admitted: Admitted,
    tally: Tally,
    *,
    status: str,
    turn_id: UUID | None = None,
    conversation_id: UUID | None = None,
    zero_retention: bool = False,
) -> None:
    """Settle one answer, once (PF-R5): refund the unused part of the TPM reservation (all of it
    for an answer the output gate withdrew: not the user's to pay, issue 28) and write the usage
    ledger row (tokens, cost, ``status`` a Status value: a ``blocked`` one is the operator's cost,
    usage/services.py; ``turn_id`` /
    ``conversation_id`` for a conversation turn, None for a completion; ``zero_retention``: the
    turn is kept nowhere at rest, so the ledger stores no id of it: usage_record). A forwarded turn
    writes no ledger row here (its gateway settles it). Never raises: the answer is already
    delivered; a failure is logged for the operator."""
    # A withdrawn answer is not the user's to pay for: nothing counts against their TPM either.
    withdrawn = status == Status.BLOCKED
    await gate.settle(
        admitted.decision, prompt_tokens=0 if withdrawn else tally.prompt_tokens,
        completion_tokens=0 if withdrawn else tally.completion_tokens,
    )  # fmt: skip
    if admitted.forwarded:
        return
    try:
        # The ledger's writer (usage.services.usage_record) by name: the gateway imports no app.
        await run_in_db_thread(
            import_string(settings.CHAT_USAGE_RECORDER), user=admitted.caller.user_id, org=admitted.caller.org_id,
            turn_id=turn_id, conversation_id=conversation_id, route_pool=admitted.route.pool, tier=admitted.tier,
            prompt_tokens=tally.prompt_tokens, cached_tokens=tally.cached_tokens,
            completion_tokens=tally.completion_tokens, status=status, zero_retention=zero_retention,
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - billing must not break the answer; logged for the operator
        logger.exception("could not record usage of %s", turn_id or "a completion")
