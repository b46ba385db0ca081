"""Paid TTFT while free-tier traffic saturates the engine: first come, first served vs priority
scheduling with reserved slots, then load shedding (issue 5, "Pools and routing" and "Load
shedding").

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.priority_bench [--paid 40] [--topology prod]

(``--topology prod``: the same comparison in the production topology, bench/priority_prod.py.)

One real vLLM engine (:class:`inference.engine.VllmEngine`, the shipped model, the product's
engine arguments, ``max_num_seqs`` 16) serves the default pools in this process. Every request
goes the product's way: a real :class:`inference.router.Route` from ``router.route`` (free
users -> ``mini``, paid users -> ``frontier``), then ``inference.serving.pool_generate`` (the
admission queue, the engine priority, the metrics).

- **Free load**: N free-tier clients, each looping requests back to back (the product's system
  prompt + a prompt from bench/chat_bench.py's list, temperature 0.7, max_tokens drawn from
  32..128), so the 16 slots stay full and a queue forms.
- **Paid probes**: one paid request every 0.5-1.0 s (uniform), ``--paid`` of them per phase,
  each a ``--paid-max-tokens`` answer; TTFT = call -> first token with text (queue wait
  included), measured as core.metrics' ``chat_ttft_seconds`` measures it.

Phases, one engine, one run (the baseline is measured in the same run):

- **A** ``CHAT_SCHEDULING = "fcfs"``: every user turn at one priority, no reserved slots
  (the baseline); 32 free clients.
- **B** ``CHAT_SCHEDULING = "priority"``: paid first (pool priority 0 vs 1) and
  ``CHAT_RESERVED_SLOTS`` slots that free turns may never take; 32 free clients.
- **C** priority + load shedding: 64 free clients, each request passed through
  ``router.shed`` on the admission queue's depth (thresholds from settings:
  ``CHAT_SHED_FREE_WAITING``, ``CHAT_DEGRADE_PAID_WAITING``); a shed free request is a 503
  ``busy``, counted, and retried after 0.2-0.5 s (ignoring Retry-After, to keep the pressure on:
  the worst case).

Targets (issue 5): paid TTFT p99 in B <= 0.5x A, and <= 0.8 s (the design brief's paid target).
Phase C shows paid TTFT holding while free traffic is shed. Results: a table on stdout and
``var/bench/priority_bench.json``. Each phase records the CPU used by other processes (the
machine is small and shared); a disturbed phase is flagged. Exit status 0 when the run
completed (``--strict``: 1 on a missed target), 2 when requests failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.harness import PROMPTS, CpuMeter, disturbed, log, ms, percentile, ratio

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

MAX_NUM_SEQS = 16
FREE_MAX_TOKENS = (32, 128)
PAID_EVERY_S = (0.5, 1.0)
RATIO_TARGET = 0.5  # paid TTFT p99, priority / fcfs
PAID_P99_TARGET_S = 0.8


@dataclass
class PaidSample:
    ttft_s: float | None
    pool: str
    reason: str
    waiting_at_arrival: int
    completion_tokens: int
    error: str | None = None


@dataclass
class Phase:
    name: str
    mode: str
    free_clients: int
    shedding: bool
    wall_s: float = 0.0
    paid: list[PaidSample] = field(default_factory=list)
    free_ttfts: list[float] = field(default_factory=list)
    free_done: int = 0
    free_errors: int = 0
    free_shed: int = 0
    free_completion_tokens: int = 0
    queue_samples: list[tuple[int, int]] = field(default_factory=list)  # (waiting, running)
    shed_metric: float = 0.0  # chat_shed_total{tier=free,action=shed} during the phase
    cpu: dict = field(default_factory=dict)

    def summary(self) -> dict:
        ttfts = [p.ttft_s for p in self.paid if p.ttft_s is not None]
        free_wall = max(self.wall_s, 1e-9)
        return {
            "phase": self.name,
            "mode": self.mode,
            "free_clients": self.free_clients,
            "shedding": self.shedding,
            "paid_n": len(ttfts),
            "paid_errors": sum(1 for p in self.paid if p.error),
            "paid_ttft_p50_s": percentile(ttfts, 50, default=None),
            "paid_ttft_p99_s": percentile(ttfts, 99, default=None),
            "paid_ttft_max_s": max(ttfts) if ttfts else None,
            "paid_degraded": sum(1 for p in self.paid if p.reason == "degraded"),
            "free_ttft_p50_s": percentile(self.free_ttfts, 50, default=None),
            "free_done": self.free_done,
            "free_errors": self.free_errors,
            "free_shed": self.free_shed,
            "free_shed_per_s": self.free_shed / free_wall,
            "shed_metric": self.shed_metric,
            "free_tokens_per_s": self.free_completion_tokens / free_wall,
            "waiting_mean": (
                statistics.mean(w for w, _ in self.queue_samples) if self.queue_samples else None
            ),
            "running_mean": (
                statistics.mean(r for _, r in self.queue_samples) if self.queue_samples else None
            ),
            "wall_s": self.wall_s,
            "other_cpu_s": self.cpu.get("other_cpu_s"),
            "disturbed": disturbed(self.cpu, self.wall_s),
        }


class Bench:
    def __init__(self, args):
        from django.conf import settings  # noqa: PLC0415

        from inference.pools import pool_set  # noqa: PLC0415
        from inference.router import RouteRequest, route  # noqa: PLC0415

        self.args = args
        self.settings = settings
        self.pools = pool_set()

        def route_for(user_id: int, tier: str):
            return route(
                RouteRequest(user_id=user_id, tier=tier, requested=None),
                pools=self.pools, canaries=[], experiments=[],
            )  # fmt: skip

        self.free_route = route_for(1, "free")
        self.paid_route = route_for(2, "paid")
        self.engine = None
        self.prompts: list[list[int]] = []

    async def start(self) -> None:
        import inference.engine as engine_module  # noqa: PLC0415

        settings = self.settings
        settings.CHAT_MAX_NUM_SEQS = MAX_NUM_SEQS
        self.engine = engine_module.VllmEngine(
            model_path=str(settings.CHAT_MODEL_PATH),
            max_model_len=settings.CHAT_MAX_MODEL_LEN,
            kv_cache_bytes=settings.CHAT_KV_CACHE_BYTES,
            max_num_seqs=MAX_NUM_SEQS,
        )
        # The process's engine: the default local pools (mini, frontier) are served by it
        # (inference.pools.pool_engine -> get_engine()).
        engine_module._engine = self.engine
        log(f"starting the vLLM engine (max_num_seqs {MAX_NUM_SEQS})")
        t = time.perf_counter()
        await self.engine.ensure_started()
        log(f"engine ready in {time.perf_counter() - t:.1f} s")
        system = settings.CHAT_SYSTEM_PROMPT
        self.prompts = [
            self.engine.encode_chat(
                [{"role": "system", "content": system}, {"role": "user", "content": p}]
            )
            for p in PROMPTS
        ]

    def admission(self):
        from inference.admission import admission_for  # noqa: PLC0415

        return admission_for(self.engine)

    async def warm_up(self) -> None:
        """One saturating batch (the first full batch after start is slow) before phase A."""
        from inference.engine import GenerationOptions  # noqa: PLC0415
        from inference.serving import pool_generate  # noqa: PLC0415

        async def one(i: int):
            async for _ in pool_generate(
                self.free_route, self.prompts[i % len(self.prompts)],
                GenerationOptions(max_tokens=16, temperature=0.7), f"warm-{i}", tier="free",
            ):  # fmt: skip
                pass

        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(MAX_NUM_SEQS)))
        log(f"warm-up batch of {MAX_NUM_SEQS} in {time.perf_counter() - t:.1f} s")

    async def free_client(self, phase: Phase, i: int) -> None:
        from inference.engine import GenerationOptions  # noqa: PLC0415
        from inference.router import Overloaded, shed  # noqa: PLC0415
        from inference.serving import pool_generate, pool_waiting  # noqa: PLC0415

        rng = random.Random(1000 * i + len(phase.name))
        n = 0
        while True:
            n += 1
            route = self.free_route
            if phase.shedding:
                try:
                    waiting = await pool_waiting(route.pool)
                    route = shed(route, tier="free", waiting=waiting, pools=self.pools)
                except Overloaded:
                    phase.free_shed += 1
                    await asyncio.sleep(rng.uniform(0.2, 0.5))
                    continue
            options = GenerationOptions(max_tokens=rng.randint(*FREE_MAX_TOKENS), temperature=0.7)
            started = time.perf_counter()
            first = None
            last = None
            try:
                async for delta in pool_generate(
                    route, self.prompts[(i + n) % len(self.prompts)], options,
                    f"{phase.name}-free{i}-{n}", tier="free",
                ):  # fmt: skip
                    if delta.text and first is None:
                        first = time.perf_counter()
                        phase.free_ttfts.append(first - started)
                    last = delta
            except asyncio.CancelledError:
                if last is not None:
                    phase.free_completion_tokens += last.completion_tokens
                raise
            except Exception as exc:  # noqa: BLE001 - counted and shown
                phase.free_errors += 1
                log(f"free request failed: {exc!r}")
                await asyncio.sleep(0.5)
                continue
            phase.free_done += 1
            if last is not None:
                phase.free_completion_tokens += last.completion_tokens

    async def paid_request(self, phase: Phase, k: int) -> PaidSample:
        from inference.engine import GenerationOptions  # noqa: PLC0415
        from inference.router import shed  # noqa: PLC0415
        from inference.serving import pool_generate, pool_waiting  # noqa: PLC0415

        started = time.perf_counter()
        route = self.paid_route
        waiting = await pool_waiting(route.pool)
        if phase.shedding:
            route = shed(route, tier="paid", waiting=waiting, pools=self.pools)
        first = None
        completion = 0
        options = GenerationOptions(max_tokens=self.args.paid_max_tokens, temperature=0.7)
        try:
            async for delta in pool_generate(
                route, self.prompts[k % len(self.prompts)], options, f"{phase.name}-paid{k}",
                tier="paid",
            ):  # fmt: skip
                if delta.text and first is None:
                    first = time.perf_counter()
                completion = delta.completion_tokens
        except Exception as exc:  # noqa: BLE001 - counted and shown
            return PaidSample(None, route.pool.name, route.reason, waiting, completion, repr(exc))
        ttft = None if first is None else first - started
        return PaidSample(ttft, route.pool.name, route.reason, waiting, completion)

    async def sample_queue(self, phase: Phase) -> None:
        admission = self.admission()
        while True:
            phase.queue_samples.append((admission.waiting(), admission.running()))
            await asyncio.sleep(0.25)

    async def run_phase(self, phase: Phase) -> None:
        from core import metrics  # noqa: PLC0415

        self.settings.CHAT_SCHEDULING = phase.mode
        admission = self.admission()
        log(
            f"phase {phase.name}: {phase.mode}, {phase.free_clients} free clients"
            + (", load shedding" if phase.shedding else "")
        )
        loop = asyncio.get_running_loop()
        free = [loop.create_task(self.free_client(phase, i)) for i in range(phase.free_clients)]
        # Let the free load fill every slot it may take and queue up before the first probe.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            admission.running() >= admission.slots - admission.reserved() and admission.waiting() > 0
        ):
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)
        shed_before = metrics.value("chat_shed_total", tier="free", action="shed")
        # Free-side numbers count from here (the measured window), like the paid probes.
        phase.free_ttfts.clear()
        phase.free_done = phase.free_shed = phase.free_completion_tokens = 0
        meter = CpuMeter()
        meter.start()
        sampler = loop.create_task(self.sample_queue(phase))
        started = time.perf_counter()
        rng = random.Random(len(phase.name))
        paid = []
        for k in range(self.args.paid):
            paid.append(loop.create_task(self.paid_request(phase, k)))
            await asyncio.sleep(rng.uniform(*PAID_EVERY_S))
        phase.paid = list(await asyncio.gather(*paid))
        phase.wall_s = time.perf_counter() - started
        phase.cpu = meter.stop()
        shed_after = metrics.value("chat_shed_total", tier="free", action="shed")
        phase.shed_metric = shed_after - shed_before
        window_tokens, window_done = phase.free_completion_tokens, phase.free_done
        sampler.cancel()
        for task in free:
            task.cancel()
        await asyncio.gather(sampler, *free, return_exceptions=True)
        phase.free_completion_tokens, phase.free_done = window_tokens, window_done
        # Cancelled requests are aborted in the engine; wait until it holds none.
        deadline = time.monotonic() + 30
        while self.engine.num_unfinished_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        s = phase.summary()
        log(
            f"phase {phase.name}: paid TTFT p50 {ms(s['paid_ttft_p50_s'], 0)} ms, "
            f"p99 {ms(s['paid_ttft_p99_s'], 0)} ms (n={s['paid_n']}); free TTFT p50 "
            f"{ms(s['free_ttft_p50_s'], 0)} ms, {s['free_tokens_per_s']:.0f} free tok/s, "
            f"mean waiting {s['waiting_mean'] or 0:.1f}"
            + (f", {phase.free_shed} free requests shed" if phase.shedding else "")
        )


def report(phases: dict[str, Phase], args, settings) -> dict:
    s = {name: phase.summary() for name, phase in phases.items()}
    a, b, c = s["A"], s["B"], s["C"]
    print()
    print(
        f"Paid TTFT under free-tier saturation: one engine (max_num_seqs {MAX_NUM_SEQS}, "
        f"{settings.CHAT_RESERVED_SLOTS} reserved slots in priority mode), same run; paid: one "
        f"request every {PAID_EVERY_S[0]}-{PAID_EVERY_S[1]} s, {args.paid_max_tokens}-token "
        f"answers; free: max_tokens {FREE_MAX_TOKENS[0]}-{FREE_MAX_TOKENS[1]}, temperature 0.7"
    )
    header = (
        f"{'phase':<34} | {'paid n':>6} | {'paid TTFT p50 / p99 ms':>22} | "
        f"{'vs A p50 / p99':>15} | {'free TTFT p50':>13} | {'free tok/s':>10} | "
        f"{'waiting':>7} | {'shed 503s':>9}"
    )
    print()
    print(header)
    print("-" * len(header))
    labels = {
        "A": f"A fcfs, {a['free_clients']} free (baseline)",
        "B": f"B priority, {b['free_clients']} free",
        "C": f"C priority + shedding, {c['free_clients']} free",
    }
    for name, row in s.items():
        r50 = ratio(row["paid_ttft_p50_s"], a["paid_ttft_p50_s"])
        r99 = ratio(row["paid_ttft_p99_s"], a["paid_ttft_p99_s"])
        vs = "1 / 1" if name == "A" else f"{r50:.2f}x / {r99:.2f}x" if r50 and r99 else "-"
        print(
            f"{labels[name]:<34} | {row['paid_n']:>6} | "
            f"{ms(row['paid_ttft_p50_s'], 0) + ' / ' + ms(row['paid_ttft_p99_s'], 0):>22} | "
            f"{vs:>15} | "
            f"{ms(row['free_ttft_p50_s'], 0) + ' ms':>13} | {row['free_tokens_per_s']:>10.0f} | "
            f"{row['waiting_mean']:>7.1f} | {row['free_shed'] if row['shedding'] else '-':>9}"
        )
    print()
    checks = []
    b_over_a = ratio(b["paid_ttft_p99_s"], a["paid_ttft_p99_s"])
    checks.append({
        "target": f"paid TTFT p99, priority / fcfs <= {RATIO_TARGET}",
        "value": b_over_a, "shown": "-" if b_over_a is None else f"{b_over_a:.3f}x",
        "pass": b_over_a is not None and b_over_a <= RATIO_TARGET,
    })  # fmt: skip
    for row, what in ((b, "priority"), (c, "priority + shedding, 64 free")):
        p99 = row["paid_ttft_p99_s"]
        checks.append({
            "target": f"paid TTFT p99 <= {PAID_P99_TARGET_S} s ({what})",
            "value": p99, "shown": f"{ms(p99, 0)} ms",
            "pass": p99 is not None and p99 <= PAID_P99_TARGET_S,
        })  # fmt: skip
    checks.append({
        "target": "free traffic is shed in phase C (503 busy)",
        "value": c["free_shed"], "shown": f"{c['free_shed']} shed, {c['free_shed_per_s']:.1f}/s",
        "pass": c["free_shed"] > 0,
    })  # fmt: skip
    errors = sum(row["paid_errors"] + row["free_errors"] for row in s.values())
    if errors:
        checks.append({
            "target": "no failed requests", "value": errors, "shown": f"{errors} failed",
            "pass": False,
        })  # fmt: skip
    for check in checks:
        print(f"  {'PASS' if check['pass'] else 'MISS'}  {check['target']}  ({check['shown']})")
    all_ok = all(check["pass"] for check in checks)
    print(f"\n  overall: {'PASS' if all_ok else 'MISS'}\n")
    print(
        f"  phase C: {c['free_shed']} free requests shed (chat_shed_total{{tier=free,action=shed}} "
        f"+{c['shed_metric']:.0f}), {c['free_done']} free answered, {c['paid_degraded']} paid "
        f"degraded to mini; paid TTFT p50 {ms(c['paid_ttft_p50_s'], 0)} ms vs "
        f"{ms(b['paid_ttft_p50_s'], 0)} ms in B with half the free clients"
    )
    print(
        "  mean slots busy (A / B / C): "
        + " / ".join(f"{row['running_mean']:.1f}" for row in s.values())
        + f" of {MAX_NUM_SEQS}; paid TTFT max (A / B / C): "
        + " / ".join(f"{ms(row['paid_ttft_max_s'], 0)} ms" for row in s.values())
    )
    disturbed = [
        f"{name} ({row['other_cpu_s']:.1f} CPU-s)" for name, row in s.items() if row["disturbed"]
    ]
    print(
        "  phases with background load from other processes (>5% of the machine): "
        + (", ".join(disturbed) if disturbed else "none")
    )
    print()
    return {"phases": s, "checks": checks, "overall_pass": all_ok, "errors": errors}


async def amain(args) -> int:
    import inference.engine as engine_module  # noqa: PLC0415

    started = time.perf_counter()
    bench = Bench(args)
    settings = bench.settings
    log(
        f"routes: free -> {bench.free_route.pool.key} (priority {bench.free_route.priority}), "
        f"paid -> {bench.paid_route.pool.key} (priority {bench.paid_route.priority})"
    )
    phases = {
        "A": Phase("A", "fcfs", args.free, shedding=False),
        "B": Phase("B", "priority", args.free, shedding=False),
        "C": Phase("C", "priority", args.shed_free, shedding=True),
    }
    await bench.start()
    try:
        await bench.warm_up()
        for phase in phases.values():
            await bench.run_phase(phase)
    finally:
        bench.engine.shutdown()
        engine_module._engine = None
    summary = report(phases, args, settings)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "max_num_seqs": MAX_NUM_SEQS,
            "reserved_slots": settings.CHAT_RESERVED_SLOTS,
            "shed_free_waiting": settings.CHAT_SHED_FREE_WAITING,
            "degrade_paid_waiting": settings.CHAT_DEGRADE_PAID_WAITING,
            "paid": args.paid,
            "paid_every_s": PAID_EVERY_S,
            "paid_max_tokens": args.paid_max_tokens,
            "free_max_tokens": FREE_MAX_TOKENS,
            "model_path": str(settings.CHAT_MODEL_PATH),
            "cpu_count": os.cpu_count(),
            "loadavg_end": os.getloadavg(),
        },
        "total_s": total_s,
        **summary,
        "paid_samples": {name: [asdict(p) for p in phase.paid] for name, phase in phases.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    if summary["errors"]:
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.priority_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--paid", type=int, default=40, help="paid probes per phase (default 40)")
    parser.add_argument("--paid-max-tokens", type=int, default=32)
    parser.add_argument("--free", type=int, default=32, help="free clients in phases A, B")
    parser.add_argument("--shed-free", type=int, default=64, help="free clients in phase C")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--topology", choices=("one", "prod"), default="one",
        help="one: one process, the engine in it (phases A-C); prod: the production topology, "
        "engine process + 2 gateways + nginx (phases A, B; bench/priority_prod.py)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "priority_bench.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    if args.topology == "prod":
        from bench import priority_prod  # noqa: PLC0415

        return priority_prod.run(args)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
