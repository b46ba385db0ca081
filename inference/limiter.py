"""The adaptive admission cap: how many requests one engine runs at once, from measured TPOT.

A CPU (or GPU) engine's decode step gets slower as its continuous batch grows: every running
stream gets one token per step, so each stream's time per output token (TPOT) is the engine's
step time. A fixed ``CHAT_MAX_NUM_SEQS`` is either too wide for a slow machine (every admitted
stream misses the TPOT target) or too narrow for a fast one. :class:`TpotLimiter` finds the cap
from what the streams measure, as a TCP sender finds its congestion window.

**Algorithm: AIMD on a TPOT threshold** (additive increase, multiplicative decrease), as
Netflix's concurrency-limits ``AIMDLimit`` does for request latency (github.com/Netflix/
concurrency-limits: the limit is multiplied by ``backoffRatio`` when a request drops or takes
longer than the timeout, and grows by 1 otherwise while the limit is in use). Here:

- samples are per-stream TPOT over the last few tokens of running streams (inference/serving.py
  sends one every ``CHAT_ADMISSION_SAMPLE_TOKENS`` tokens, so a long answer is felt while it
  runs, not when it ends); queue wait and prefill are not in them;
- every ``window_s`` seconds (once ``min_samples`` have come), the window's 90th percentile is
  compared with the target (``CHAT_ADMISSION_TPOT_TARGET_MS``, 80 ms: the design brief's TPOT
  p99 target, DESIGN.md "Targets");
- **down**: above the target, the cap becomes ``floor(cap * backoff)`` (at least one less, at
  least ``min_limit``). Not while more requests run than the cap (a cut lets running requests
  finish, nobody is preempted, so until they have, the samples still measure the old batch and
  another cut would overshoot: TCP's "one decrease per round trip");
- **up**: at or below ``RAISE_BELOW`` x the target, and only while the cap is what holds
  requests back (it is reached and some wait), the cap grows by 1, up to ``max_limit`` (the
  admission's slots). A cap nobody is queued behind carries no evidence that more would fit.

Why AIMD and not Netflix's ``Gradient2Limit``: gradient2 steers latency toward a long-term
no-load baseline (limit x long RTT / short RTT), so it treats every batching slowdown as
congestion and would hold the batch near one stream; batching deliberately trades some TPOT for
throughput, and the brief gives an absolute TPOT target (80 ms), which a threshold expresses
directly. AIMD keeps the batch as wide as the target allows.

Pure logic: the clock is injected (``clock``, seconds) and the configuration passed in, so it is
tested without an engine (tests/test_limiter.py). inference/admission.py owns one per engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

# Raise only with this much room under the target (a window right at the target is not room).
RAISE_BELOW = 0.9
# The window's statistic: its 90th percentile (a few slow steps, e.g. a long prefill, do not
# decide alone; a batch that is slow for most streams does).
WINDOW_QUANTILE = 0.9

UP = "up"
DOWN = "down"


@dataclass(frozen=True)
class LimiterConfig:
    """The limiter's knobs: ``target_s`` TPOT target (seconds per token), ``min_limit`` (>= 1,
    the cap never goes below it), ``backoff`` (0 < backoff < 1: the cut's factor),
    ``window_s`` (seconds between decisions), ``min_samples`` (per decision)."""

    target_s: float = 0.080
    min_limit: int = 2
    backoff: float = 0.8
    window_s: float = 1.0
    min_samples: int = 3

    def __post_init__(self) -> None:
        if not (self.target_s > 0 and self.min_limit >= 1 and 0 < self.backoff < 1):
            raise ValueError(
                "the admission limiter needs target > 0, min limit >= 1 and 0 < backoff < 1 "
                f"(CHAT_ADMISSION_TPOT_TARGET_MS, _MIN_LIMIT, _BACKOFF); got {self}"
            )
        if not (self.window_s > 0 and self.min_samples >= 1):
            raise ValueError(
                f"the admission limiter needs window > 0 and min samples >= 1; got {self}"
            )

    @classmethod
    def from_settings(cls) -> LimiterConfig:
        """The configuration in ``settings.CHAT_ADMISSION_*`` (read at each call). Raises
        ValueError for values out of range."""
        from django.conf import settings  # noqa: PLC0415 - the rest of the module is pure

        return cls(
            target_s=float(settings.CHAT_ADMISSION_TPOT_TARGET_MS) / 1000,
            min_limit=int(settings.CHAT_ADMISSION_MIN_LIMIT),
            backoff=float(settings.CHAT_ADMISSION_BACKOFF),
            window_s=float(settings.CHAT_ADMISSION_WINDOW_S),
            min_samples=int(settings.CHAT_ADMISSION_MIN_SAMPLES),
        )


def quantile(values: list[float], q: float) -> float:
    """The ``q`` (0..1) quantile of ``values`` by linear interpolation between closest ranks
    (numpy's default). Raises ValueError for no values."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Decision:
    """One change of the cap: ``direction`` ``"up"`` | ``"down"``, the cap ``before`` and
    ``after``, and the window's TPOT statistic that decided it (``tpot_s``, seconds)."""

    direction: str
    before: int
    after: int
    tpot_s: float


class TpotLimiter:
    """An AIMD cap on concurrent requests from TPOT samples (module docstring).

    ``limit`` starts at ``initial`` (the admission's slots: fully open until streams are slow).
    """

    def __init__(self, *, initial: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = max(1, int(initial))
        self._clock = clock
        self._samples: list[float] = []
        self._window_start = 0.0
        self.last: Decision | None = None

    def observe(
        self, tpot_s: float, *, running: int, waiting: int, max_limit: int, config: LimiterConfig
    ) -> Decision | None:
        """Take one TPOT sample (seconds per token of one running stream, recent tokens) with
        the admission's state now: ``running`` requests holding a slot, ``waiting`` queued,
        ``max_limit`` the most the cap may be (the slots). Returns the Decision when this
        sample closed a window that changed the cap, else None. Negative or non-finite samples
        are ignored."""
        self.limit = min(max(self.limit, config.min_limit), max(1, max_limit))
        if not math.isfinite(tpot_s) or tpot_s < 0:
            return None
        now = self._clock()
        if not self._samples:
            self._window_start = now  # a window starts with its first sample
        self._samples.append(tpot_s)
        if now - self._window_start < config.window_s or len(self._samples) < config.min_samples:
            return None
        seen = quantile(self._samples, WINDOW_QUANTILE)
        self._samples = []
        before = self.limit
        if seen > config.target_s and running <= self.limit:
            self.limit = max(
                config.min_limit, min(self.limit - 1, math.floor(self.limit * config.backoff))
            )
            direction = DOWN
        elif seen <= RAISE_BELOW * config.target_s and waiting > 0 and running >= self.limit:
            self.limit = min(self.limit + 1, max(1, max_limit))
            direction = UP
        else:
            return None
        if self.limit == before:
            return None
        self.last = Decision(direction, before, self.limit, seen)
        return self.last
