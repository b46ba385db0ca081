"""The report of bench/moderation_bench.py: its targets (issue 6) and :func:`report`, which
prints the tables and PASS/MISS per target of a run's results and returns the summary the bench
stores in its JSON.
"""


from bench.harness import (
    ms,
)
from bench.moderation_everyday import everyday_report
from bench.moderation_input import BLOCKED_TERMS, INPUT_CHARS

INPUT_P99_TARGET_S = 0.050
OUTPUT_RATIO_TARGET = 1.05
PR_TARGET = 0.9
EVERYDAY_TARGET = 0.98


def report(result: dict, args, settings) -> dict:
    checks: list[dict] = []
    inj = result["injection"]
    print()
    print(
        f"a. Prompt injection on the labelled evaluation set "
        f"(moderation/data/injection_eval.jsonl: {inj['n_attacks']} attacks, "
        f"{inj['n_benign']} harmless look-alikes; threshold {inj['threshold']}; classifier "
        f"trained on {inj['train_examples']} other examples)"
    )
    print(
        f"   precision {inj['precision']:.3f} ({inj['tp']} of {inj['tp'] + inj['fp']} flagged are "
        f"attacks)   recall {inj['recall']:.3f} ({inj['tp']} of {inj['n_attacks']} attacks caught)"
        f"   missed: {inj['fn']}, false alarms: {inj['fp']}"
    )
    for what in ("precision", "recall"):
        checks.append({"target": f"injection {what} >= {PR_TARGET}", "value": inj[what],
                       "shown": f"{inj[what]:.3f}", "pass": inj[what] >= PR_TARGET})
    everyday = inj["everyday"]
    print(
        f"   everyday requests phrased as commands (moderation/data/everyday_eval.jsonl, held "
        f"out): {everyday['passed']} of {everyday['n']} pass = {everyday['pass_rate']:.3f}"
    )
    for wrong in everyday["flagged"]:
        print(f"     flagged {wrong['score']:.2f} [{wrong['style']}] {wrong['text'][:90]}")
    checks.append({"target": f"everyday commands pass rate >= {EVERYDAY_TARGET}",
                   "value": everyday["pass_rate"], "shown": f"{everyday['pass_rate']:.3f}",
                   "pass": everyday["pass_rate"] >= EVERYDAY_TARGET})
    if args.only == "injection":
        return finish(checks)
    if args.only == "everyday":
        return finish(checks + everyday_report(result.get("everyday"), result.get("attacks")))

    phases = result["input"]
    print()
    moderator = settings.CHAT_MODERATOR.rsplit(".", 1)[-1]
    timeout_ms = settings.CHAT_MODERATION_TIMEOUT_S * 1000
    print(
        f"b. Input gate latency: moderation.base.acheck('input') on a {INPUT_CHARS:,}-character "
        f"harmless message, {args.checks} sequential checks per row, {moderator}, "
        f"{BLOCKED_TERMS} blocked terms, timeout {timeout_ms:.0f} ms"
    )
    header = (
        f"   {'engine':<12} | {'streams':>7} | {'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} | "
        f"{'failed':>6} | {'flagged':>7} | {'engine tok/s':>12} | {'other CPU-s':>11}"
    )
    print(header)
    print("   " + "-" * (len(header) - 3))
    for phase in phases.values():
        s = phase.summary()
        streams = (
            "-" if s["streams_min"] is None else f"{s['streams_min']}-{max(phase.streams_seen)}"
        )
        print(
            f"   {s['phase']:<12} | {streams:>7} | {ms(s['p50_s']):>7} | {ms(s['p99_s']):>7} | "
            f"{ms(s['max_s']):>7} | {s['failed']:>6} | {s['flagged']:>7} | "
            f"{s['engine_tokens_per_s']:>12.0f} | {s['other_cpu_s'] or 0:>11.1f}"
            + ("  (disturbed)" if s["disturbed"] else "")
        )
    print("   flagged: harmless messages the check stopped (false alarms); failed: timeouts or "
          "errors (fail closed)")
    loaded = phases["loaded"].summary()
    checks.append({
        "target": f"input gate p99 < {INPUT_P99_TARGET_S * 1000:.0f} ms with {args.streams} "
                  "streams decoding",
        "value": loaded["p99_s"], "shown": f"{ms(loaded['p99_s'])} ms",
        "pass": loaded["p99_s"] is not None and loaded["p99_s"] < INPUT_P99_TARGET_S,
    })  # fmt: skip
    if loaded["failed"] or phases["idle"].failed:
        checks.append({"target": "no input check failed (timeout or error)", "pass": False,
                       "value": loaded["failed"] + phases["idle"].failed,
                       "shown": f"{loaded['failed'] + phases['idle'].failed} failed"})

    out = result["output"]
    print()
    print(
        f"c. Output gate cost through the full stack: POST /v1/conversations/{{id}}/turns (SSE), "
        f"{args.max_tokens}-token answers, greedy, one turn at a time; {args.rounds} rounds of "
        f"{args.turns} turns per side, alternating; window {settings.CHAT_MODERATION_WINDOW_CHARS} "
        f"chars every {settings.CHAT_MODERATION_STEP_CHARS}"
    )
    if "skipped" in out:
        print(f"   skipped: {out['skipped']}")
        checks.append({"target": "output gate measured", "value": None, "shown": out["skipped"],
                       "pass": False})
    else:
        header = (
            f"   {'output gate':<11} | {'turns':>5} | {'TTFT p50 ms':>11} | {'TPOT p50 ms':>11} | "
            f"{'done lag p50':>12} | {'tokens':>6} | {'checks/turn':>11} | {'check ms':>8} | "
            f"{'blocked':>7}"
        )
        print(header)
        print("   " + "-" * (len(header) - 3))
        for gate in ("off", "on"):
            s = out["sides"][gate]
            per_turn = s["output_checks"] / s["turns"] if s["turns"] else 0
            print(
                f"   {gate:<11} | {s['turns']:>5} | {ms(s['ttft_p50_s']):>11} | "
                f"{ms(s['tpot_p50_s'], 2):>11} | {ms(s['done_lag_p50_s']) + ' ms':>12} | "
                f"{s['completion_tokens_mean'] or 0:>6.0f} | {per_turn:>11.1f} | "
                f"{ms(s['output_check_mean_s'], 2):>8} | {s['blocked']:>7}"
                + ("  (disturbed)" if s["disturbed"] else "")
            )
        rounds = ", ".join(
            f"{r['ttft_ratio']:.2f}/{r['tpot_ratio']:.2f}" for r in out["per_round"]
            if r["ttft_ratio"] and r["tpot_ratio"]
        )
        print(
            f"   on / off: TTFT p50 {out['ttft_ratio']:.3f}x, TPOT p50 {out['tpot_ratio']:.3f}x; "
            f"median of the rounds' ratios: TTFT {out['ttft_ratio_median_of_rounds']:.3f}x, "
            f"TPOT {out['tpot_ratio_median_of_rounds']:.3f}x"
        )
        print(f"   per round TTFT/TPOT on/off: {rounds}")
        print("   done lag: last token -> done event (the gate's check of the answer's tail and "
              "storing the answer)")
        for what in ("ttft", "tpot"):
            value = out[f"{what}_ratio"]
            checks.append({
                "target": (
                    f"{what.upper()} p50 with the output gate / without <= {OUTPUT_RATIO_TARGET}"
                ),
                "value": value, "shown": "-" if value is None else f"{value:.3f}x",
                "pass": value is not None and value <= OUTPUT_RATIO_TARGET,
            })  # fmt: skip
        errors = out["sides"]["on"]["errors"] + out["sides"]["off"]["errors"]
        if errors:
            checks.append({"target": "no failed turns", "value": errors,
                           "shown": f"{errors} failed", "pass": False})
    checks += everyday_report(result.get("everyday"), result.get("attacks"))
    return finish(checks)


def finish(checks: list[dict]) -> dict:
    """Print the targets met and missed; ``{"checks", "overall_pass"}``."""
    print()
    for check in checks:
        print(f"  {'PASS' if check['pass'] else 'MISS'}  {check['target']}  ({check['shown']})")
    all_ok = all(check["pass"] for check in checks)
    print(f"\n  overall: {'PASS' if all_ok else 'MISS'}\n")
    return {"checks": checks, "overall_pass": all_ok}
