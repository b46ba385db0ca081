"""Rate limits: Redis token buckets per user and per organisation, for requests per minute (RPM)
and tokens per minute (TPM) (issue 5, "Rate limits"; DESIGN.md: "rate limit (RPM + TPM, before
any engine work, 429 + Retry-After)").

**Buckets.** Each limit is a token bucket: capacity = the limit (per minute), refilled
continuously at limit / 60 per second (so an idle user has a whole minute's worth, and a user
who emptied it waits in proportion). A request takes 1 from each RPM bucket and ``tokens``
(prompt + max_tokens, reserved up front) from each TPM bucket; after the answer,
:func:`rate_limit_refund` gives the unused part back (PF-R1, PF-R2: streamed and non-streamed
turns draw the same buckets by the same amount).

**Atomic, shared by every process (PF-R4).** One Lua script (``_BUCKETS_LUA``, registered once
and run with EVALSHA) refills every bucket of the request to ``now``, checks that each has
enough, and takes from all of them or from none: a refusal by the organisation's bucket takes
nothing from the user's. Redis runs a script alone, so any number of server processes share one
limit exactly. ``now`` is Redis's own ``TIME`` unless a test injects it, so processes on
different hosts share one clock.

**Keys.** ``rl:{user|org}:{id}:{rpm|tpm}``, each a hash ``{tokens, ts, cap}`` (level, time of
that level in seconds, capacity). A key expires two minutes after its bucket would be full
again; an absent key is a full bucket.

**Redis down.** Limits fail open (core/redis_guard.py ``rate_limit_fail_open``): the
request is allowed unmetered and counted in ``chat_rate_limit_fail_open_total{limit}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis.asyncio as aioredis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core import redis_guard

# A key outlives the moment its bucket is full again by this long (seconds).
KEY_TTL_AFTER_FULL_S = 120

# KEYS: the bucket keys. ARGV[1]: now in seconds ("" = Redis TIME). ARGV[2]: "take" | "refund".
# Then for each key i: ARGV[1 + 2i] capacity (take; ignored by refund, which reads the stored
# one), ARGV[2 + 2i] amount (take: the cost; refund: the amount given back).
# take returns {allowed (1|0), now, level_1, wait_1, level_2, wait_2, ...}: the level after the
# take (or the current level when refused) and the seconds until the bucket holds its cost (0
# when it already does). Numbers go back as strings (a Lua number reply would be truncated to
# an integer). refund returns {1, now}.
_BUCKETS_LUA = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local mode = ARGV[2]
local ttl_after_full = tonumber(ARGV[3])
local n = #KEYS

local function refilled(key, cap)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local level, ts = tonumber(state[1]), tonumber(state[2])
  if level == nil or ts == nil then
    return cap, now, false
  end
  if now > ts then
    level = math.min(cap, level + (now - ts) * cap / 60)
    ts = now
  end
  return level, ts, true
end

local function store(key, level, ts, cap)
  redis.call('HSET', key, 'tokens', tostring(level), 'ts', tostring(ts), 'cap', tostring(cap))
  local to_full = (cap - level) / (cap / 60)
  redis.call('PEXPIRE', key, math.ceil((to_full + ttl_after_full) * 1000))
end

if mode == 'refund' then
  for i = 1, n do
    local cap = tonumber(redis.call('HGET', KEYS[i], 'cap'))
    if cap then
      local level, ts = refilled(KEYS[i], cap)
      store(KEYS[i], math.min(cap, level + tonumber(ARGV[3 + 2 * i])), ts, cap)
    end
  end
  return {1, tostring(now)}
end

local levels, stamps, caps, costs = {}, {}, {}, {}
local allowed = 1
local out = {0, tostring(now)}
for i = 1, n do
  caps[i] = tonumber(ARGV[2 + 2 * i])
  costs[i] = tonumber(ARGV[3 + 2 * i])
  levels[i], stamps[i] = refilled(KEYS[i], caps[i])
  if levels[i] < costs[i] then
    allowed = 0
  end
end
for i = 1, n do
  local wait = 0
  if levels[i] < costs[i] then
    wait = (costs[i] - levels[i]) / (caps[i] / 60)
  end
  local level = levels[i]
  if allowed == 1 then
    level = level - costs[i]
    store(KEYS[i], level, stamps[i], caps[i])
  end
  out[1 + 2 * i] = tostring(level)
  out[2 + 2 * i] = tostring(wait)
end
out[1] = allowed
return out
"""

# Registered once (the SHA is computed here, with the same UTF-8 encoder every client uses);
# each call runs EVALSHA on the calling event loop's client (loading the script on NOSCRIPT).
# The throwaway client never connects.
_SCRIPT = aioredis.Redis(decode_responses=True).register_script(_BUCKETS_LUA)


@dataclass(frozen=True)
class Limits:
    """One party's limits: requests and tokens per minute; None: unlimited."""

    rpm: int | None
    tpm: int | None


UNLIMITED = Limits(rpm=None, tpm=None)


