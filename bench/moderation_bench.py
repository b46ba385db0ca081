"""Moderation gates (issue 6): prompt-injection precision and recall on the labelled set, the
input gate's latency while the engine is busy, and what the output gate costs a streamed answer.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.moderation_bench [--rounds 8]

One real vLLM engine (:meth:`inference.engine.VllmEngine.from_settings`, the shipped model) runs
in this process behind uvicorn (``chatsite.serve.serve_in_thread``, serving
``chatsite.asgi.application``, as tests/conftest.py's ``chat_server`` does), with the
moderator the deployment is configured with (``settings.CHAT_MODERATOR``; default: the local
classifiers). Three parts, one run:

- **a. Prompt injection**: ``moderation.local.injection_eval_scores()``: the classifier, trained
  on ``moderation/data/injection_train.jsonl``, judged on the separate labelled evaluation set
  ``moderation/data/injection_eval.jsonl`` (attacks and harmless look-alikes) at the deployment's
  ``prompt_injection`` threshold. Target: precision and recall >= 0.9. Then
  ``moderation.local.everyday_eval_scores()``: the share of the held-out everyday requests
  phrased as commands (``moderation/data/everyday_eval.jsonl``: "Say exactly...", "From now on
  answer in French", all harmless) that pass the same threshold. Target: >= 0.98 (issue 18).
  ``--only injection`` runs this part alone (no engine, no database: seconds).
- **b. Input gate latency**: ``moderation.base.acheck("input", ...)`` on a 4,000-character
  message (harmless prose, shuffled differently each call, checked against a policy with 100
  blocked terms), ``--checks`` sequential calls (0-10 ms apart) awaited on the server's event
  loop, first with the engine idle (the baseline), then while ``--streams`` generations stream
  from the same engine (each restarts when it ends, so they never drop below that number).
  Latency is what a turn waits: from the ``await`` to the verdict (thread hand-off included).
  Target: p99 < 50 ms under load.
- **c. Output gate cost**: turns through the full stack over HTTP (``POST
  /v1/conversations/{id}/turns``, SSE, an API key, ``--max-tokens`` per answer, greedy, a fresh
  conversation per turn so every turn's prompt is the same length), one at a time, in
  alternating phases with ``settings.CHAT_MODERATION_OUTPUT`` on and off (read per turn by
  conversations/generate.py): ``--rounds`` rounds, ordered on/off, off/on, ..., each phase
  ``--turns`` sequential turns on the same prompts as the other phase of its round (the rounds
  cycle through ``PROMPT_SET`` prompts), so short bursts of load on the shared machine land on
  both sides of a round alike. The prompts are played once before (warm-up: prefix cache,
  moderator). Also printed: the median over rounds of each round's on/off ratio (robust to
  one disturbed round). TTFT = request sent -> first
  ``token`` event with text; TPOT = (last token event - first) / (completion tokens - 1); both
  as bench/chat_bench.py measures them. Target: on / off <= 1.05 for TTFT p50 and TPOT p50.
  The input gate is on in both phases. Skipped (said so) when the output gate never runs.

- **d. Everyday requests and attacks** (issue 28, bench/moderation_everyday.py): the 315
  everyday requests of ``bench/data/everyday_requests.jsonl`` through the real engine and both
  gates (refused, withdrawn, which category), and recall on the held-out attack sets per
  category at the input gate. ``--only everyday`` runs parts a and d.

The dev database is migrated first (part c creates a user, an API key and conversations in it
and deletes them at the end). Rate limits, load shedding and reserved slots are off (this
bench measures moderation, not them). Results: tables on stdout and
``var/bench/moderation_bench.json``. Each measured phase records the CPU used by other
processes (the machine is small and shared); a disturbed phase is flagged. Exit status 0 when
the run completed (``--strict``: 1 on a missed target), 2 when requests failed.

Part b is bench/moderation_input.py; the server and the API client come from bench/harness.py
and bench/clients.py.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.clients import Api, TurnSample, connections_close_all
from bench.harness import (
    PROMPTS,
    VAR,
    CpuMeter,
    InProcessServer,
    disturbed,
    log,
    ms,
    percentile,
    ratio,
    tier_machinery_off,
)
from bench.moderation_everyday import attack_part, everyday_part
from bench.moderation_input import BLOCKED_TERMS, INPUT_CHARS, input_part
from bench.moderation_report import report

PROMPT_SET = 4  # part c's prompts (PROMPTS[:4]), cycled through by the rounds


# --------------------------------------------------------------------------------------------
# a. Prompt injection on the labelled evaluation set


def injection_part() -> dict:
    from moderation.local import everyday_eval_scores, injection_eval_scores  # noqa: PLC0415

    started = time.perf_counter()
    scores = injection_eval_scores()
    scores["seconds"] = time.perf_counter() - started  # includes training at first use
    scores["everyday"] = everyday_eval_scores()
    log(
        f"injection eval: precision {scores['precision']:.3f}, recall {scores['recall']:.3f} "
        f"({scores['n_attacks']} attacks, {scores['n_benign']} look-alikes); everyday commands "
        f"pass {scores['everyday']['pass_rate']:.3f} of {scores['everyday']['n']}"
    )
    return scores


# --------------------------------------------------------------------------------------------
# c. Output gate on vs off through the full stack


def output_checks() -> float:
    from core import metrics  # noqa: PLC0415

    return sum(
        metrics.value("chat_moderation_checks_total", gate="output", result=r)
        for r in ("clean", "flagged", "failed")
    )


def output_seconds() -> tuple[float, float]:
    """(sum of seconds, number) of output checks so far (chat_moderation_seconds{gate=output})."""
    from core import metrics  # noqa: PLC0415

    return (
        metrics.value("chat_moderation_seconds_sum", gate="output"),
        metrics.value("chat_moderation_seconds_count", gate="output"),
    )


def p50(values) -> float | None:
    """The median of the values that are not None; None when there are none."""
    return percentile([v for v in values if v is not None], 50, default=None)


def output_part(server: InProcessServer, args) -> dict:
    from django.conf import settings  # noqa: PLC0415
    from django.db import OperationalError  # noqa: PLC0415

    prompts = PROMPTS[:PROMPT_SET]
    connections_close_all()  # this thread's connection is minutes old: start afresh
    try:
        api = Api(server.url)
    except OperationalError as exc:  # a connection the shared dev PostgreSQL dropped meanwhile
        log(f"database connection lost ({exc}); reconnecting")
        connections_close_all()
        api = Api(server.url)
    samples: list[TurnSample] = []
    meters: dict[str, list[dict]] = {"on": [], "off": []}
    checks = {"on": 0.0, "off": 0.0}
    check_time = {"on": [0.0, 0.0], "off": [0.0, 0.0]}
    saved = settings.CHAT_MODERATION_OUTPUT
    try:
        settings.CHAT_MODERATION_OUTPUT = True
        before = output_checks()
        log(f"output gate: warm-up, {len(prompts)} turns")
        warm = [api.turn(p, args.max_tokens, "on", -1, i) for i, p in enumerate(prompts)]
        if output_checks() == before:
            errors = [t.error for t in warm if t.error]
            log("output gate: no output check ran with CHAT_MODERATION_OUTPUT on: part c skipped"
                + (f" ({errors[0]})" if errors else ""))
            return {"skipped": "the output gate did not run (not wired into the request path?)",
                    "warm_up": [asdict(t) for t in warm]}
        for r in range(args.rounds):
            for gate in (("on", "off") if r % 2 == 0 else ("off", "on")):
                settings.CHAT_MODERATION_OUTPUT = gate == "on"
                n_before = output_checks()
                s_before = output_seconds()
                meter = CpuMeter()
                meter.start()
                phase = []
                for k in range(args.turns):
                    index = (r * args.turns + k) % len(prompts)
                    phase.append(api.turn(prompts[index], args.max_tokens, gate, r, index))
                meters[gate].append(meter.stop())
                checks[gate] += output_checks() - n_before
                s_after = output_seconds()
                check_time[gate][0] += s_after[0] - s_before[0]
                check_time[gate][1] += s_after[1] - s_before[1]
                samples.extend(phase)
                ttft = p50(t.ttft_s for t in phase)
                tp = p50(t.tpot_s for t in phase)
                log(f"output gate {gate:>3}, round {r + 1}: TTFT p50 {ms(ttft)} ms, "
                    f"TPOT p50 {ms(tp, 2)} ms")
    finally:
        settings.CHAT_MODERATION_OUTPUT = saved
        api.close()
    sides = {}
    for gate in ("on", "off"):
        rows = [t for t in samples if t.gate == gate]
        ok = [t for t in rows if t.error is None]
        sides[gate] = {
            "turns": len(rows),
            "errors": len(rows) - len(ok),
            "blocked": sum(1 for t in ok if t.status == "blocked"),
            "ttft_p50_s": p50(t.ttft_s for t in ok),
            "tpot_p50_s": p50(t.tpot_s for t in ok),
            "done_lag_p50_s": p50(t.done_after_last_token_s for t in ok),
            "completion_tokens_mean": (
                sum(t.completion_tokens for t in ok) / len(ok) if ok else None
            ),
            "output_checks": checks[gate],
            "output_check_mean_s": (check_time[gate][0] / check_time[gate][1])
            if check_time[gate][1] else None,
            "other_cpu_s": sum(m["other_cpu_s"] for m in meters[gate]),
            "disturbed": any(disturbed(m) for m in meters[gate]),
        }
    per_round = []
    for r in range(args.rounds):
        on = [t for t in samples if t.round == r and t.gate == "on" and t.error is None]
        off = [t for t in samples if t.round == r and t.gate == "off" and t.error is None]
        per_round.append({
            "round": r + 1,
            "ttft_ratio": ratio(p50(t.ttft_s for t in on), p50(t.ttft_s for t in off)),
            "tpot_ratio": ratio(p50(t.tpot_s for t in on), p50(t.tpot_s for t in off)),
        })  # fmt: skip
    def median_ratio(key: str) -> float | None:
        return p50(r[key] for r in per_round)

    return {
        "sides": sides,
        "ttft_ratio": ratio(sides["on"]["ttft_p50_s"], sides["off"]["ttft_p50_s"]),
        "tpot_ratio": ratio(sides["on"]["tpot_p50_s"], sides["off"]["tpot_p50_s"]),
        "ttft_ratio_median_of_rounds": median_ratio("ttft_ratio"),
        "tpot_ratio_median_of_rounds": median_ratio("tpot_ratio"),
        "per_round": per_round,
        "samples": [asdict(t) for t in samples],
    }


# --------------------------------------------------------------------------------------------
# Report


def run_injection_only(args) -> int:
    """Part a alone: the labelled sets, no engine and no database."""
    from django.conf import settings  # noqa: PLC0415

    result = {"injection": injection_part()}
    summary = report(result, args, settings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "only": "injection",
        "injection": result["injection"], **summary,
    }, indent=1, default=str))
    log(f"results written to {args.out}")
    return 1 if args.strict and not summary["overall_pass"] else 0


def run(args) -> int:
    from django.conf import settings  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    started = time.perf_counter()
    call_command("migrate", verbosity=0)  # the dev database: part c signs a user up in it
    connections.close_all()  # part c reconnects minutes later (a fresh connection then)
    # This bench measures moderation: none of the tier machinery that would get in the way.
    tier_machinery_off(settings)
    settings.CHAT_TEMPERATURE = 0.0  # greedy: each prompt gets the same answer on both sides
    settings.CHAT_MODERATION_INPUT = True

    result: dict = {"injection": injection_part()}
    server = InProcessServer()
    try:
        server.start()
        if args.only == "everyday":
            result["input"], result["output"] = {}, {"skipped": "--only everyday"}
        else:
            result["input"] = server.call(input_part(server.engine, args.checks, args.streams))
            result["output"] = output_part(server, args)
        result["attacks"] = server.call(attack_part())
        result["everyday"] = everyday_part(
            server, max_tokens=args.everyday_max_tokens, concurrency=args.everyday_concurrency,
            limit=args.everyday_limit,
        )  # fmt: skip
    finally:
        server.stop()
    summary = report(result, args, settings)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "moderator": settings.CHAT_MODERATOR,
            "timeout_s": settings.CHAT_MODERATION_TIMEOUT_S,
            "window_chars": settings.CHAT_MODERATION_WINDOW_CHARS,
            "step_chars": settings.CHAT_MODERATION_STEP_CHARS,
            "input_chars": INPUT_CHARS,
            "blocked_terms": BLOCKED_TERMS,
            "checks": args.checks,
            "streams": args.streams,
            "rounds": args.rounds,
            "turns": args.turns,
            "max_tokens": args.max_tokens,
            "model_path": str(settings.CHAT_MODEL_PATH),
            "cpu_count": os.cpu_count(),
            "loadavg_end": os.getloadavg(),
        },
        "total_s": total_s,
        "injection": result["injection"],
        "input": {
            name: {
                **phase.summary(),
                "latencies_ms": [round(x * 1000, 3) for x in phase.latencies_s],
            }
            for name, phase in result["input"].items()
        },
        "output": result["output"],
        "attacks": result["attacks"],
        "everyday": result["everyday"],
        **summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    output = result["output"]
    if "sides" in output and (output["sides"]["on"]["errors"] or output["sides"]["off"]["errors"]):
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.moderation_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--checks", type=int, default=200, help="input checks per row (>= 200)")
    parser.add_argument("--streams", type=int, default=8, help="engine streams under load")
    parser.add_argument("--rounds", type=int, default=8, help="output gate on/off rounds")
    parser.add_argument("--turns", type=int, default=2, help="turns per side per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default var/bench/moderation_bench.json, or "
                             "moderation_injection.json with --only injection)")
    parser.add_argument("--only", choices=("all", "injection", "everyday"), default="all",
                        help="'injection': part a alone (the labelled sets; no engine); "
                             "'everyday': parts a and d (no latency or output-cost parts)")
    parser.add_argument("--everyday-max-tokens", type=int, default=96,
                        help="part d: answer cap per everyday request (the CPU is small)")
    parser.add_argument("--everyday-concurrency", type=int, default=4)
    parser.add_argument("--everyday-limit", type=int, default=None,
                        help="part d: only the first N everyday requests (a quick look)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    if args.out is None:
        name = "moderation_injection.json" if args.only == "injection" else "moderation_bench.json"
        args.out = VAR / "bench" / name
    with contextlib.suppress(KeyboardInterrupt):
        return run_injection_only(args) if args.only == "injection" else run(args)
    return 130


if __name__ == "__main__":
    sys.exit(main())
