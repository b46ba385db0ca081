"""The report of bench/engine_bench.py: its targets (issue 9) and :func:`report`, which prints
the tables, ratios and PASS/MISS per target of a run's results and returns the summary the
bench stores in its JSON.
"""


from bench.engine_mixed import mixed_report
from bench.engine_workload import (
    SINGLE_PROMPT_TOKENS,
)
from bench.harness import (
    ms,
)

TTFT_SINGLE_TARGET_S = 0.150
TPOT_SINGLE_TARGET_S = 0.020
THROUGHPUT_RATIO_TARGET = 3.0
TTFT_P99_CONCURRENT_TARGET_S = 2.0
READY_TARGET_S = 90.0


def served_variant() -> str:
    """The quantization the engine serves with (inference/tuning.py EngineTuning)."""
    from inference.tuning import EngineTuning  # noqa: PLC0415

    return EngineTuning.from_settings().resolved_quantization()


def report(result: dict, args) -> dict:
    checks: list[dict] = []

    def check(target: str, value, shown: str, ok: bool | None) -> None:
        checks.append({"target": target, "value": value, "shown": shown, "pass": bool(ok)})

    ours = result.get("full", {})
    llama = result.get("llama", {})
    print()
    print(f"Engine: {ours.get('engine', {}).get('tuning', '-')}  (label: {args.label})")
    print(f"a/c. Single stream: ~{SINGLE_PROMPT_TOKENS}-token prompt, answers capped at "
          f"{args.answer_tokens} tokens, greedy, {args.single_turns} turns one at a time")  # fmt: skip
    header = (f"   {'server':<18} | {'TTFT p50 ms':>11} | {'TPOT p50 ms':>11} | {'TPOT p99':>8} | "
              f"{'prompt tok':>10} | {'tokens':>6} | {'load':>4}")  # fmt: skip
    print(header)
    print("   " + "-" * (len(header) - 3))
    rows = [("full stack", ours.get("single"))] + [(n, r.get("single")) for n, r in llama.items()]
    for name, s in rows:
        if not s:
            continue
        print(f"   {name:<18} | {ms(s['ttft_p50_s']):>11} | {ms(s['tpot_p50_s'], 2):>11} | "
              f"{ms(s['tpot_p99_s'], 1):>8} | {s['prompt_tokens_mean'] or 0:>10.0f} | "
              f"{s['completion_tokens']:>6} | {s['loadavg_1m_before']:>4.1f}"
              + ("  (disturbed)" if s["disturbed"] else ""))  # fmt: skip
    print()
    print(f"b/c. Concurrent: {args.users} users, {args.turns_per_user} turns each, Poisson "
          f"arrivals, prompts ~50-1000 tokens, answers capped at 32-300 (seed {args.seed})")
    header = (f"   {'server':<18} | {'tok/s':>7} | {'tokens':>6} | {'wall s':>6} | "
              f"{'TTFT p50 ms':>11} | {'TTFT p99 ms':>11} | {'TPOT p50 ms':>11} | {'load':>4}")
    print(header)
    print("   " + "-" * (len(header) - 3))
    rows = [("full stack", ours.get("concurrent"))] + [
        (n, r.get("concurrent")) for n, r in llama.items()
    ]
    for name, s in rows:
        if not s:
            continue
        print(f"   {name:<18} | {s['tokens_per_s'] or 0:>7.1f} | {s['completion_tokens']:>6} | "
              f"{s['wall_s']:>6.1f} | {ms(s['ttft_p50_s']):>11} | {ms(s['ttft_p99_s']):>11} | "
              f"{ms(s['tpot_p50_s'], 2):>11} | {s['loadavg_1m_before']:>4.1f}"
              + ("  (disturbed)" if s["disturbed"] else ""))  # fmt: skip
    for name, r in llama.items():
        if r.get("error"):
            print(f"   {name}: failed: {r['error'][:200]}")
    sweep = ours.get("sweep")
    if sweep:
        print()
        print(f"f. Sweep: n users at once, {args.sweep_turns} turns each back to back, "
              f"~{SINGLE_PROMPT_TOKENS}-token prompts, answers capped at "
              f"{args.sweep_answer_tokens} (python manage.py capacity reads it)")  # fmt: skip
        header = (f"   {'users':>5} | {'tok/s':>7} | {'TPOT p50 ms':>11} | {'TPOT p99 ms':>11} | "
                  f"{'TTFT p50 ms':>11} | {'TTFT p99 ms':>11} | {'errors':>6} | {'load':>4}")
        print(header)
        print("   " + "-" * (len(header) - 3))
        for row in sweep:
            print(f"   {row['concurrency']:>5} | {row['tokens_per_s'] or 0:>7.1f} | "
                  f"{row['tpot_p50_ms'] or 0:>11.2f} | {row['tpot_p99_ms'] or 0:>11.2f} | "
                  f"{row['ttft_p50_ms'] or 0:>11.1f} | {row['ttft_p99_ms'] or 0:>11.1f} | "
                  f"{row['errors']:>6} | {row['loadavg_1m_before'] or 0:>4.1f}"
                  + ("  (disturbed)" if row["disturbed"] else ""))  # fmt: skip

    single = ours.get("single")
    if single:
        v = single["ttft_p50_s"]
        check(f"single stream TTFT p50 <= {TTFT_SINGLE_TARGET_S * 1000:.0f} ms", v,
              f"{ms(v)} ms", v is not None and v <= TTFT_SINGLE_TARGET_S)  # fmt: skip
        v = single["tpot_p50_s"]
        check(f"single stream TPOT p50 <= {TPOT_SINGLE_TARGET_S * 1000:.0f} ms", v,
              f"{ms(v, 2)} ms", v is not None and v <= TPOT_SINGLE_TARGET_S)  # fmt: skip
        base = (llama.get("llama_cpp.server") or {}).get("single")
        if base and base.get("tpot_p50_s") and single["tpot_p50_s"]:
            print(f"\n   single-stream TPOT, full stack / llama_cpp.server: "
                  f"{single['tpot_p50_s'] / base['tpot_p50_s']:.2f}x; TTFT: "
                  f"{(single['ttft_p50_s'] or 0) / (base['ttft_p50_s'] or 1):.2f}x")  # fmt: skip
    concurrent = ours.get("concurrent")
    if concurrent:
        v = concurrent["ttft_p99_s"]
        check(f"{args.users} streams TTFT p99 <= {TTFT_P99_CONCURRENT_TARGET_S:.0f} s", v,
              f"{ms(v, 0)} ms", v is not None and v <= TTFT_P99_CONCURRENT_TARGET_S)  # fmt: skip
        base = (llama.get("llama_cpp.server") or {}).get("concurrent")
        if base and base.get("errors"):
            # A baseline that dropped requests served less work: no ratio against it.
            print(f"   {args.users}-user tokens/s vs llama_cpp.server: no ratio, "
                  f"{base['errors']} of its {base['turns']} turns failed ({base['first_error']})")
            check(f"{args.users} streams tokens/s >= {THROUGHPUT_RATIO_TARGET:.0f}x "
                  "llama_cpp.server's", None, "baseline failed", False)  # fmt: skip
        elif base and base.get("tokens_per_s"):
            ratio = (concurrent["tokens_per_s"] or 0) / base["tokens_per_s"]
            print(f"   {args.users}-user tokens/s, full stack / llama_cpp.server: {ratio:.2f}x")
            check(f"{args.users} streams tokens/s >= {THROUGHPUT_RATIO_TARGET:.0f}x "
                  "llama_cpp.server's", ratio, f"{ratio:.2f}x",
                  ratio >= THROUGHPUT_RATIO_TARGET)  # fmt: skip
        parallel = (llama.get("llama-server") or {}).get("concurrent")
        if parallel and parallel.get("tokens_per_s"):
            ratio = (concurrent["tokens_per_s"] or 0) / parallel["tokens_per_s"]
            print(f"   {args.users}-user tokens/s, full stack / llama-server (parallel): "
                  f"{ratio:.2f}x (no target)")  # fmt: skip
    mixed = ours.get("mixed")
    if mixed:
        checks.extend({"value": None, **row} for row in mixed_report(mixed))
    ready = result.get("ready")
    if ready:
        v = ready["ready_s"]
        print(f"\nd. make run's stack ready (spawn -> /readyz 200): "
              f"{'-' if v is None else f'{v:.1f} s'}")  # fmt: skip
        check(f"ready within {READY_TARGET_S:.0f} s of make run", v,
              "-" if v is None else f"{v:.1f} s", v is not None and v <= READY_TARGET_S)
    quality = result.get("quality")
    if quality and "skipped" not in quality:
        print(f"\ne. Quality, {quality.get('variant')} vs unquantised ({quality.get('dtype')}): "
              f"greedy agreement over the first "
              f"64 tokens {quality['agreement']:.3f} (prefix match {quality['prefix_match']:.3f}), "
              f"perplexity {quality['ppl_quantized']:.3f} vs {quality['ppl_reference']:.3f} "
              f"({quality['ppl_ratio']:.3f}x)")  # fmt: skip
        # A target only for the weights being served; otherwise it informs the choice.
        in_use = quality.get("variant") == served_variant()
        print(f"   perplexity within 5%: {'yes' if quality['ppl_ratio'] <= 1.05 else 'no'}"
              + ("" if in_use else " (not the weights served: CHAT_ENGINE_QUANTIZATION)"))
        if in_use:
            check(f"{quality['variant']} perplexity within 5% of unquantised", quality["ppl_ratio"],
                  f"{quality['ppl_ratio']:.3f}x", quality["ppl_ratio"] <= 1.05)  # fmt: skip
    elif quality:
        print(f"\ne. Quality: skipped ({quality['skipped']})")
    print()
    for c in checks:
        print(f"  {'PASS' if c['pass'] else 'MISS'}  {c['target']}  ({c['shown']})")
    overall = bool(checks) and all(c["pass"] for c in checks)
    print(f"\n  overall: {'PASS' if overall else 'MISS'}\n")
    return {"checks": checks, "overall_pass": overall}