@dataclass(frozen=True)
class Reservation:
    """Tokens taken up front from the TPM buckets ``keys`` (Redis keys), for the refund."""

    keys: tuple[str, ...]
    tokens: int


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`rate_limit_take`.

    - ``allowed``: whether the request may go on (every bucket had enough; all were charged).
    - ``retry_after_s``: 0 when allowed; else whole seconds (>= 1) until the refusing buckets
      hold enough again: ceil of the longest such wait.
    - ``remaining_requests`` / ``remaining_tokens``: the tightest RPM / TPM bucket after the
      take (whole units, rounded down); None when that limit is unlimited or not metered.
    - ``limited_by``: for a refusal, the bucket that needs the longest wait: ``"user rpm"``,
      ``"user tpm"``, ``"org rpm"`` or ``"org tpm"``; None when allowed.
    - ``reservation``: what to refund after the answer (None: nothing to refund).
    """

    allowed: bool
    retry_after_s: int
    remaining_requests: int | None
    remaining_tokens: int | None
    limited_by: str | None
    reservation: Reservation | None

    def headers(self) -> dict[str, str]:
        """Response headers: ``X-RateLimit-Remaining-Requests`` and ``-Tokens`` (each omitted
        when that limit is unlimited) and, when refused, ``Retry-After`` (integer seconds,
        RFC 9110 section 10.2.3)."""
        out: dict[str, str] = {}
        if self.remaining_requests is not None:
            out["X-RateLimit-Remaining-Requests"] = str(self.remaining_requests)
        if self.remaining_tokens is not None:
            out["X-RateLimit-Remaining-Tokens"] = str(self.remaining_tokens)
        if not self.allowed:
            out["Retry-After"] = str(max(1, self.retry_after_s))
        return out


ALLOWED_UNMETERED = Decision(
    allowed=True,
    retry_after_s=0,
    remaining_requests=None,
    remaining_tokens=None,
    limited_by=None,
    reservation=None,
)


class RequestTooLarge(Exception):
    """The request's tokens (prompt + max_tokens) exceed a TPM bucket's capacity: it can never
    pass, however long the client waits, so it is a 400 naming the limit, not a 429.

    ``message`` is for the client; ``scope`` is ``"user"`` or ``"org"``; ``limit`` the TPM
    capacity and ``tokens`` the request's tokens.
    """

    def __init__(self, message: str, *, scope: str, limit: int, tokens: int) -> None:
        super().__init__(message)
        self.message = message
        self.scope = scope
        self.limit = limit
        self.tokens = tokens


def bucket_key(scope: str, party_id: int | str, limit: str) -> str:
    """The Redis key of one bucket: ``rl:{user|org}:{id}:{rpm|tpm}``."""
    return f"rl:{scope}:{party_id}:{limit}"


def _limits_from(table: dict | None, tier: str, setting: str) -> Limits:
    entry = (table or {}).get(tier)
    if entry is None:
        return UNLIMITED
    values = {}
    for name in ("rpm", "tpm"):
        value = entry.get(name)
        valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if value is not None and not valid:
            raise ImproperlyConfigured(
                f"{setting}[{tier!r}][{name!r}] must be a positive integer or null, not {value!r}"
            )
        values[name] = value
    return Limits(**values)


def limits_for(
    *, tier: str, org_tier: str | None, org_rpm: int | None = None, org_tpm: int | None = None
) -> tuple[Limits, Limits | None]:
    """The user's limits for ``tier`` (settings.CHAT_RATE_LIMITS_BY_TIER) and, when the request
    belongs to an organisation (``org_tier`` not None), the organisation's
    (settings.CHAT_ORG_RATE_LIMITS_BY_TIER); else None for the org. A missing tier, a None
    table or a None value means unlimited. ``org_rpm`` / ``org_tpm``: the organisation's own
    limits (Organisation.rate_limit_rpm / _tpm, workspaces/), each replacing its tier's; None
    keeps the tier's. Raises ImproperlyConfigured for a value that is not a positive integer
    (naming the setting, tier and limit)."""
    user = _limits_from(
        getattr(settings, "CHAT_RATE_LIMITS_BY_TIER", None), tier, "CHAT_RATE_LIMITS_BY_TIER"
    )
    if org_tier is None:
        return user, None
    org = _limits_from(
        getattr(settings, "CHAT_ORG_RATE_LIMITS_BY_TIER", None),
        org_tier,
        "CHAT_ORG_RATE_LIMITS_BY_TIER",
    )
    if org_rpm is not None or org_tpm is not None:
        org = Limits(
            rpm=org_rpm if org_rpm is not None else org.rpm,
            tpm=org_tpm if org_tpm is not None else org.tpm,
        )
    return user, org


def _too_large(
    *, scope: str, limit: int, tokens: int, prompt_tokens: int | None, max_tokens: int | None
) -> RequestTooLarge:
    if prompt_tokens is not None and max_tokens is not None:
        detail = f" ({prompt_tokens:,} in the prompt + max_tokens {max_tokens:,})"
    else:
        detail = ""
    whose = "your tier" if scope == "user" else "your organisation's tier"
    return RequestTooLarge(
        f"This request may use up to {tokens:,} tokens{detail} but {whose} allows {limit:,} "
        "tokens per minute. Lower max_tokens or shorten the conversation.",
        scope=scope,
        limit=limit,
        tokens=tokens,
    )


def _arg(now: float | None) -> str:
    return "" if now is None else repr(float(now))


async def rate_limit_take(
    *,
    user_id: int,
    org_id: int | None,
    user_limits: Limits,
    org_limits: Limits | None,
    tokens: int,
    now: float | None = None,
    prompt_tokens: int | None = None,
    max_tokens: int | None = None,
) -> Decision:
    """Check and take, atomically and all or none, 1 request from each RPM bucket and
    ``tokens`` (prompt + max_tokens) from each TPM bucket of the user and (``org_id`` and
    ``org_limits`` given) the organisation.

    ``now``: seconds on the limiter's clock (tests inject it); None: Redis's ``TIME``, one clock
    for every process. ``prompt_tokens`` / ``max_tokens`` only make the RequestTooLarge message
    name the parts of ``tokens``.

    Returns a :class:`Decision`; with no limit at all, or while Redis is unavailable (fail
    open, counted in ``chat_rate_limit_fail_open_total``), an allowed one with no remaining
    counts and no reservation. Refusals are counted by the caller
    (``chat_rate_limited_total{scope,limit}``, gateway/gate.py), not here.

    Raises RequestTooLarge when ``tokens`` exceeds a TPM capacity (checked before Redis).
    """
    buckets: list[tuple[str, str, int, int]] = []  # (name, key, capacity, cost)
    parties = [("user", user_id, user_limits)]
    if org_id is not None and org_limits is not None:
        parties.append(("org", org_id, org_limits))
    for scope, party_id, limits in parties:
        if limits.tpm is not None and tokens > limits.tpm:
            raise _too_large(
                scope=scope, limit=limits.tpm, tokens=tokens,
                prompt_tokens=prompt_tokens, max_tokens=max_tokens,
            )  # fmt: skip
        if limits.rpm is not None:
            buckets.append((f"{scope} rpm", bucket_key(scope, party_id, "rpm"), limits.rpm, 1))
        if limits.tpm is not None:
            buckets.append(
                (f"{scope} tpm", bucket_key(scope, party_id, "tpm"), limits.tpm, max(0, tokens))
            )
    if not buckets:
        return ALLOWED_UNMETERED

    keys = [key for _, key, _, _ in buckets]
    args: list[str | int] = [_arg(now), "take", KEY_TTL_AFTER_FULL_S]
    for _, _, capacity, cost in buckets:
        args += [capacity, cost]
    kinds = "+".join(sorted({name.split()[1] for name, *_ in buckets}))
    reply = await redis_guard.rate_limit_fail_open(
        kinds, lambda client: _SCRIPT(keys=keys, args=args, client=client)
    )
    if reply is None:
        return ALLOWED_UNMETERED

    allowed = int(reply[0]) == 1
    remaining: dict[str, int | None] = {"rpm": None, "tpm": None}
    longest_wait, limited_by = 0.0, None
    for i, (name, _, _, cost) in enumerate(buckets):
        level, wait = float(reply[2 + 2 * i]), float(reply[3 + 2 * i])
        kind = name.split()[1]
        whole = max(0, math.floor(level + 1e-9))
        current = remaining[kind]
        remaining[kind] = whole if current is None else min(current, whole)
        if not allowed and wait > 0 and (limited_by is None or wait > longest_wait):
            longest_wait, limited_by = wait, name
    if not allowed:
        return Decision(
            allowed=False,
            retry_after_s=max(1, math.ceil(longest_wait - 1e-9)),
            remaining_requests=remaining["rpm"],
            remaining_tokens=remaining["tpm"],
            limited_by=limited_by,
            reservation=None,
        )
    tpm_keys = tuple(key for name, key, _, _ in buckets if name.endswith("tpm"))
    return Decision(
        allowed=True,
        retry_after_s=0,
        remaining_requests=remaining["rpm"],
        remaining_tokens=remaining["tpm"],
        limited_by=None,
        reservation=Reservation(keys=tpm_keys, tokens=tokens) if tpm_keys else None,
    )


async def rate_limit_refund(
    reservation: Reservation | None, *, tokens_used: int, now: float | None = None
) -> None:
    """Give ``reservation.tokens - tokens_used`` (prompt + completion tokens actually used;
    nothing when that is <= 0) back to the reservation's TPM buckets, never above their
    capacity. ``now`` as for :func:`rate_limit_take`. A None reservation (unlimited, or taken
    while Redis was down) is a no-op; so is a Redis failure (logged and counted in
    ``chat_redis_unavailable_total{part="ratelimit"}``: the tokens stay spent)."""
    if reservation is None or not reservation.keys:
        return
    refund = reservation.tokens - tokens_used
    if refund <= 0:
        return
    keys = list(reservation.keys)
    args: list[str | int] = [_arg(now), "refund", KEY_TTL_AFTER_FULL_S]
    for _ in keys:
        args += [0, refund]
    await redis_guard.acall(
        "ratelimit",
        lambda client: _SCRIPT(keys=keys, args=args, client=client),
        default=None,
        fallback="the unused tokens are not refunded",
    )
