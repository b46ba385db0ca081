"""Fleet sizing from measurements (issue 19 part 4): how many engine nodes, gateway processes,
PostgreSQL writes per second and how much Redis memory a workload needs at the latency targets.

Pure arithmetic over small value objects; ``python manage.py capacity``
(inference/management/commands/capacity.py) reads the inputs and prints the steps.

The rule, from the design brief's capacity exercise (DESIGN.md, "Targets and rules"):

- turns/s = users x turns per user per minute / 60;
- decode seconds per turn = completion tokens / per-stream decode rate (tokens/s);
- decoding streams in flight = turns/s x decode seconds (Little's law, L = lambda x W);
- engine nodes = ceil(streams in flight / slots per node).

1M users x 1 turn/min, 800-token answers, 50 tokens/s per slot, 8 slots per H100:
10^6/60 turns/s x 16 s / 8 slots = 33,333.3 -> 33,334 nodes. Prompt tokens do not enter the
decode fleet: the exercise sizes decode, and prefill (compute-bound, batched) rides along in
the TTFT allowance.

A node's slots and per-stream rate come either from the measured machine (the engine bench's
``sweep``, bench/engine_bench.py: the largest concurrency whose TPOT p99 and TTFT p99 hold the
targets, and tokens/s there / that concurrency) or are given (a GPU node's datasheet numbers).
All arithmetic is exact (fractions), so a whole number of nodes is never rounded up by a float's
last bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

# DESIGN.md, "Targets and rules from the design brief": TTFT p99 < 800 ms paid (< 2 s free),
# TPOT p99 < 80 ms.
TTFT_P99_TARGET_MS = 800.0
TPOT_P99_TARGET_MS = 80.0

# Rows PostgreSQL writes per answered turn (steady state: not a conversation's first message,
# whose conversation INSERT and title are once per conversation), read from the code:
POSTGRES_WRITES_PER_TURN = (
    ("user turn INSERT", 1, "conversations/services.py turn_append_user"),
    ("conversation UPDATE (last_turn_at, branch_choices)", 1,
     "conversations/services.py turn_append_user"),
    ("assistant turn INSERT", 1,
     "conversations/services.py answer_store, from the write-back task (conversations/writeback.py)"),
    ("conversation UPDATE (last_turn_at)", 1, "conversations/services.py answer_store"),
    ("usage ledger INSERT", 1, "usage/services.py usage_record, at settle (gateway/run.py)"),
)  # fmt: skip
# Transactions (commits) per turn: turn_append_user, answer_store, usage_record are one each.
POSTGRES_COMMITS_PER_TURN = 3

# A turn's Redis event log (conversations/turnlog.py TurnLogWriter): one ``token`` entry per
# engine delta (conversations/generate.py publishes each; vLLM streams one delta per decode
# step: a token, more with speculation, so completion tokens is the upper bound) and one
# terminal ``done`` entry, plus the question and owner keys.
LOG_EXTRA_EVENTS_PER_TURN = 1
# Bytes per log entry and per turn, measured with Redis's MEMORY USAGE (samples=0) on a real
# TurnLogWriter log of ~4-byte tokens (2026-12-02, the embedded Redis: 8,836 B for 100 token
# events and a done, 34,760 B for 800: 37 B an entry, ~5.1 KB a turn for the stream's first
# listpack node, its radix tree and the question and owner keys).
# tests/test_capacity.py test_redis_bytes_per_event_match_a_real_turn_log measures it again and
# fails when these drift by more than 25%.
LOG_BYTES_PER_EVENT = 37
LOG_BYTES_PER_TURN = 5100
# A held answer (conversations/held.py: the record, its index entry, its due-set entry): the
# answer's text plus a fixed part, measured as Redis's used_memory growth over 100 held answers
# (946 B each with 37 B of text, 3,519 B with 2,960 B; test_held_answer_bytes_match_real_held_
# records checks it within 25%).
HELD_BYTES_PER_ANSWER = 800
# Answer text bytes per token: English BPE text averages about 4 characters a token (OpenAI's
# tokenizer guide, "1 token ~= 4 chars in English").
TEXT_BYTES_PER_TOKEN = 4


class CapacityError(ValueError):
    """An input that cannot be sized (a message a person can act on)."""


@dataclass(frozen=True)
class Workload:
    """``users`` concurrent users x ``turns_per_minute`` turns each per minute, answers of
    ``completion_tokens`` tokens to prompts of ``prompt_tokens`` tokens."""

    users: int
    turns_per_minute: Fraction
    prompt_tokens: int
    completion_tokens: int

    def __post_init__(self) -> None:
        if self.users <= 0:
            raise CapacityError(f"--users must be a positive number of users, got {self.users}")
        if self.turns_per_minute <= 0:
            raise CapacityError(
                f"--turns-per-minute must be positive, got {float(self.turns_per_minute):g}"
            )
        if self.prompt_tokens < 0:
            raise CapacityError(f"--prompt-tokens must be >= 0, got {self.prompt_tokens}")
        if self.completion_tokens <= 0:
            raise CapacityError(
                f"--completion-tokens must be a positive number of tokens, got "
                f"{self.completion_tokens}"
            )

    @property
    def turns_per_s(self) -> Fraction:
        """Turns per second over the fleet: users x turns per minute / 60."""
        return self.users * self.turns_per_minute / 60


@dataclass(frozen=True)
class EngineNode:
    """One engine node: ``slots`` concurrent decode streams at ``stream_tokens_per_s`` each
    (tokens/s per stream), and where those numbers came from (``source``)."""

    slots: int
    stream_tokens_per_s: Fraction
    source: str
    measured: dict | None = None  # the sweep row they were read from, if measured

    def __post_init__(self) -> None:
        if self.slots <= 0:
            raise CapacityError(f"--slots-per-node must be a positive integer, got {self.slots}")
        if self.stream_tokens_per_s <= 0:
            raise CapacityError("--decode-tokens-per-s must be positive (tokens/s per stream), "
                                f"got {float(self.stream_tokens_per_s):g}")  # fmt: skip


def exact(value: float | str | Fraction) -> Fraction:
    """``value`` as an exact fraction of its decimal text (0.1 -> 1/10, not the float's
    binary expansion)."""
    return value if isinstance(value, Fraction) else Fraction(str(value))


def sweep_check(sweep, *, source: str) -> list[dict]:
    """``sweep`` if it is a list of rows each with a positive integer ``concurrency``; raises
    CapacityError naming ``source`` otherwise (a JSON from another version of the bench)."""
    if not isinstance(sweep, list) or not all(
        isinstance(r, dict) and isinstance(r.get("concurrency"), int) and r["concurrency"] > 0
        for r in sweep
    ):
        raise CapacityError(
            f"{source}'s sweep is not a list of rows with a positive integer "
            "concurrency: run python -m bench.engine_bench --parts sweep again"
        )
    return sweep


def slots_where_targets_hold(
    sweep: list[dict],
    *,
    tpot_p99_ms: float = TPOT_P99_TARGET_MS,
    ttft_p99_ms: float = TTFT_P99_TARGET_MS,
) -> dict | None:
    """The engine bench sweep's row (``{"concurrency", "tokens_per_s", "tpot_p99_ms",
    "ttft_p99_ms", ...}``, bench/engine_runs.py ``sweep_row``) with the largest concurrency
    whose TPOT p99 <= ``tpot_p99_ms`` and TTFT p99 <= ``ttft_p99_ms`` (ms) and no failed turn;
    None when no row holds both."""
    holding = [
        row for row in sweep
        if not row.get("errors") and row.get("tokens_per_s")
        and row.get("tpot_p99_ms") is not None and row["tpot_p99_ms"] <= tpot_p99_ms
        and row.get("ttft_p99_ms") is not None and row["ttft_p99_ms"] <= ttft_p99_ms
    ]  # fmt: skip
    return max(holding, key=lambda row: row["concurrency"], default=None)


def node_from_sweep(
    sweep: list[dict],
    *,
    source: str,
    tpot_p99_ms: float = TPOT_P99_TARGET_MS,
    ttft_p99_ms: float = TTFT_P99_TARGET_MS,
) -> EngineNode:
    """The measured machine as an :class:`EngineNode`: slots = the largest concurrency where
    the targets hold (:func:`slots_where_targets_hold`), per-stream rate = its aggregate
    tokens/s / slots. Raises CapacityError when the sweep is empty or no level holds them."""
    if not sweep:
        raise CapacityError(f"{source} has no sweep: run python -m bench.engine_bench --parts "
                            "sweep, or give --decode-tokens-per-s and --slots-per-node")  # fmt: skip
    sweep_check(sweep, source=source)
    row = slots_where_targets_hold(sweep, tpot_p99_ms=tpot_p99_ms, ttft_p99_ms=ttft_p99_ms)
    if row is None:
        seen = ", ".join(f"{r['concurrency']}: TPOT p99 {r.get('tpot_p99_ms')} ms, TTFT p99 "
                         f"{r.get('ttft_p99_ms')} ms" for r in sweep)  # fmt: skip
        raise CapacityError(
            f"no measured concurrency in {source} holds TPOT p99 <= {tpot_p99_ms:g} ms and TTFT "
            f"p99 <= {ttft_p99_ms:g} ms ({seen}); this machine cannot serve the targets: give a "
            "node's --decode-tokens-per-s and --slots-per-node, or loosen --tpot-p99-ms / "
            "--ttft-p99-ms"
        )
    slots = int(row["concurrency"])
    return EngineNode(slots=slots, stream_tokens_per_s=exact(row["tokens_per_s"]) / slots,
                      source=source, measured=row)  # fmt: skip


def ceil(value: Fraction) -> int:
    """The smallest integer >= ``value`` (exact)."""
    return math.ceil(value)


@dataclass(frozen=True)
class Sizing:
    """The result, every intermediate kept so it can be shown. Units in the names."""

    workload: Workload
    node: EngineNode
    turns_per_s: Fraction
    decode_s_per_turn: Fraction
    decoding_streams: Fraction
    engine_nodes: int
    ttft_allowance_s: Fraction
    sse_streams: Fraction
    streams_per_gateway: int | None
    gateways: int | None
    postgres_writes_per_s: Fraction
    postgres_commits_per_s: Fraction
    stream_ttl_s: Fraction
    log_events_per_turn: int
    log_bytes_per_turn: int
    logs_retained: Fraction
    log_bytes: Fraction
    writeback_s: Fraction
    held_bytes_per_answer: int
    held_answers: Fraction
    held_bytes: Fraction

    @property
    def redis_bytes(self) -> Fraction:
        """Event logs plus held answers, bytes."""
        return self.log_bytes + self.held_bytes

    def as_json(self) -> dict:
        """Plain numbers (floats for fractions) for ``--json``."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "workload":
                value = {"users": value.users, "turns_per_minute": float(value.turns_per_minute),
                         "prompt_tokens": value.prompt_tokens,
                         "completion_tokens": value.completion_tokens}  # fmt: skip
            elif name == "node":
                value = {"slots": value.slots, "stream_tokens_per_s": float(value.stream_tokens_per_s),
                         "source": value.source, "measured": value.measured}  # fmt: skip
            elif isinstance(value, Fraction):
                value = float(value)
            out[name] = value
        out["redis_bytes"] = float(self.redis_bytes)
        return out


