"""bench/chat_bench.py's results: one chat, one batch of N concurrent chats, and their summary
(TTFT/TPOT percentiles pooled over the repeats, tokens/s the median over repeats)."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field

from bench.harness import disturbed, log, ms, percentile

MAX_TOKENS = 128  # per answer, greedy, in both phases


@dataclass
class ChatResult:
    prompt_index: int
    ttft_s: float | None
    tpot_s: float | None
    completion_tokens: int
    text: str
    end_s: float  # from batch start
    error: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class BatchResult:
    n: int
    rep: int
    wall_s: float
    completion_tokens: int
    tokens_per_s: float
    chats: list[ChatResult]
    cpu: dict = field(default_factory=dict)
    probe: list[dict] = field(default_factory=list)


def summarize(batches: list[BatchResult]) -> dict:
    chats = [c for b in batches for c in b.chats]
    ttfts = [c.ttft_s for c in chats if c.ttft_s is not None]
    tpots = [c.tpot_s for c in chats if c.tpot_s is not None]
    return {
        "requests": len(chats),
        "errors": sum(1 for c in chats if c.error),
        "ttft_p50_s": percentile(ttfts, 50, default=None),
        "ttft_p99_s": percentile(ttfts, 99, default=None),
        "tpot_p50_s": percentile(tpots, 50, default=None),
        "tpot_p99_s": percentile(tpots, 99, default=None),
        "tokens_per_s": statistics.median(b.tokens_per_s for b in batches) if batches else None,
        "tokens_per_s_reps": [round(b.tokens_per_s, 2) for b in batches],
        "completion_tokens_mean": (
            statistics.mean(c.completion_tokens for c in chats) if chats else None
        ),
    }


def batch_disturbed(b: BatchResult) -> bool:
    """Other processes used more than 5% of the machine during the batch."""
    return disturbed(b.cpu, b.wall_s)


def system_prompt() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    from django.conf import settings  # noqa: PLC0415

    return settings.CHAT_SYSTEM_PROMPT


def model_path() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    from django.conf import settings  # noqa: PLC0415

    return str(settings.CHAT_MODEL_PATH)


def warn_errors(what: str, chats: list[ChatResult]) -> None:
    errors = [c.error for c in chats if c.error]
    if errors:
        log(f"{what}: {len(errors)}/{len(chats)} requests FAILED (first: {errors[0][:300]})")


def make_batch(n: int, rep: int, wall: float, chats: list[ChatResult]) -> BatchResult:
    tokens = sum(c.completion_tokens for c in chats)
    return BatchResult(n, rep, wall, tokens, tokens / wall if wall > 0 else 0.0, chats)


def fmt_batch(b: BatchResult) -> str:
    ttfts = [c.ttft_s for c in b.chats if c.ttft_s is not None]
    errors = [c.error for c in b.chats if c.error]
    s = (
        f"{b.completion_tokens} tok in {b.wall_s:.2f} s = {b.tokens_per_s:.1f} tok/s, "
        f"TTFT p50 {ms(percentile(ttfts, 50, default=None), 0)} ms"
    )
    if b.cpu:
        s += (
            f"; CPU s: bench process {b.cpu['bench_process_cpu_s']:.1f}, "
            f"stack {b.cpu['stack_cpu_s']:.1f}, other {b.cpu['other_cpu_s']:.1f}"
        )
        if batch_disturbed(b):
            s += "  <-- BACKGROUND LOAD, numbers disturbed"
            if b.cpu.get("other_top"):
                s += " (" + "; ".join(
                    f"{o['cpu_s']:.1f} s {o['cmd'][:60]}" for o in b.cpu["other_top"]
                ) + ")"
    if errors:
        s += f", {len(errors)} ERRORS (first: {errors[0][:300]})"
    return s


def batches_json(results: dict[int, list[BatchResult]]) -> dict:
    return {str(n): [asdict(b) for b in batches] for n, batches in results.items()}
