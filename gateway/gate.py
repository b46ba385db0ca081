"""The pipeline's steps before any engine work (gateway/__init__.py has the whole order): who
the caller is (:class:`Caller`, built by accounts/callers.py), route to a pool, shed under load,
the answer budget, the rate limit.

The rate limit charges TPM as prompt + max_tokens, so the prompt must be assembled (tokenised, no
engine work) before the buckets are taken; everything here still happens before any engine
work and before anything is stored, so a refusal loses nothing and costs the engine nothing.

The steps, which gateway/admission.py ``admit`` puts in their one order for every entrypoint
(conversation turns and the stateless OpenAI endpoints alike):

1. :func:`route_for` - (tier, org pin, feature flags, experiment arm, canary) -> a pool
   (inference/router.py); an unknown model is a 400, a model the tier may not use a 403.
2. :func:`shed_for` - the engine's queue depth decides (the local admission queue, or a remote
   engine node's ``vllm:num_requests_waiting``): shed free-tier turns (503), then degrade paid
   turns to ``mini``, then queue reasoning turns last (router.shed).
3. :func:`answer_budget` - the completion budget: the request's ``max_tokens`` within the tier's
   and pool's ceilings; ``max_tokens`` beyond the pool's context is a 400.
4. :func:`rate_limit` - RPM + TPM token buckets for the user and their organisation in one
   atomic step (inference/ratelimit.py); refused: 429 with Retry-After.
5. After the answer: :func:`settle` refunds the unused TPM reservation (PF-R1, PF-R2).

Every refusal is a :class:`Refused` carrying the HTTP status, an error code, a message a person
can act on, and headers (Retry-After, X-RateLimit-Remaining-*); views render it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.conf import settings

from core import metrics
from core.errors import ApiError
from inference import ratelimit, router
from inference.pools import Pool, pool_set
from inference.router import Route

logger = logging.getLogger(__name__)


class Refused(ApiError):
    """A request refused before any engine work: ``status`` (HTTP), ``code`` (the /v1 error
    type, also ``type``), ``message`` (for a person), ``headers`` (to send with the refusal),
    ``details`` (extra fields of the /v1 error object). Rendered like any ApiError
    (core/http.py ``api_view``); the pages show its message."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        details: dict | None = None,
    ):
        super().__init__(status, code, message, headers, details)

    @property
    def code(self) -> str:
        return self.type


@dataclass(frozen=True)
class Caller:
    """Who a request is for, as routing and limits see it: the user, their tier, the
    organisation whose limits and pin apply (None: none), feature flags, and whether it is the
    service credential (background jobs: no limits, lowest priority).

    Built from the account by the accounts app (accounts/callers.py ``caller_for``): the gateway
    reads no account model itself, it receives these values."""

    user_id: int
    tier: str
    org_id: int | None = None
    org_tier: str | None = None
    org_pin: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)
    service: bool = False
    # The moderation policy of the organisation (thresholds, blocked terms, fail-open;
    # moderation/verdicts.py Policy), or the defaults.
    moderation: object | None = None
    # The organisation's own RPM / TPM limits (Organisation.rate_limit_rpm / _tpm), replacing
    # its tier's; None: the tier's (ratelimit.limits_for).
    org_rpm: int | None = None
    org_tpm: int | None = None
    # The organisation shares one prefix cache among its members
    # (Organisation.share_prefix_cache): its turns use the organisation's cache salt, not the
    # user's (gateway/tenancy.py).
    org_shares_cache: bool = False

    @property
    def usage_tier(self) -> str:
        """The tier label for metrics and the usage ledger: ``background`` for the service
        credential's jobs (whatever tier its account has), else the user's tier."""
        return "background" if self.service else self.tier


def route_for(caller: Caller, requested: str | None = None, *, fallback: str | None = None) -> Route:
    """The pool for ``caller``'s request. ``requested``: the model the request names (a pool
    name, ``name@version``, or the served model's name; None: the tier's default), checked
    strictly. ``fallback``: a model remembered from earlier (the conversation's), used when
    nothing is requested and silently replaced by the tier default if the tier may no longer
    use it. Raises Refused 404 (unknown model), 400 (a bad org pin) or 403 (not allowed for the
    tier)."""
    pools = pool_set()

    def attempt(model: str | None) -> Route:
        return router.route(
            router.RouteRequest(
                user_id=caller.user_id, tier=caller.tier, requested=model,
                org_pin=caller.org_pin, flags=caller.flags,
            ),
            pools=pools, canaries=settings.CHAT_CANARIES, experiments=settings.CHAT_EXPERIMENTS,
        )  # fmt: skip

    try:
        if requested:
            return attempt(requested)
        if fallback:
            try:
                return attempt(fallback)
            except router.RouteError:
                pass
        return attempt(None)
    except router.RouteError as exc:
        # An unknown model is a 404 ``model_not_found``, as OpenAI's API answers it (clients
        # such as the official SDK raise NotFoundError for it).
        status = 404 if exc.code == "model_not_found" else exc.status
        raise Refused(status, exc.code, exc.message) from None


