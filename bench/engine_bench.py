"""Engine speed (issue 9): one user as fast as llama.cpp, many users 3x faster than it.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.engine_bench [--parts ...] [--label L]

Parts (``--parts``, comma-separated; default all):

- **ready**: the time ``make run``'s stack takes to serve: ``python -m chatsite.devstack run
  --port P`` spawned with this environment (the dev stack's PostgreSQL and Redis), polled on
  ``/readyz`` until 200 (the model loaded and warmed up). Target <= 90 s. Then stopped.
- **single**: one stream through the full stack: uvicorn in this process serving
  ``chatsite.asgi.application`` with the real engine (``bench.harness.InProcessServer``), a
  bench user with an API key (``bench.clients.Api``, named ``enginebench-``), ``POST
  /v1/conversations/{id}/turns``
  (SSE), a ~200-token prompt (system prompt + chat template included), greedy, a fixed
  ``--answer-tokens`` cap, ``--single-turns`` turns one after another (a fresh conversation and
  a different prompt each, so the prefix cache holds only the shared system prompt). TTFT =
  request sent -> first ``token`` event with text; TPOT = (last token - first) /
  (completion tokens - 1), as bench/chat_bench.py measures them. Targets: TTFT p50 <= 150 ms,
  TPOT p50 <= 20 ms.
- **concurrent**: ``--users`` (16) users through the full stack, a seeded realistic workload
  (:func:`bench.engine_workload.workload`): staggered (Poisson) arrivals, each user a conversation of ``--turns-per-user``
  turns with think time between them, prompt lengths ~50-1000 tokens, answer caps ~32-300.
  Aggregate output tokens/s = completion tokens of all turns / (last turn's end - first turn's
  start); TTFT p99 over all turns. Targets: tokens/s >= 3x llama.cpp's in the same run, TTFT
  p99 <= 2 s.
- **sweep**: the engine's throughput against concurrency, for fleet sizing (``python manage.py
  capacity``, inference/capacity.py): at each of ``--sweep-levels`` (1,2,4,8,16) that many users
  at once through the full stack, each ``--sweep-turns`` (2) turns back to back, ~200-token
  prompts (other messages than the single part's), answers capped at ``--sweep-answer-tokens``
  (64). Written as the JSON's ``sweep`` list: ``concurrency``, ``tokens_per_s``,
  ``tpot_p50_ms``, ``tpot_p99_ms``, ``ttft_p50_ms``, ``ttft_p99_ms`` per level (about a
  minute and a half on 2 cores, so it is in the default set). No target of its own.
- **mixed**: the concurrent part's workload with tiers, 4 paid and 12 free users (seeded,
  ``--mixed-paid``), rate limits and shedding as configured, played twice in one run: with the
  adaptive admission cap (inference/limiter.py) and with it off. Admitted streams' TPOT p99,
  paid and free TTFT p99, 503s shed, tokens/s and the cap reached per phase, and the
  adaptive / uncapped tokens/s ratio, with PASS/MISS against issue 19's targets
  (bench/engine_mixed.py).
- **llama**: the same two workloads against llama.cpp on the shipped GGUF through its
  OpenAI-compatible streaming chat API: ``llama_cpp.server`` (llama-cpp-python, the ``bench``
  extra), and llama.cpp's own parallel ``llama-server`` when it is on PATH or ``var/bin``
  (``LLAMA_SERVER``). Messages carry the same system prompt and history the full stack's
  prompt has. Skipped (said so) when llama-cpp-python is not installed.
- **quality**: the quantised model (``CHAT_ENGINE_QUANTIZATION``, else ``--quality-variant``,
  w8a8: the one this CPU's vLLM kernels run) vs the unquantised one, both in the engine's dtype,
  by ``inference.quantize.quality_report``: greedy-token agreement over the first 64 tokens on a
  fixed prompt set, perplexity on a fixed text (target: within 5%). Made first if missing.

The engine's levers come from the ``CHAT_ENGINE_*`` environment (chatsite/settings/engine.py), so
each lever is one run: ``CHAT_ENGINE_EAGER=0 python -m bench.engine_bench --parts single,concurrent
--label compile``. Rate limits, load shedding, reserved slots and the adaptive cap are off
(except in the mixed part), sampling is greedy.
``--wait-load 1.5`` waits (polling every 60 s, at most ``--wait-max-s``) until the 1-minute load
average is below 1.5 before each measured part, and records it: the machine is small and shared;
each part also records the CPU other processes used, and flags a disturbed part.

Results: tables, ratios and PASS/MISS per target on stdout, JSON in
``var/bench/engine_bench.json`` (``--out``). Exit status 0 when the run completed (``--strict``:
1 on a missed target), 2 when requests failed.

The workloads are bench/engine_workload.py, playing them bench/engine_runs.py, the llama.cpp
baselines bench/llama_baseline.py.
"""

