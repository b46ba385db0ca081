"""bench/engine_bench.py's measurements: a workload played against a client (the full stack's
``/v1`` API or an OpenAI-compatible server), one sample per turn, summarised (tokens/s over the
workload's span, TTFT/TPOT percentiles), with the CPU other processes used meanwhile."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass

from bench.engine_workload import UserPlan
from bench.harness import CpuMeter, disturbed, log, ms, percentile, tpot, wait_for_quiet


@dataclass
class Sample:
    server: str
    workload: str
    user: int
    turn: int
    start_s: float  # from the workload's start
    end_s: float
    ttft_s: float | None
    tpot_s: float | None
    prompt_tokens: int | None
    completion_tokens: int
    error: str | None = None


def summarize(samples: list[Sample], wall_s: float, cpu: dict | None = None) -> dict:
    ok = [s for s in samples if s.error is None]
    tokens = sum(s.completion_tokens for s in ok)
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpots = [s.tpot_s for s in ok if s.tpot_s is not None]
    return {
        "turns": len(samples),
        "errors": len(samples) - len(ok),
        "first_error": next((s.error for s in samples if s.error), None),
        "completion_tokens": tokens,
        "prompt_tokens_mean": (sum(s.prompt_tokens or 0 for s in ok) / len(ok)) if ok else None,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50, default=None),
        "ttft_p99_s": percentile(ttfts, 99, default=None),
        "ttft_max_s": max(ttfts) if ttfts else None,
        "tpot_p50_s": percentile(tpots, 50, default=None),
        "tpot_p99_s": percentile(tpots, 99, default=None),
        "other_cpu_s": (cpu or {}).get("other_cpu_s"),
        "disturbed": disturbed(cpu) if cpu else None,
    }


async def run_turns(client, plans: list[UserPlan], workload_name: str,
                    own_client: bool = True) -> tuple[list[Sample], float]:
    """Play ``plans`` against ``client``; -> (samples, wall seconds from the first arrival to
    the last answer's end). ``own_client``: open (and close) the client's connections here.
    A client with ``for_user(user)`` (bench/engine_mixed.py) plays each plan on that user's
    own client."""
    samples: list[Sample] = []
    t0 = time.perf_counter()

    async def play(plan: UserPlan) -> None:
        await asyncio.sleep(max(0.0, t0 + plan.arrival_s - time.perf_counter()))
        user_client = client.for_user(plan.user) if hasattr(client, "for_user") else client
        try:
            conversation = await user_client.new_conversation()
        except Exception as exc:  # noqa: BLE001 - counted and shown
            for turn in plan.turns:
                samples.append(Sample(client.name, workload_name, plan.user, turn.index, 0, 0,
                                      None, None, None, 0, repr(exc)))  # fmt: skip
            return
        for turn in plan.turns:
            if turn.think_s:
                await asyncio.sleep(turn.think_s)
            start = time.perf_counter()
            try:
                first, last, prompt, completion = await user_client.turn(
                    conversation, turn.content, turn.max_tokens, t0
                )
                error = None
            except Exception as exc:  # noqa: BLE001 - counted and shown
                first = last = prompt = None
                completion, error = 0, repr(exc)
            end = time.perf_counter()
            if os.environ.get("ENGINE_BENCH_VERBOSE"):
                log(f"  {client.name} user {plan.user} turn {turn.index}: {completion} tokens, "
                    f"TTFT {ms(None if first is None else first - start)} ms, "
                    f"{end - start:.1f} s" + (f", {error}" if error else ""))  # fmt: skip
            samples.append(Sample(
                server=client.name, workload=workload_name, user=plan.user, turn=turn.index,
                start_s=start - t0, end_s=end - t0,
                ttft_s=None if first is None else first - start,
                tpot_s=tpot(first, last, completion), prompt_tokens=prompt,
                completion_tokens=completion, error=error,
            ))  # fmt: skip

    if own_client:
        await client.open()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(play(p) for p in plans))
    finally:
        if own_client:
            await client.close()
    started = min((s.start_s for s in samples), default=0.0)
    ended = max((s.end_s for s in samples), default=0.0)
    return samples, ended - started


def measure(client, plans, workload_name: str, wait_load: float | None, wait_max_s: float):
    """One measured workload (after an optional quiet-machine wait) -> summary dict."""
    load = wait_for_quiet(wait_load, wait_max_s)
    meter = CpuMeter()
    meter.start()
    samples, wall = asyncio.run(run_turns(client, plans, workload_name))
    cpu = meter.stop()
    summary = summarize(samples, wall, cpu)
    summary["loadavg_1m_before"] = load
    summary["cpu"] = cpu
    summary["samples"] = [asdict(s) for s in samples]
    log(f"{client.name}, {workload_name}: {summary['turns']} turns, "
        f"{summary['completion_tokens']} tokens in {wall:.1f} s = "
        f"{summary['tokens_per_s'] or 0:.1f} tok/s; TTFT p50 {ms(summary['ttft_p50_s'])} ms, "
        f"p99 {ms(summary['ttft_p99_s'])} ms; TPOT p50 {ms(summary['tpot_p50_s'], 2)} ms"
        + (f"; {summary['errors']} errors ({summary['first_error']})" if summary["errors"] else "")
        + ("  (disturbed)" if summary["disturbed"] else ""))  # fmt: skip
    return summary


async def run_sequential(client, plans: list[UserPlan], workload_name: str):
    samples: list[Sample] = []
    wall = 0.0
    await client.open()
    try:
        for plan in plans:
            got, w = await run_turns(client, [plan], workload_name, own_client=False)
            samples.extend(got)
            wall += w
    finally:
        await client.close()
    return samples, wall


def measure_single(client, plans, wait_load, wait_max_s):
    load = wait_for_quiet(wait_load, wait_max_s)
    meter = CpuMeter()
    meter.start()
    samples, wall = asyncio.run(run_sequential(client, plans, "single"))
    cpu = meter.stop()
    summary = summarize(samples, wall, cpu)
    summary["loadavg_1m_before"] = load
    summary["cpu"] = cpu
    summary["samples"] = [asdict(s) for s in samples]
    log(f"{client.name}, single: TTFT p50 {ms(summary['ttft_p50_s'])} ms, TPOT p50 "
        f"{ms(summary['tpot_p50_s'], 2)} ms, prompt {summary['prompt_tokens_mean'] or 0:.0f} "
        f"tokens, {summary['completion_tokens']} tokens"
        + (f"; {summary['errors']} errors ({summary['first_error']})" if summary["errors"] else "")
        + ("  (disturbed)" if summary["disturbed"] else ""))  # fmt: skip
    return summary


def sweep_row(concurrency: int, summary: dict) -> dict:
    """One level of the concurrency sweep from :func:`measure`'s summary: aggregate output
    tokens/s and per-stream TPOT p50/p99 and TTFT p50/p99 in ms (None where nothing was
    measured), with the turns, errors and whether the machine was disturbed. The shape
    ``python manage.py capacity`` reads (inference/capacity.py)."""

    def in_ms(key: str) -> float | None:
        value = summary.get(key)
        return None if value is None else round(value * 1000, 2)

    return {
        "concurrency": concurrency,
        "tokens_per_s": summary["tokens_per_s"],
        "tpot_p50_ms": in_ms("tpot_p50_s"),
        "tpot_p99_ms": in_ms("tpot_p99_s"),
        "ttft_p50_ms": in_ms("ttft_p50_s"),
        "ttft_p99_ms": in_ms("ttft_p99_s"),
        "prompt_tokens_mean": summary["prompt_tokens_mean"],
        "turns": summary["turns"],
        "errors": summary["errors"],
        "completion_tokens": summary["completion_tokens"],
        "wall_s": summary["wall_s"],
        "loadavg_1m_before": summary.get("loadavg_1m_before"),
        "disturbed": summary.get("disturbed"),
    }


def measure_sweep(client, levels: list[int], plans_for, wait_load, wait_max_s) -> list[dict]:
    """The concurrency sweep: for each level ``n`` in ``levels``, the workload ``plans_for(n)``
    measured by :func:`measure` -> a list of :func:`sweep_row` dicts, in ``levels``' order."""
    return [
        sweep_row(n, measure(client, plans_for(n), f"sweep-{n}", wait_load, wait_max_s))
        for n in levels
    ]
