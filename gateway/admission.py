"""The one admission sequence of every entrypoint (DESIGN.md, "One pipeline, every entrypoint").

:func:`admit` puts the pipeline's steps before any engine work in their one order, for the chat
page, ``/v1/conversations/{id}/turns`` (and regenerate, continue) and the OpenAI-compatible
``/v1/chat/completions`` and ``/v1/completions`` alike:

1. service-only fields: ``forwarded`` (a gateway's turn: tier and priority) and ``cache_salt``
   may come from the service credential only (403 otherwise);
2. input moderation starts on the text to check, beside the steps below (< 50 ms);
3. route (gate.route_for) -> shed (gate.shed_for) -> answer budget (gate.answer_budget);
4. prompt: the entrypoint's callback builds it for the chosen route and budget (a conversation's
   assembly, conversations/plan.py; an OpenAI message list, api/completions.py); a prompt the
   context cannot hold is a 400;
5. rate limit: RPM + TPM for prompt + budget (gate.rate_limit);
6. input verdict: a failed check is a 503, a flagged message an :class:`InputBlocked` (400
   ``content_blocked``), both after the reservation is given back;
7. policy: the moderation policy with the prompt's confidential instructions, which the output
   gate's leak check guards; and the tenant's prefix-cache salt (gateway/tenancy.py).

It returns one :class:`AdmittedPlan` or raises one refusal (gate.Refused or a subclass);
nothing is stored and the engine has done nothing either way. The entrypoints parse their
protocol, call this, and render; they never order these steps themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from gateway import gate, run
from gateway.tenancy import cache_salt_for
from inference.prompts import PromptTooLong
from inference.router import Route
from moderation.verdicts import Verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """What an entrypoint's prompt callback built for the chosen route.

    ``token_ids``: the prompt as the engine gets it; ``max_tokens``: the completion budget
    (tokens) left after it, at most the budget the callback was given; ``confidential``: the
    instructions in it that are ours, not the reader's (the pool's preamble, the site's prompt,
    a conversation's own prompt), for the output gate's leak check ("" for none);
    ``checked_text``: the text the input gate checks when :func:`admit` was given none because
    it is only known once routed (a token-id prompt decoded by the pool's tokenizer; None: no
    check); ``detail``: anything the entrypoint needs back (trimmed history counts)."""

    token_ids: list[int]
    max_tokens: int
    confidential: str = ""
    checked_text: str | None = None
    detail: object = None


# (route, completion budget in tokens) -> the prompt. May raise PromptTooLong (a 400 here) or
# gate.Refused itself.
PromptBuilder = Callable[[Route, int], Awaitable[Prompt]]


@dataclass(frozen=True)
class Forwarded:
    """A gateway's turn reaching its engine process (DESIGN.md, "Production topology"): the
    ``tier`` it is served and charged as and the engine ``priority`` its gateway routed it at."""

    tier: str
    priority: int


@dataclass
class AdmittedPlan:
    """One admitted request: ``admitted`` (caller, route, rate-limit decision, moderation policy,
    tier, cache salt: what gateway/run.py generates and settles with), the ``prompt`` and the
    input gate's ``verdict`` (None when nothing was checked; never flagged)."""

    admitted: run.Admitted
    prompt: Prompt
    verdict: Verdict | None = None

    @property
    def route(self) -> Route:
        return self.admitted.route

    @property
    def decision(self):
        return self.admitted.decision


class InputBlocked(gate.Refused):
    """The input gate flagged the message: 400 ``content_blocked`` with the verdict's categories.
    ``verdict`` is the flagged verdict. A conversation turn stores the message with it before
    refusing (conversations/plan.py ``ContentBlocked``, which adds the stored turn's id)."""

    def __init__(self, verdict: Verdict, details: dict | None = None):
        super().__init__(
            400, "content_blocked", verdict.message(),
            details={"categories": list(verdict.categories), **(details or {})},
        )  # fmt: skip
        self.verdict = verdict