import argparse
import asyncio
import contextlib
import copy
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.clients import Api, AsyncApi
from bench.engine_mixed import mixed_part, tier_mix
from bench.engine_report import report, served_variant
from bench.engine_runs import measure, measure_single, measure_sweep, run_sequential
from bench.engine_workload import (
    single_plans,
    single_prompts,
    sweep_plans,
    tokenizer_counter,
    workload,
)
from bench.harness import (
    TIER_MACHINERY_OFF,
    VAR,
    InProcessServer,
    Spawned,
    free_port,
    log,
    tier_machinery_off,
    wait_for_quiet,
)
from bench.llama_baseline import llama_part
from chatsite.placement import Placement, placed, postmaster_pid

PARTS = ("ready", "single", "concurrent", "sweep", "mixed", "llama", "quality")
SWEEP_PROMPT_SEED = 300  # not the single part's (200): no prefix cache hits on its prompts


# --------------------------------------------------------------------------------------------
# Parts


def ready_part(port: int | None = None, timeout_s: float = 600) -> dict:
    """Spawn ``make run``'s stack (``python -m chatsite.devstack run``) with this environment and
    time it until /readyz answers 200 (its output: var/bench/ready.log, the last lines kept in
    the result when it was not ready)."""
    port = port or free_port()
    env = dict(os.environ)
    env["PORT"] = str(port)
    argv = [sys.executable, "-m", "chatsite.devstack", "run", "--port", str(port)]
    stack = Spawned("make run's stack", argv, port=port, env=env,
                    log_path=VAR / "bench" / "ready.log")  # fmt: skip
    stack.start()
    ready_s = None
    try:
        ready_s = stack.wait_ready("/readyz", timeout_s)
    except RuntimeError as exc:
        log(f"ready: {exc}")
    finally:
        stack.stop(30)
    tail = stack.log_path.read_text(errors="replace").strip().splitlines()[-5:]
    log(f"ready: {'-' if ready_s is None else f'{ready_s:.1f} s'} from spawn to /readyz 200")
    return {"ready_s": ready_s, "log_tail": None if ready_s else tail}


def full_stack_parts(args, parts: set[str], count_tokens, plans, prompts,
                     sweep_prompts=(), configured: dict | None = None) -> dict:
    from django.conf import settings  # noqa: PLC0415

    out: dict = {}
    server = InProcessServer()
    try:
        t = time.perf_counter()
        server.start()
        out["engine_start_s"] = time.perf_counter() - t
        from django.db import connections  # noqa: PLC0415

        connections.close_all()
        # Named for this bench: Api's default prefix is moderation_bench's, whose leftovers it
        # deletes at start (another bench starting meanwhile would revoke ours: 401s mid-run).
        api = Api(server.url, prefix=f"enginebench-{os.getpid()}", key_name="engine bench",
                  clear_leftovers=False)  # fmt: skip
        client = AsyncApi(server.url, api)
        try:
            # Warm-up: the first turns pay for one-off work (moderation classifiers, grammar of
            # nothing, Python caches); two short turns, not measured.
            warm = single_plans(prompts[:2], 16)
            asyncio.run(run_sequential(client, warm, "warm-up"))
            if "single" in parts:
                out["single"] = measure_single(
                    client, single_plans(prompts, args.answer_tokens), args.wait_load,
                    args.wait_max_s,
                )  # fmt: skip
            if "concurrent" in parts:
                out["concurrent"] = measure(client, plans, "concurrent", args.wait_load,
                                            args.wait_max_s)  # fmt: skip
            if "sweep" in parts:
                out["sweep"] = measure_sweep(
                    client, args.sweep_levels,
                    lambda n: sweep_plans(n, args.sweep_turns, sweep_prompts,
                                          args.sweep_answer_tokens),
                    args.wait_load, args.wait_max_s,
                )  # fmt: skip
            if "mixed" in parts:
                # The targets are relative to this run's single stream: measure a short one if
                # the single part did not run.
                single = out.get("single") or measure_single(
                    client, single_plans(prompts[:3], args.answer_tokens), args.wait_load,
                    args.wait_max_s,
                )  # fmt: skip
                out["mixed"] = mixed_part(
                    server, plans, tier_mix(args.seed, args.users, args.mixed_paid),
                    configured or {}, args.wait_load, args.wait_max_s,
                )  # fmt: skip
                out["mixed"]["single"] = {k: single[k] for k in ("ttft_p50_s", "tpot_p50_s")}
            out["engine"] = {
                "tuning": server.engine.tuning.describe() if server.engine.tuning else None,
                "args": {k: str(v) for k, v in server.engine.engine_args_kwargs().items()},
                "system_prompt": settings.CHAT_SYSTEM_PROMPT,
            }
        finally:
            api.close()
    finally:
        server.stop()
    return out