async def shed_for(caller: Caller, route: Route) -> Route:
    """Apply load shedding to ``route`` from its engine's queue depth (router.shed on
    serving.pool_waiting: the local admission queue, or a remote engine node's own) and the
    estimated wait there (serving.pool_expected_wait_s); thresholds in settings.CHAT_SHED_*.
    Background jobs are never shed. Returns the route to use (maybe degraded to ``mini`` or
    queued last). Raises Refused 503 ``busy`` with Retry-After when the caller's turn is
    shed."""
    if caller.service:
        return route
    # noqa below: imports the engine layer, only when a turn is shed-checked
    from inference.serving import pool_expected_wait_s, pool_waiting  # noqa: PLC0415

    waiting = await pool_waiting(route.pool)
    try:
        return router.shed(
            route, tier=caller.tier, waiting=waiting, pools=pool_set(),
            expected_wait_s=pool_expected_wait_s(route.pool),
        )  # fmt: skip
    except router.Overloaded as exc:
        retry = max(1, int(exc.retry_after_s))
        raise Refused(503, "busy", exc.message, {"Retry-After": str(retry)}) from None


def answer_budget(caller: Caller, pool: Pool, requested: int | None, *, explicit: bool) -> int:
    """Completion tokens one answer may use: ``requested`` (None: settings.CHAT_MAX_TOKENS)
    capped at the tier's ceiling (settings.CHAT_MAX_TOKENS_CEILING_BY_TIER) and the pool's
    ``max_tokens``. ``explicit``: the caller asked for ``requested`` by name (a /v1 field):
    then ``max_tokens`` <= 0 or beyond the pool's context is a Refused 400 naming the limit,
    rather than silently capped."""
    if explicit and requested is not None:
        if requested <= 0:
            raise Refused(400, "invalid_request", "max_tokens must be at least 1.")
        if requested >= pool.max_context:
            raise Refused(
                400, "context_length_exceeded",
                f"max_tokens {requested:,} does not fit the {pool.name} model's context of "
                f"{pool.max_context:,} tokens (prompt included); it answers with at most "
                f"{pool.max_tokens:,} tokens.",
            )  # fmt: skip
    tier_ceiling = settings.CHAT_MAX_TOKENS_CEILING_BY_TIER.get(caller.tier, settings.CHAT_MAX_TOKENS)
    return max(1, min(requested or settings.CHAT_MAX_TOKENS, tier_ceiling, pool.max_tokens))


async def rate_limit(
    caller: Caller, *, prompt_tokens: int, max_tokens: int, now: float | None = None
) -> ratelimit.Decision | None:
    """Take one request and prompt + max_tokens tokens from the caller's RPM and TPM
    buckets (user and organisation, atomically). Returns the decision (its ``headers()`` go on
    the response and its ``reservation`` to :func:`settle`), or None for the service
    credential (never limited). ``now``: the limiter's clock (tests; None: Redis's). Raises
    Refused 429 (with Retry-After and the remaining-quota headers) when a bucket is short, 400
    when prompt + max_tokens exceeds a TPM limit outright."""
    if caller.service:
        return None
    user_limits, org_limits = ratelimit.limits_for(
        tier=caller.tier, org_tier=caller.org_tier, org_rpm=caller.org_rpm, org_tpm=caller.org_tpm
    )
    try:
        decision = await ratelimit.rate_limit_take(
            user_id=caller.user_id, org_id=caller.org_id, user_limits=user_limits,
            org_limits=org_limits, tokens=prompt_tokens + max_tokens, now=now,
            prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        )  # fmt: skip
    except ratelimit.RequestTooLarge as exc:
        raise Refused(400, "request_too_large", str(exc)) from None
    if not decision.allowed:
        scope, _, limit = (decision.limited_by or "user rpm").partition(" ")
        metrics.RATE_LIMITED.labels(scope=scope, limit=limit).inc()
        which = "your organisation's" if scope == "org" else "your"
        unit = "requests" if limit == "rpm" else "tokens"
        raise Refused(
            429, "rate_limited",
            f"Slow down: {which} limit of {unit} per minute is used up. Try again in "
            f"{decision.retry_after_s} s.",
            decision.headers(),
        )  # fmt: skip
    return decision


async def settle(decision: ratelimit.Decision | None, *, prompt_tokens: int, completion_tokens: int) -> None:
    """Refund the part of the TPM reservation the answer did not use (reserved prompt +
    max_tokens minus the prompt and completion tokens actually counted, PF-R1/PF-R2). Never
    raises: a failed refund only leaves the bucket emptier until it refills."""
    if decision is None or decision.reservation is None:
        return
    try:
        await ratelimit.rate_limit_refund(decision.reservation, tokens_used=prompt_tokens + completion_tokens)
    except Exception:  # noqa: BLE001 - the answer is already given; log and go on
        logger.warning("rate-limit refund failed", exc_info=True)


def with_preamble(route: Route, system_prompt: str) -> str:
    """The system prompt with the pool's preamble (the reasoning pool's step-by-step
    instruction) in front; unchanged for pools without one."""
    preamble = route.pool.system_preamble.strip()
    if not preamble:
        return system_prompt
    return f"{preamble}\n\n{system_prompt}" if system_prompt else preamble