def service_fields_check(caller: gate.Caller, *, forwarded: Forwarded | None, cache_salt: str | None) -> None:
    """Refuse (Refused 403 ``permission_denied``) fields only the service credential may send:
    ``admission`` (a gateway's turn for its engine process) and ``cache_salt`` (the tenant's
    prefix-cache salt, derived by the forwarding gateway: a client choosing its own salt could
    share another tenant's cache)."""
    if caller.service:
        return
    for name, value in (("admission", forwarded), ("cache_salt", cache_salt)):
        if value is not None:
            raise gate.Refused(
                403, "permission_denied",
                f"Only the service credential may set '{name}' (it carries a gateway's turn to its "
                "engine process); leave it out.",
            )  # fmt: skip


async def admit(
    *,
    caller: gate.Caller,
    model: str | None,
    max_tokens: int | None,
    build_prompt: PromptBuilder,
    checked_text: str | None = None,
    explicit_max_tokens: bool = False,
    fallback_model: str | None = None,
    forwarded: Forwarded | None = None,
    cache_salt: str | None = None,
) -> AdmittedPlan:
    """Admit one request (the module docstring has the order).

    ``caller``: whose tier, limits, policy and tenant apply (accounts/callers.py). ``model``:
    the model the request names (checked strictly; None: the tier's default, or
    ``fallback_model``, a conversation's, when the tier may still use it). ``max_tokens`` /
    ``explicit_max_tokens``: the requested answer budget (gate.answer_budget). ``build_prompt``:
    the entrypoint's prompt for (route, budget). ``checked_text``: the text the input gate
    checks (the new message; None: the prompt's ``checked_text``, else nothing). ``forwarded`` /
    ``cache_salt``: a forwarded turn's tier and priority and its gateway's salt (service
    credential only); otherwise the tier is the caller's and the salt their tenant's.

    Raises gate.Refused: 403 (a service-only field, a model the tier may not use), 404 (unknown
    model), 503 ``busy`` (shed) or ``moderation_unavailable``, 400 (a budget or prompt the
    context cannot hold, ``context_length_exceeded``; a request over a TPM limit), 429 (rate
    limited), :class:`InputBlocked` (400 ``content_blocked``); and whatever ``build_prompt``
    raises. A refusal after the rate limit gives the reserved tokens back."""
    service_fields_check(caller, forwarded=forwarded, cache_salt=cache_salt)
    check = run.input_check_start(caller, checked_text) if checked_text is not None else None
    try:
        route = gate.route_for(caller, model, fallback=fallback_model)
        route = await gate.shed_for(caller, route)
        budget = gate.answer_budget(caller, route.pool, max_tokens, explicit=explicit_max_tokens)
        try:
            prompt = await build_prompt(route, budget)
        except PromptTooLong as exc:
            pool = route.pool
            raise gate.Refused(
                400, "context_length_exceeded",
                f"{exc} (model {pool.name}: {pool.max_context:,} tokens of context)",
            ) from None  # fmt: skip
        if check is None and prompt.checked_text is not None:
            check = run.input_check_start(caller, prompt.checked_text)
        decision = await gate.rate_limit(caller, prompt_tokens=len(prompt.token_ids), max_tokens=prompt.max_tokens)
    except BaseException:
        await run.input_check_discard(check)
        raise
    if forwarded is not None:
        route = replace(route, priority=forwarded.priority)
    admitted = run.Admitted(
        caller=caller, route=route, decision=decision, tier=forwarded.tier if forwarded else "",
        forwarded=forwarded is not None, cache_salt=cache_salt or cache_salt_for(caller),
    )  # fmt: skip
    verdict = await run.input_verdict(check, admitted)  # a failed check: 503, tokens given back
    if verdict is not None and verdict.flagged:
        await gate.settle(decision, prompt_tokens=0, completion_tokens=0)
        raise InputBlocked(verdict)
    admitted.policy = run.policy_of(caller, prompt.confidential)
    return AdmittedPlan(admitted=admitted, prompt=prompt, verdict=verdict)