def size(
    workload: Workload,
    node: EngineNode,
    *,
    streams_per_gateway: int | None,
    stream_ttl_s: float,
    ttft_allowance_s: float = TTFT_P99_TARGET_MS / 1000,
    writeback_s: float = 5,
) -> Sizing:
    """Size the fleet for ``workload`` on ``node``s.

    - engines: turns/s x (completion tokens / per-stream tokens/s) decoding streams, / slots,
      rounded up;
    - gateways: open SSE streams = turns/s x (decode s + ``ttft_allowance_s``, the wait for the
      first token: the TTFT target by default), / ``streams_per_gateway`` (one process's, from
      the stream bench), rounded up; None when ``streams_per_gateway`` is None;
    - PostgreSQL: turns/s x :data:`POSTGRES_WRITES_PER_TURN` rows (and commits);
    - Redis: event logs kept ``stream_ttl_s`` (settings.CHAT_STREAM_TTL_S) after the answer
      ends, (completion tokens + 1) entries of :data:`LOG_BYTES_PER_EVENT` plus
      :data:`LOG_BYTES_PER_TURN` each; and held answers for ``writeback_s`` (the write-back's
      lag) each :data:`HELD_BYTES_PER_ANSWER` + its text.

    Raises CapacityError for a non-positive ``streams_per_gateway`` or negative durations.
    """
    if streams_per_gateway is not None and streams_per_gateway <= 0:
        raise CapacityError(f"--streams-per-gateway must be positive, got {streams_per_gateway}")
    for name, value in (("--ttft-allowance-s", ttft_allowance_s), ("--writeback-s", writeback_s),
                        ("CHAT_STREAM_TTL_S", stream_ttl_s)):  # fmt: skip
        if value < 0:
            raise CapacityError(f"{name} must be >= 0 seconds, got {value:g}")
    turns_per_s = workload.turns_per_s
    decode_s = Fraction(workload.completion_tokens) / node.stream_tokens_per_s
    decoding = turns_per_s * decode_s
    allowance = exact(ttft_allowance_s)
    sse = turns_per_s * (decode_s + allowance)
    gateways = None if streams_per_gateway is None else ceil(sse / streams_per_gateway)
    writes = sum(n for _, n, _ in POSTGRES_WRITES_PER_TURN)
    ttl = exact(stream_ttl_s)
    events = workload.completion_tokens + LOG_EXTRA_EVENTS_PER_TURN
    log_bytes_per_turn = events * LOG_BYTES_PER_EVENT + LOG_BYTES_PER_TURN
    logs = turns_per_s * (decode_s + ttl)
    lag = exact(writeback_s)
    held_per_answer = HELD_BYTES_PER_ANSWER + workload.completion_tokens * TEXT_BYTES_PER_TOKEN
    held_answers = turns_per_s * lag
    return Sizing(
        workload=workload, node=node, turns_per_s=turns_per_s, decode_s_per_turn=decode_s,
        decoding_streams=decoding, engine_nodes=ceil(decoding / node.slots),
        ttft_allowance_s=allowance, sse_streams=sse, streams_per_gateway=streams_per_gateway,
        gateways=gateways, postgres_writes_per_s=turns_per_s * writes,
        postgres_commits_per_s=turns_per_s * POSTGRES_COMMITS_PER_TURN, stream_ttl_s=ttl,
        log_events_per_turn=events, log_bytes_per_turn=log_bytes_per_turn,
        logs_retained=logs, log_bytes=logs * log_bytes_per_turn, writeback_s=lag,
        held_bytes_per_answer=held_per_answer, held_answers=held_answers,
        held_bytes=held_answers * held_per_answer,
    )  # fmt: skip