def quality_part(args) -> dict:
    """The quantised variant (CHAT_ENGINE_QUANTIZATION, else ``--quality-variant``) vs the
    unquantised model, in the engine's dtype; the variant is made first if missing (~1 min)."""
    from django.conf import settings  # noqa: PLC0415

    from inference.quantize import cpu_supports, quality_report, quantize  # noqa: PLC0415
    from inference.tuning import EngineTuning  # noqa: PLC0415

    variant = served_variant() or args.quality_variant
    supported, why = cpu_supports(variant)
    if not supported:
        log(f"quality: {variant} skipped: {why}")
        return {"skipped": why, "variant": variant}
    model = Path(settings.CHAT_MODEL_PATH)
    quantize(model, variant)
    dtype = EngineTuning.from_settings().resolved_dtype()
    wait_for_quiet(args.wait_load, args.wait_max_s)
    report = quality_report(str(model), variant, dtype=dtype)
    log(f"quality: {variant} vs unquantised ({dtype} activations): agreement "
        f"{report['agreement']:.3f}, perplexity ratio {report['ppl_ratio']:.3f}")
    return report


# --------------------------------------------------------------------------------------------
# Report


def _postmaster() -> int | None:
    # The dev stack's embedded PostgreSQL (devstack exec), if that is the database in use.
    from chatsite.devstack import VAR  # noqa: PLC0415

    data_dir = VAR / "pgdata"
    return postmaster_pid(data_dir) if str(data_dir) in os.environ.get("DATABASE_URL", "") else None


