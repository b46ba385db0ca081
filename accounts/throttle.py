"""Sign-in throttling and password-reset request limits, counted in Redis (issue 10).

**Sign-in.** Two counters of failed sign-ins, both in Redis so every server process shares them:

- per account (the username typed, hashed): ``CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT`` (5) failures
  within ``CHAT_ACCOUNTS_LOGIN_WINDOW_S`` (15 min) lock the account, from every address, for
  ``CHAT_ACCOUNTS_LOGIN_LOCKOUT_S`` (15 min) after the failure that locked it: online guessing
  of one password gets 5 tries per 15 minutes (OWASP ASVS 4.0 V2.2.1 asks for such a limit);
- per client address (an IPv4 address, an IPv6 /64: accounts/request_info.py):
  ``CHAT_ACCOUNTS_LOGIN_IP_LIMIT`` (30) failures across any usernames lock that address out of
  every account, which stops one client spraying a common password over many accounts. It is
  higher than the account limit because many people can share one address (an office's NAT).

While locked, the right password is refused too (otherwise a guesser would learn it from the
different answer), and attempts are not counted, so the lock ends when it said it would. A
successful sign-in clears the account's counter, not the address's: an attacker who owns one
account must not be able to wipe their address's failures by signing into it between guesses.
Following a password reset link clears the account's counter too (the lockout message offers it).

Why not django-axes (its cache handler can count in Redis): it has one failure limit for all its
lockout parameters (its count is the maximum over the per-username and per-IP keys), so the
address limit could not be higher than the account limit; its reset on success deletes the
address's counter too (the abuse above); and its lockout response cannot say which limit was hit.
The two counters here are one Lua script.

**Password reset requests.** Per address ``CHAT_ACCOUNTS_RESET_IP_LIMIT`` (10) and per email
address ``CHAT_ACCOUNTS_RESET_EMAIL_LIMIT`` (3) requests per ``CHAT_ACCOUNTS_RESET_WINDOW_S``
(1 h): over the address limit the page says so (429); over the email limit no more mail is sent
but the page looks the same (no inbox can be flooded, and nothing tells whether an account exists).

**Redis down**: the counters fail open (nobody is locked out, nothing is counted), as the chat's
rate limits do (core/redis_guard.py); each such call is counted in
``chat_redis_unavailable_total{part="login_throttle"}`` and logged once per outage.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from django.conf import settings

from core import redis_guard

from accounts.request_info import ip_throttle_scope

PART = "login_throttle"  # redis_guard part name (metrics label)

# KEYS: counters. ARGV[1]: window ms; ARGV[2]: lockout ms; ARGV[2 + i]: limit of KEYS[i].
# Each counter counts one more; its first count starts the window; the count that reaches the
# limit restarts its expiry as the lockout. Counts past the limit (concurrent requests that all
# passed the check) do not extend it. Returns {count_1, pttl_1, count_2, pttl_2, ...}.
_HIT = """
local out = {}
for i, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  local limit = tonumber(ARGV[2 + i])
  if n == 1 then redis.call('PEXPIRE', key, ARGV[1]) end
  if n == limit then redis.call('PEXPIRE', key, ARGV[2]) end
  table.insert(out, n)
  table.insert(out, redis.call('PTTL', key))
