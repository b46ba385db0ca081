"""Routing: which pool answers a turn, and load shedding. Pure functions over settings; no I/O.

:func:`route` decides, in this order of precedence (issue 5, "Pools and routing"):

1. **org pin** - an enterprise organisation's exact ``name@version`` (``Organisation.pinned_pool``);
   it must exist. No canary moves a pinned turn.
2. **explicit request** - the model the user (or an OpenAI client) asked for: a pool name,
   ``name@version``, or a served model name. It must be open to the user's tier, or to one of the
   user's feature flags (``settings.CHAT_FLAG_POOLS``): else 400 (unknown, listing the models) or
   403 (not allowed, naming the tier's models). ``settings.CHAT_MODEL_NAME`` (what OpenAI clients
   send by default) means "no preference".
3. **experiment arm** - ``settings.CHAT_EXPERIMENTS`` for the user's tier, only when nothing was
   requested; the arm comes from a stable hash of the user id (:func:`experiment_arm`).
4. **tier default** - ``settings.CHAT_TIER_DEFAULT_POOL``.

Then a **canary** (``settings.CHAT_CANARIES``) sends ``percent`` of a tier's users (stable hash,
:func:`in_canary`) to another version of the chosen pool name, unless the turn is pinned (org pin
or an explicit ``name@version``). A turn keeps the Route it started with (callers store it), so a
canary or config change never moves a turn in flight.

:func:`shed` then applies load shedding on the admission queue's depth.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from django.conf import settings

from inference.pools import Pool, PoolSet

DEGRADE_POOL = "mini"  # "degrade paid to the smaller pool" means routing to mini (issue 5)
REASONING_POOL = "reasoning"


@dataclass(frozen=True)
class RouteRequest:
    """What the router knows about a turn: the user's id and tier, the model asked for (None:
    no preference), the organisation's pin (``""``: none) and the user's feature flags."""

    user_id: int
    tier: str
    requested: str | None
    org_pin: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Route:
    """The pool that answers, why (``"tier default"``, ``"requested"``, ``"org pin"``,
    ``"canary"``, ``"experiment <name>:<arm>"``, ``"degraded"``), and the engine priority to use
    (vLLM: lower runs first)."""

    pool: Pool
    reason: str
    priority: int


@dataclass(eq=False)
class RouteError(Exception):
    """The turn cannot be routed: ``status`` 400 (unknown model) or 403 (not open to the
    tier); ``code`` a stable machine name; ``message`` a sentence naming the allowed models."""

    status: int
    code: str
    message: str

    def __post_init__(self) -> None:
        super().__init__(self.message)


@dataclass(eq=False)
class Overloaded(Exception):
    """Load shedding refused the turn: answer 503 ``busy`` with ``Retry-After: retry_after_s``
    (an integer >= 1, PF-R3)."""

    retry_after_s: int
    message: str

    def __post_init__(self) -> None:
        super().__init__(self.message)


def _fraction(key: str) -> float:
    """A stable number in [0, 1) from ``key`` (the first 8 bytes of its SHA-256)."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def experiment_arm(*, user_id: int, experiment: str, weights: dict[str, int]) -> str:
    """The arm of ``experiment`` user ``user_id`` is in, by ``weights`` (arm -> positive int).

    Stable: SHA-256 of ``f"{experiment}:{user_id}"`` mapped onto the arms' cumulative weights,
    arms taken in name order (so reordering the config moves no one). Raises ValueError if no
    arm has a positive weight.
    """
    arms = sorted((arm, int(w)) for arm, w in weights.items() if int(w) > 0)
    total = sum(w for _, w in arms)
    if total <= 0:
        raise ValueError(f"experiment {experiment!r} has no arm with a positive weight")
    point = _fraction(f"{experiment}:{user_id}") * total
    upto = 0
    for arm, w in arms:
        upto += w
        if point < upto:
            return arm
    return arms[-1][0]  # float edge; unreachable in practice


def in_canary(*, user_id: int, key: str, percent: float) -> bool:
    """Is user ``user_id`` among the ``percent`` (0..100) of users the canary ``key``
    (``"name@version"``) takes? Stable: SHA-256 of ``f"{key}:{user_id}"``."""
    if percent <= 0:
        return False
    return _fraction(f"{key}:{user_id}") * 100 < percent


def _model_list(pools: list[Pool]) -> str:
    return ", ".join(p.name for p in pools) or "none"


def _org_pin_pool(pin: str, pools: PoolSet) -> Pool:
    name, sep, version = pin.partition("@")
    if not sep or not name or not version:
        raise RouteError(
            400, "pinned_model_invalid",
            f"Your organisation's model pin {pin!r} is not an exact name@version; "
            "ask its owner to set one.",
        )  # fmt: skip
    try:
        return pools.get(name, version)
    except KeyError:
        offered = ", ".join(p.key for p in pools) or "none"
        raise RouteError(
            400, "pinned_model_unknown",
            f"Your organisation pins model {pin!r}, which this server does not offer "
            f"(offered: {offered}); ask its owner to change the pin.",
        ) from None  # fmt: skip


