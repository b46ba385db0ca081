"""Chat throughput/latency: the bare vLLM engine vs the full stack (uvicorn + Django + SSE).

Run through the dev stack (it provides PostgreSQL and Redis)::

    make bench                       # = python -m chatsite.devstack exec -- python -m bench.chat_bench
    make bench BENCH_ARGS="--reps 1 --concurrency 1,8"

Phase 1 ("bare") drives :class:`inference.engine.VllmEngine` in this process: N concurrent chats,
each the product's system prompt + one user prompt from a fixed list, greedy, 128 tokens.
The engine is shut down before phase 2.

Phase 2 ("full") starts the real server (``python -m chatsite.serve``: uvicorn) as a subprocess
with greedy, 128-token settings, signs up one user per concurrent chat through the sign-up form,
and runs the same chats the way the page does: ``POST /chat/turns`` (htmx), then the answer's
event stream (``sse-connect`` URL) until ``event: done``.

Per request: TTFT (submit -> first token with text; full stack: from sending the POST), TPOT
((last token - first token) / (completion_tokens - 1)); per batch: completion tokens / wall time.
Each N is repeated ``--reps`` times after a warm-up; TTFT/TPOT percentiles pool the requests of
all repeats, tokens/s is the median over repeats. Results: a table on stdout and
``var/bench/chat_bench.json``.

Targets: full-stack tokens/s >= 0.9x bare at N=32; full-stack TTFT p50 within 50 ms of bare at
every N. Exit status: 0 when the run completed (targets met or not; ``--strict``: 1 on a miss),
2 when requests failed.

Background load skews CPU numbers on a small machine: every batch records the CPU used by this
stack (per process) and by everything else, and batches where other processes used more than 5%
of the machine are listed as disturbed. ``--probe`` serves ``bench/probe_asgi.py`` (the same app
plus server-side timestamps); ``--patch-db`` adds an experimental fix for the database-connection
leak (diagnostic only, not the product's numbers).

Phase 1 is bench/chat_bare.py, phase 2 bench/chat_full.py, the results bench/chat_batches.py;
percentiles, the CPU meter and the server process come from bench/harness.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from bench.chat_bare import run_bare
from bench.chat_batches import (
    MAX_TOKENS,
    BatchResult,
    batch_disturbed,
    batches_json,
    model_path,
    summarize,
    system_prompt,
)
from bench.chat_full import DIAG, run_full
from bench.harness import PROMPTS, VAR, log, ms, percentile

# Targets (the issue's acceptance criteria).
TOKS_RATIO_TARGET = 0.9  # full/bare tokens/s at the largest N
TTFT_DELTA_TARGET_MS = 50.0  # full - bare TTFT p50, at every N


# --------------------------------------------------------------------------------------------
# Report


def report(args, bare: dict[int, list[BatchResult]], full: dict[int, list[BatchResult]]) -> dict:
    rows = []
    for n in args.concurrency:
        b = summarize(bare.get(n, []))
        f = summarize(full.get(n, []))
        ratio = (
            f["tokens_per_s"] / b["tokens_per_s"]
            if b["tokens_per_s"] and f["tokens_per_s"] is not None
            else None
        )
        delta_ms = (
            (f["ttft_p50_s"] - b["ttft_p50_s"]) * 1000
            if b["ttft_p50_s"] is not None and f["ttft_p50_s"] is not None
            else None
        )
        rows.append({"n": n, "bare": b, "full": f, "toks_ratio": ratio, "ttft_p50_delta_ms": delta_ms})

    header = (
        f"{'N':>3} | {'bare TTFT p50/p99 ms':>20} | {'full TTFT p50/p99 ms':>20} | "
        f"{'bare TPOT p50/p99 ms':>20} | {'full TPOT p50/p99 ms':>20} | "
        f"{'bare tok/s':>10} | {'full tok/s':>10} | {'full/bare':>9} | {'dTTFT p50 ms':>12}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in rows:
        b, f = r["bare"], r["full"]

        def pair(s, key):
            return f"{ms(s[key + '_p50_s'], 0)} / {ms(s[key + '_p99_s'], 0)}"

        def num(x, fmt):
            return "-" if x is None else format(x, fmt)

        print(
            f"{r['n']:>3} | {pair(b, 'ttft'):>20} | {pair(f, 'ttft'):>20} | "
            f"{pair(b, 'tpot'):>20} | {pair(f, 'tpot'):>20} | "
            f"{num(b['tokens_per_s'], '.1f'):>10} | {num(f['tokens_per_s'], '.1f'):>10} | "
            f"{num(r['toks_ratio'], '.3f'):>9} | {num(r['ttft_p50_delta_ms'], '+.0f'):>12}"
        )
    print()

    # Targets
    n_max = max(args.concurrency)
    top = next(r for r in rows if r["n"] == n_max)
    errors = sum(r["bare"]["errors"] + r["full"]["errors"] for r in rows)
    checks = []
    ok = top["toks_ratio"] is not None and top["toks_ratio"] >= TOKS_RATIO_TARGET
    checks.append(
        {
            "target": f"full tok/s >= {TOKS_RATIO_TARGET}x bare at N={n_max}",
            "value": top["toks_ratio"],
            "pass": ok,
        }
    )
    for r in rows:
        d = r["ttft_p50_delta_ms"]
        checks.append(
            {
                "target": f"full TTFT p50 within {TTFT_DELTA_TARGET_MS:.0f} ms of bare at N={r['n']}",
                "value": d,
                "pass": d is not None and d <= TTFT_DELTA_TARGET_MS,
            }
        )
    if errors:
        checks.append({"target": "no failed requests", "value": errors, "pass": False})
    skipped = args.skip_bare or args.skip_full
    for c in checks:
        v = c["value"]
        shown = "-" if v is None else (f"{v:.3f}x" if "tok/s" in c["target"] else f"{v:+.0f} ms")
        if c["target"] == "no failed requests":
            shown = f"{v} failed"
        verdict = "PASS" if c["pass"] else ("SKIP" if v is None and skipped else "MISS")
        print(f"  {verdict}  {c['target']}  ({shown})")
    all_ok = all(c["pass"] for c in checks)
    print(f"\n  overall: {'PASS' if all_ok else 'MISS'}\n")

    # Same greedy prompts -> the outputs should match (batching can change float rounding).
    matches = []
    for n in args.concurrency:
        same = total = 0
        for bb, fb in zip(bare.get(n, []), full.get(n, []), strict=False):
            for bc, fc in zip(bb.chats, fb.chats, strict=False):
                total += 1
                same += bc.text == fc.text
        matches.append({"n": n, "identical_outputs": same, "compared": total})
    print(
        "  identical bare/full outputs: "
        + ", ".join(f"N={m['n']}: {m['identical_outputs']}/{m['compared']}" for m in matches)
    )
    disturbed = [
        f"{phase} N={b.n} rep {b.rep} ({b.cpu['other_cpu_s']:.1f} CPU-s)"
        for phase, results in (("bare", bare), ("full", full))
        for batches in results.values()
        for b in batches
        if batch_disturbed(b)
    ]
    print(
        "  batches with background load from other processes (>5% of the machine): "
        + (", ".join(disturbed) if disturbed else "none")
    )
    client = [
        (b.cpu["bench_process_cpu_s"], b.wall_s)
        for batches in full.values()
        for b in batches
        if b.cpu
    ]
    if client:
        print(
            f"  benchmark client CPU during full-stack batches: {sum(c for c, _ in client):.1f} "
            f"CPU-s over {sum(w for _, w in client):.0f} s wall"
        )
    print("  stack CPU by process, mean CPU-s per batch (bare | full):")
    for n in args.concurrency:
        def roles(batches):
            acc: dict[str, float] = {}
            for b in batches:
                for k, v in b.cpu.get("stack_cpu_by_role_s", {}).items():
                    acc[k] = acc.get(k, 0.0) + v / len(batches)
            return ", ".join(f"{k} {v:.1f}" for k, v in sorted(acc.items()) if v >= 0.05) or "-"

        print(f"    N={n}: {roles(bare.get(n, []))} | {roles(full.get(n, []))}")
    full_extra = {}
    for n in args.concurrency:
        chats = [c for b in full.get(n, []) for c in b.chats]
        posts = [c.extra.get("post_s") for c in chats if "post_s" in c.extra]
        heads = [c.extra.get("headers_s") for c in chats if "headers_s" in c.extra]
        tails = [c.extra.get("done_after_last_token_s") for c in chats if "done_after_last_token_s" in c.extra]
        full_extra[n] = {
            "post_p50_s": percentile(posts, 50, default=None),
            "post_p99_s": percentile(posts, 99, default=None),
            "stream_headers_p50_s": percentile(heads, 50, default=None),
            "done_after_last_token_p50_s": percentile(tails, 50, default=None),
        }
    print(
        "  full-stack breakdown (p50 ms): "
        + "; ".join(
            f"N={n}: POST {ms(x['post_p50_s'], 0)} (p99 {ms(x['post_p99_s'], 0)}), "
            f"stream headers {ms(x['stream_headers_p50_s'], 0)}, "
            f"done after last token {ms(x['done_after_last_token_p50_s'], 0)}"
            for n, x in full_extra.items()
        )
    )
    if args.probe or args.patch_db:
        print("  server-side probe, p50 ms from POST arrival (bench/probe_asgi.py):")
        for n in args.concurrency:
            lines = [p for b in full.get(n, []) for p in b.probe]
            turns = [p for p in lines if p["kind"] == "turn"]
            posts = [p for p in lines if p["kind"] == "post"]

            def p50(items, key):
                value = percentile([p[key] for p in items], 50, default=None)
                return "-" if value is None else f"{value:.0f}"

            last = lines[-1] if lines else {}
            print(
                f"    N={n}: engine.generate called {p50(turns, 'generate_called_ms')}, "
                f"first delta {p50(turns, 'first_delta_ms')} "
                f"(engine TTFT {p50(turns, 'engine_ttft_ms')}), "
                f"POST response sent {p50(posts, 'response_sent_ms')}; "
                f"threads {last.get('threads')}, "
                f"DB connections opened so far {last.get('db_connections_opened')}"
            )
    print()
    return {
        "rows": rows,
        "checks": checks,
        "overall_pass": all_ok,
        "identical_outputs": matches,
        "disturbed_batches": disturbed,
        "full_breakdown": {str(k): v for k, v in full_extra.items()},
    }


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m bench.chat_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated N values")
    parser.add_argument("--reps", type=int, default=2, help="repeats of each N (default 2)")
    parser.add_argument("--warmup", type=int, default=2, help="single warm-up chats (default 2)")
    parser.add_argument(
        "--warmup-batch",
        type=int,
        default=None,
        help="one concurrent warm-up batch of this size (default: the largest N)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a target is missed (default: 0)"
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="serve bench.probe_asgi (server-side timestamps; diagnostic, not the plain app)",
    )
    parser.add_argument(
        "--patch-db",
        action="store_true",
        help="diagnostic: serve with an experimental fix for the DB connection leak "
        "(CONN_MAX_AGE=0, background DB work closes its connection); implies --probe",
    )
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "chat_bench.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.warmup_batch is None:
        args.warmup_batch = max(args.concurrency)
    return args


async def amain(args) -> int:
    started = time.perf_counter()
    bare: dict[int, list[BatchResult]] = {}
    full: dict[int, list[BatchResult]] = {}
    if not args.skip_bare:
        bare = await run_bare(args)
        # Let the EngineCore process exit and its memory go before the server starts its own.
        await asyncio.sleep(2)
    if not args.skip_full:
        full = await run_full(args)
    summary = report(args, bare, full)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "concurrency": args.concurrency,
            "reps": args.reps,
            "warmup": args.warmup,
            "warmup_batch": args.warmup_batch,
            "server_app": (
                "bench.probe_asgi:application" if args.probe or args.patch_db
                else "chatsite.asgi:application"
            ),
            "patch_db": args.patch_db,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "system_prompt": system_prompt(),
            "prompts": PROMPTS,
            "model_path": model_path(),
            "cpu_count": os.cpu_count(),
            "loadavg_end": os.getloadavg(),
        },
        "total_s": total_s,
        "diagnostics": DIAG,
        **summary,
        "bare": batches_json(bare),
        "full": batches_json(full),
    }
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    errors = sum(r["bare"]["errors"] + r["full"]["errors"] for r in summary["rows"])
    if errors:
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