def streams_per_gateway_from(stream_bench: dict) -> int | None:
    """One server process's concurrent SSE streams from bench/stream_bench.py's JSON: its
    ``largest_n_passing`` (the most resume streams one process held healthy); None if none
    passed."""
    value = stream_bench.get("largest_n_passing")
    if value is not None and (not isinstance(value, int) or value < 0):
        raise CapacityError(
            f"the stream bench's largest_n_passing is {value!r}, not a count: "
            "run python -m bench.stream_bench again or give --streams-per-gateway"
        )
    return value or None


def plot_sweep(
    sweep: list[dict],
    path: Path,
    *,
    tpot_p99_ms: float = TPOT_P99_TARGET_MS,
    slots: int | None = None,
    title: str = "",
) -> Path:
    """Write a PNG at ``path``: TPOT p99 (ms, left axis, with the target as a dashed line and
    each level's TTFT p99 written beside it) and aggregate tokens/s (right axis) against
    concurrency, as measured in ``sweep`` (rows as
    :func:`slots_where_targets_hold` reads them); ``slots``, if given, marked. Returns
    ``path``. Raises CapacityError for an empty sweep."""
    if not sweep:
        raise CapacityError("nothing to plot: the engine bench JSON has no sweep")
    sweep_check(sweep, source="the engine bench JSON")
    import matplotlib  # noqa: PLC0415 - heavy, and only this function needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = sorted(sweep, key=lambda r: r["concurrency"])
    x = [r["concurrency"] for r in rows]
    fig, left = plt.subplots(figsize=(7, 4.2), dpi=120)
    try:
        left.plot(x, [r.get("tpot_p99_ms") for r in rows], "o-", color="tab:red",
                  label="TPOT p99 (ms)")  # fmt: skip
        for r in rows:  # TTFT p99 beside each point: the other target a level must hold
            if r.get("tpot_p99_ms") is not None and r.get("ttft_p99_ms") is not None:
                left.annotate(
                    f"TTFT p99 {r['ttft_p99_ms'] / 1000:.2f} s",
                    (r["concurrency"], r["tpot_p99_ms"]),
                    textcoords="offset points",
                    xytext=(0, 7),
                    ha="center",
                    fontsize=7,
                    color="dimgray",
                )
        left.axhline(tpot_p99_ms, color="tab:red", linestyle="--", linewidth=1,
                     label=f"TPOT p99 target ({tpot_p99_ms:g} ms)")  # fmt: skip
        left.set_xlabel("concurrent streams")
        left.set_ylabel("TPOT p99 (ms)", color="tab:red")
        left.set_xscale("log", base=2)
        left.set_xticks(x, [str(n) for n in x])
        tpots = [r["tpot_p99_ms"] for r in rows if r.get("tpot_p99_ms") is not None]
        left.set_ylim(0, max(tpots + [tpot_p99_ms]) * 1.3)  # room for the labels and legend
        right = left.twinx()
        right.plot(x, [r.get("tokens_per_s") for r in rows], "s-", color="tab:blue",
                   label="tokens/s (all streams)")  # fmt: skip
        right.set_ylabel("output tokens/s", color="tab:blue")
        right.set_ylim(bottom=0)
        if slots is not None:
            left.axvline(slots, color="gray", linestyle=":", linewidth=1,
                         label=f"slots where the targets hold ({slots})")  # fmt: skip
        handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
        left.legend(handles=handles, loc="upper left", fontsize=8)
        left.set_title(title or "Engine sweep: TPOT p99 and tokens/s against concurrency",
                       fontsize=10)  # fmt: skip
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