def run(args) -> int:
    from django.conf import settings  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    parts = set(args.parts)
    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    connections.close_all()
    # This bench measures the engine: none of the tier machinery that would get in the way
    # (the mixed part puts the configured values back for its own measurement).
    configured = {name: copy.deepcopy(getattr(settings, name)) for name in TIER_MACHINERY_OFF}
    tier_machinery_off(settings)
    settings.CHAT_TEMPERATURE = 0.0  # greedy, like the llama.cpp requests

    count_tokens, chat_overhead = tokenizer_counter()
    system_prompt = settings.CHAT_SYSTEM_PROMPT
    prompts = single_prompts(args.single_turns + 2, count_tokens, chat_overhead(system_prompt))
    prompts = prompts[2:] + prompts[:2]  # the last two are the warm-up's
    plans = workload(args.seed, args.users, args.turns_per_user, count_tokens)
    sweep_prompts = []
    if "sweep" in parts:
        sweep_prompts = single_prompts(max(args.sweep_levels) * args.sweep_turns, count_tokens,
                                       chat_overhead(system_prompt), seed=SWEEP_PROMPT_SEED)
    result: dict = {}
    if "ready" in parts:
        wait_for_quiet(args.wait_load, args.wait_max_s)
        result["ready"] = ready_part()
    if parts & {"single", "concurrent", "sweep", "mixed"}:
        # Placed as `make run` places its processes (chatsite/placement.py), or not at all
        # (--placement all): this process (clients, server threads, the engine's scheduler) and
        # the dev stack's PostgreSQL; the engine's worker binds its own threads.
        placement = Placement.from_env({**os.environ, "CHAT_SERVICE_CPUS": args.placement})
        log(f"placement ({args.placement}): {placement.describe()}")
        with placed(placement, postmaster=_postmaster()):
            result["full"] = full_stack_parts(args, parts, count_tokens, plans, prompts,
                                              sweep_prompts, configured)
        result["placement"] = {"choice": args.placement, "service_cpus": sorted(placement.service_cpus)}
    if "llama" in parts:
        result["llama"] = llama_part(args, parts & {"single", "concurrent"} or
                                     {"single", "concurrent"}, plans, prompts, system_prompt)
    if "quality" in parts:
        result["quality"] = quality_part(args)
    summary = report(result, args)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "label": args.label,
        "config": {
            "parts": sorted(parts), "users": args.users, "turns_per_user": args.turns_per_user,
            "seed": args.seed, "single_turns": args.single_turns,
            "answer_tokens": args.answer_tokens, "sweep_levels": args.sweep_levels,
            "sweep_turns": args.sweep_turns, "sweep_answer_tokens": args.sweep_answer_tokens,
            "model_path": str(settings.CHAT_MODEL_PATH),
            "engine_env": {k: v for k, v in os.environ.items()
                           if k.startswith(("CHAT_ENGINE_", "VLLM_CPU_", "CHAT_MAX_NUM_SEQS",
                                            "CHAT_KV_CACHE", "CHAT_ADMISSION_",
                                            "CHAT_SHED_"))},
            "cpu_count": os.cpu_count(), "loadavg_end": os.getloadavg(),
            "workload": [asdict(p) for p in plans],
        },  # fmt: skip
        "total_s": total_s,
        **result,
        # Top level, where python manage.py capacity (inference/capacity.py) reads it.
        "sweep": result.get("full", {}).pop("sweep", None),
        # Top level too: issue 19's numbers, per phase (adaptive / uncapped).
        "mixed": result.get("full", {}).pop("mixed", None),
        **summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    errors = sum(
        (s or {}).get("errors", 0)
        for s in [result.get("full", {}).get("single"), result.get("full", {}).get("concurrent")]
    ) + sum(row["errors"] for row in payload["sweep"] or [])
    mixed = payload["mixed"] or {}
    errors += sum(mixed.get(phase, {}).get("errors", 0) for phase in ("adaptive", "uncapped"))
    if errors:
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--parts", type=lambda s: [p for p in s.split(",") if p],
                        default=list(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--label", default="default", help="a name for this lever run")
    parser.add_argument("--placement", default=os.environ.get("CHAT_SERVICE_CPUS", "auto"),
                        help="CHAT_SERVICE_CPUS for the full-stack parts: auto (as make run), "
                        "all (unpinned) or CPU ids")
    parser.add_argument("--single-turns", type=int, default=10)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--turns-per-user", type=int, default=2)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--sweep-levels", type=lambda s: [int(n) for n in s.split(",") if n],
                        default=[1, 2, 4, 8, 16], help="the sweep's concurrency levels")
    parser.add_argument("--sweep-turns", type=int, default=2, help="turns per user per level")
    parser.add_argument("--sweep-answer-tokens", type=int, default=64)
    parser.add_argument("--mixed-paid", type=int, default=4,
                        help="paid users among --users in the mixed part (the rest are free)")
    parser.add_argument("--quality-variant", default="w8a8",
                        help="quantised variant the quality part compares when "
                        "CHAT_ENGINE_QUANTIZATION is not set")
    parser.add_argument("--llama-threads", type=int, default=max((os.cpu_count() or 2) // 2, 1),
                        help="llama.cpp threads (default: llama-cpp-python's own, half the CPUs; "
                        "with every CPU its threads stall whenever another process runs)")
    parser.add_argument("--wait-load", type=float, default=None,
                        help="wait until the 1-minute load average is below this")
    parser.add_argument("--wait-max-s", type=float, default=900)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "engine_bench.json")
    args = parser.parse_args(argv)
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    if not 0 <= args.mixed_paid <= args.users:
        parser.error("--mixed-paid must be between 0 and --users")
    if not args.sweep_levels or min(args.sweep_levels) < 1 or args.sweep_turns < 1:
        parser.error("--sweep-levels must be positive integers and --sweep-turns >= 1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    with contextlib.suppress(KeyboardInterrupt):
        return run(args)
    return 130


if __name__ == "__main__":
    sys.exit(main())