def _requested_pool(req: RouteRequest, pools: PoolSet) -> tuple[Pool | None, bool]:
    """(pool asked for or None for no preference, whether an exact version was asked for)."""
    requested = (req.requested or "").strip()
    if not requested or requested == settings.CHAT_MODEL_NAME:
        return None, False
    try:
        return pools.resolve(requested), "@" in requested
    except KeyError:
        pass
    # A served model name (a remote pool's `model`): the first pool serving it that the user may use.
    serving = [p for p in pools.for_tier(req.tier, req.flags) if p.model == requested]
    if serving:
        return serving[0], False
    if any(p.model == requested for p in pools):
        pool = next(p for p in pools if p.model == requested)
        return pool, False
    raise RouteError(
        400, "model_not_found",
        f"Unknown model {requested!r}. Models: {_model_list([pools.default_version(n) for n in pools.names()])}.",
    )  # fmt: skip


def route(
    req: RouteRequest, *, pools: PoolSet, canaries: list[dict], experiments: list[dict]
) -> Route:
    """Choose the pool for one turn (precedence in the module docstring).

    ``canaries``: ``[{"pool": name, "version": v, "tier": t (optional: all), "percent": 0..100}]``
    (``settings.CHAT_CANARIES``); ``experiments``: ``[{"name", "tier" (optional: all),
    "arms": {arm: weight}, "pools": {arm: pool name}}]`` (``settings.CHAT_EXPERIMENTS``).
    Raises RouteError: 400 unknown model / bad org pin, 403 model not open to the tier.
    """
    if req.org_pin:
        pool = _org_pin_pool(req.org_pin, pools)
        return Route(pool=pool, reason="org pin", priority=pool.priority)

    requested, exact_version = _requested_pool(req, pools)
    if requested is not None:
        if not pools.allows(requested, req.tier, req.flags):
            allowed = pools.for_tier(req.tier, req.flags)
            raise RouteError(
                403, "model_not_allowed",
                f"Model {requested.name!r} is not available on the {req.tier} tier. "
                f"Your models: {_model_list(allowed)}.",
            )  # fmt: skip
        pool, reason = requested, "requested"
        if exact_version:
            return Route(pool=pool, reason=reason, priority=pool.priority)
    else:
        pool, reason = None, ""
        for exp in experiments:
            if exp.get("tier") not in (None, req.tier):
                continue
            arm = experiment_arm(user_id=req.user_id, experiment=exp["name"], weights=exp["arms"])
            try:
                pool = pools.resolve(exp["pools"][arm])
            except KeyError:
                continue  # a misconfigured arm (the system check reports it) falls through
            reason = f"experiment {exp['name']}:{arm}"
            break
        if pool is None:
            default = settings.CHAT_TIER_DEFAULT_POOL.get(req.tier)
            try:
                pool = pools.resolve(default or "")
            except KeyError:
                raise RouteError(
                    403, "model_not_allowed", f"No model is configured for the {req.tier} tier."
                ) from None
            reason = "tier default"

    for canary in canaries:
        if canary.get("pool") != pool.name or canary.get("tier") not in (None, req.tier):
            continue
        key = f"{canary['pool']}@{canary['version']}"
        if key == pool.key or not in_canary(
            user_id=req.user_id, key=key, percent=float(canary.get("percent", 0))
        ):
            continue
        try:
            pool = pools.get(canary["pool"], str(canary["version"]))
        except KeyError:
            continue
        reason = "canary"
        break
    return Route(pool=pool, reason=reason, priority=pool.priority)