end
return out
"""


@dataclass(frozen=True)
class Counter:
    """One Redis counter (``key``) and the count at which it locks (``limit``)."""

    key: str
    limit: int
    scope: str  # "account", "ip", "email"


@dataclass(frozen=True)
class Lockout:
    """A lock in force: which counter (``scope``: ``"account"`` or ``"ip"``) and whole seconds
    until it ends (``retry_after_s`` >= 1, for the Retry-After header)."""

    scope: str
    retry_after_s: int

    @property
    def wait(self) -> str:
        """The wait in words: "15 minutes", "1 minute", "40 seconds"."""
        if self.retry_after_s < 60:
            n, unit = self.retry_after_s, "second"
        else:
            n, unit = math.ceil(self.retry_after_s / 60), "minute"
        return f"{n} {unit}{'' if n == 1 else 's'}"

    @property
    def message(self) -> str:
        """What the person is told (the sign-in page, the reset page)."""
        if self.scope == "account":
            return (
                f"Too many failed sign-ins for this account. Try again in {self.wait}, "
                "or reset your password."
            )
        if self.scope == "reset-ip":
            return (
                "Too many password reset requests from your network. "
                f"Try again in {self.wait}."
            )
        return f"Too many failed sign-ins from your network. Try again in {self.wait}."


def _digest(text: str) -> str:
    # Usernames and email addresses are kept out of Redis in clear; 128 bits tell them apart.
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _account_counter(username: str) -> Counter:
    return Counter(
        f"chat:login:fail:account:{_digest(username)}",
        settings.CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT,
        "account",
    )


def _ip_counter(ip: str | None) -> Counter:
    return Counter(
        f"chat:login:fail:ip:{ip_throttle_scope(ip)}", settings.CHAT_ACCOUNTS_LOGIN_IP_LIMIT, "ip"
    )


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _locked(counter: Counter, count: int, pttl_ms: int) -> Lockout | None:
    if count < counter.limit or pttl_ms <= 0:
        return None
    return Lockout(scope=counter.scope, retry_after_s=max(1, math.ceil(pttl_ms / 1000)))


def _read(counters: list[Counter]) -> list[tuple[int, int]] | None:
    """(count, pttl ms) of each counter, or None when Redis is unavailable."""

    def read(client):
        pipe = client.pipeline(transaction=False)
        for counter in counters:
            pipe.get(counter.key)
            pipe.pttl(counter.key)
        values = pipe.execute()
        return [(int(values[i] or 0), int(values[i + 1])) for i in range(0, len(values), 2)]

    return redis_guard.call(PART, read, default=None, fallback="sign-in throttling fails open")


def _hit(counters: list[Counter], *, window_s: float, lockout_s: float) -> list[tuple[int, int]] | None:
    """Count one more on each counter (one atomic script); (count, pttl ms) of each, or None."""

    def hit(client):
        values = client.eval(
            _HIT,
            len(counters),
            *(c.key for c in counters),
            _ms(window_s),
            _ms(lockout_s),
            *(c.limit for c in counters),
        )
        return [(int(values[i]), int(values[i + 1])) for i in range(0, len(values), 2)]

    return redis_guard.call(PART, hit, default=None, fallback="sign-in throttling fails open")


def _first_lockout(counters: list[Counter], state: list[tuple[int, int]] | None) -> Lockout | None:
    if state is None:
        return None
    for counter, (count, pttl_ms) in zip(counters, state, strict=True):
        lockout = _locked(counter, count, pttl_ms)
        if lockout is not None:
            return lockout
    return None


# --- sign-in ------------------------------------------------------------------------------------


def login_lockout(*, username: str, ip: str | None) -> Lockout | None:
    """The lock in force for signing in to ``username`` from ``ip`` (the account's first), or
    None. Check it before the password: a locked account refuses the right one too."""
    counters = [_account_counter(username), _ip_counter(ip)]
    return _first_lockout(counters, _read(counters))


def login_failed(*, username: str, ip: str | None) -> Lockout | None:
    """Count a failed sign-in against ``username`` and ``ip``; return the lock it put in force
    (the account's first), or None while both are under their limits."""
    counters = [_account_counter(username), _ip_counter(ip)]
    state = _hit(
        counters,
        window_s=settings.CHAT_ACCOUNTS_LOGIN_WINDOW_S,
        lockout_s=settings.CHAT_ACCOUNTS_LOGIN_LOCKOUT_S,
    )
    return _first_lockout(counters, state)


def login_account_clear(*, username: str) -> None:
    """Forget the account's failed sign-ins (after a successful sign-in or a password reset);
    the address counters stay."""
    key = _account_counter(username).key
    redis_guard.call(PART, lambda client: client.delete(key), default=None)


# --- password reset requests --------------------------------------------------------------------


def _reset_counters(*, email: str, ip: str | None) -> list[Counter]:
    return [
        Counter(
            f"chat:reset:ip:{ip_throttle_scope(ip)}",
            settings.CHAT_ACCOUNTS_RESET_IP_LIMIT,
            "reset-ip",
        ),
        Counter(
            f"chat:reset:email:{_digest(email.strip().lower())}",
            settings.CHAT_ACCOUNTS_RESET_EMAIL_LIMIT,
            "email",
        ),
    ]


def reset_request_lockout(*, ip: str | None) -> Lockout | None:
    """The lock in force on password reset requests from ``ip``, or None."""
    (counter, _email) = _reset_counters(email="", ip=ip)
    return _first_lockout([counter], _read([counter]))


def reset_request_count(*, email: str, ip: str | None) -> bool:
    """Count a password reset request for ``email`` from ``ip``; return whether a mail may be
    sent (False once the address has had ``CHAT_ACCOUNTS_RESET_EMAIL_LIMIT`` this window)."""
    counters = _reset_counters(email=email, ip=ip)
    window = settings.CHAT_ACCOUNTS_RESET_WINDOW_S
    state = _hit(counters, window_s=window, lockout_s=window)
    if state is None:
        return True
    email_count, _ = state[1]
    return email_count <= counters[1].limit