def routing_config_errors(
    pools: PoolSet, *, canaries: list[dict], experiments: list[dict], flag_pools: dict[str, str]
) -> list[str]:
    """Problems in ``CHAT_CANARIES``, ``CHAT_EXPERIMENTS`` and ``CHAT_FLAG_POOLS`` against the
    pools (each a sentence naming the entry and field); empty when all is well. The system
    check (``inference/checks.py``) reports them at start."""
    errors: list[str] = []
    for i, c in enumerate(canaries):
        where = f"CHAT_CANARIES[{i}]"
        if not isinstance(c, dict) or not {"pool", "version", "percent"} <= set(c):
            errors.append(f"{where}: needs fields 'pool', 'version' and 'percent'")
            continue
        try:
            pools.get(str(c["pool"]), str(c["version"]))
        except KeyError:
            errors.append(f"{where}: field 'version': pool {c['pool']}@{c['version']} is not defined")
        try:
            percent = float(c["percent"])
        except (TypeError, ValueError):
            percent = -1
        if not 0 <= percent <= 100:
            errors.append(f"{where}: field 'percent': {c['percent']!r} is not between 0 and 100")
        if c.get("tier") is not None and c["tier"] not in ("free", "paid", "enterprise"):
            errors.append(f"{where}: field 'tier': unknown tier {c['tier']!r}")
    for i, e in enumerate(experiments):
        where = f"CHAT_EXPERIMENTS[{i}]"
        if not isinstance(e, dict) or not {"name", "arms", "pools"} <= set(e):
            errors.append(f"{where}: needs fields 'name', 'arms' and 'pools'")
            continue
        arms = e["arms"] if isinstance(e["arms"], dict) else {}
        try:
            weights_ok = arms and all(int(w) >= 0 for w in arms.values()) and sum(
                int(w) for w in arms.values()
            ) > 0
        except (TypeError, ValueError):
            weights_ok = False
        if not weights_ok:
            errors.append(f"{where}: field 'arms': weights must be integers >= 0, at least one > 0")
        for arm in arms:
            target = e["pools"].get(arm) if isinstance(e["pools"], dict) else None
            try:
                pools.resolve(str(target or ""))
            except KeyError:
                errors.append(f"{where}: field 'pools': arm {arm!r} names no defined pool ({target!r})")
    for flag, target in flag_pools.items():
        try:
            pools.resolve(str(target))
        except KeyError:
            errors.append(f"CHAT_FLAG_POOLS[{flag!r}]: {target!r} is not a defined pool")
    return errors


def _count_shed(tier: str, action: str) -> None:
    from core import metrics  # noqa: PLC0415

    counter = getattr(metrics, "SHED", None)
    if counter is not None:
        counter.labels(tier=tier, action=action).inc()


def shed(
    route: Route, *, tier: str, waiting: int, pools: PoolSet, expected_wait_s: float = 0.0
) -> Route:
    """Load shedding on ``waiting`` (requests queued for a slot of the route's engine), in
    DESIGN.md's order (free first, then paid degraded, reasoning queued only as the last
    resort; the default thresholds 8 < 16 < 24 keep it, system check chat.W004):

    - free tier and ``waiting > CHAT_SHED_FREE_WAITING``, or ``expected_wait_s`` (seconds the
      turn would wait for a slot, estimated by the admission queue) above
      ``CHAT_SHED_FREE_WAIT_S`` (when > 0): raise Overloaded (``retry_after_s =
      CHAT_SHED_RETRY_AFTER_S``, at least 1). The adaptive cap (inference/limiter.py) makes
      the queue grow when the engine is slow, so free turns are shed on that queue rather than
      left waiting past the free TTFT target;
    - paid/enterprise, ``waiting > CHAT_DEGRADE_PAID_WAITING``, not already on ``mini`` and not a
      reasoning turn (a reasoning turn is never degraded: the smaller model cannot do its job):
      the ``mini`` pool answers (reason ``"degraded"``, keeping the better of the two priorities);
    - the ``reasoning`` pool and ``waiting > CHAT_REASONING_LAST_WAITING``: priority becomes the
      largest pool priority + 1, behind every other user turn (background jobs stay behind it at
      ``CHAT_BACKGROUND_PRIORITY``).

    Thresholds are read from settings at each call. Each decision counts in
    ``chat_shed_total{tier, action=shed|degrade|queue_last}``. Returns the (possibly new) Route.
    """
    wait_bound = float(getattr(settings, "CHAT_SHED_FREE_WAIT_S", 0) or 0)
    too_long = wait_bound > 0 and expected_wait_s > wait_bound
    if tier == "free" and (waiting > settings.CHAT_SHED_FREE_WAITING or too_long):
        _count_shed(tier, "shed")
        retry = max(1, int(settings.CHAT_SHED_RETRY_AFTER_S))
        raise Overloaded(
            retry_after_s=retry,
            message=f"The service is busy right now; please try again in {retry} seconds.",
        )
    if (
        tier in ("paid", "enterprise")
        and waiting > settings.CHAT_DEGRADE_PAID_WAITING
        and route.pool.name not in (DEGRADE_POOL, REASONING_POOL)
    ):
        try:
            mini = pools.default_version(DEGRADE_POOL)
        except KeyError:
            mini = None
        if mini is not None:
            _count_shed(tier, "degrade")
            return Route(pool=mini, reason="degraded", priority=min(route.priority, mini.priority))
    if route.pool.name == REASONING_POOL and waiting > settings.CHAT_REASONING_LAST_WAITING:
        last = max(p.priority for p in pools) + 1
        if route.priority < last:
            _count_shed(tier, "queue_last")
            return replace(route, priority=last)
    return route
