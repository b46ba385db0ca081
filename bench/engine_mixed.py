"""bench/engine_bench.py's **mixed** part: the seeded 16-user workload with tiers (issue 19),
played twice in one run, with the adaptive admission cap (inference/limiter.py) and without it.

- **Users**: the concurrent part's workload (:func:`bench.engine_workload.workload`, same
  seed); ``--mixed-paid`` (4) of its ``--users`` (16) are paid, picked by a seeded draw
  (:func:`tier_mix`), the rest free. Each user is a bench user of its own with an API key
  (``enginebench-mixed-``), so rate limits apply per user as configured.
- **Settings**: the rate limits, reserved slots and load shedding of this process's
  configuration (the bench's other parts switch them off; this part puts them back), then
  ``CHAT_ADMISSION_ADAPTIVE`` on (the **adaptive** phase, the cap reset to fully open first)
  and off (the **uncapped** phase: the cap is the engine's slots). Each phase tags its messages
  (``[adaptive]`` / ``[uncapped]``) so neither finds the other's prompts in the prefix cache.
- **Measures** per phase (:func:`mixed_summary`): ``admitted_tpot_p99_ms`` (per-stream TPOT,
  as ``chat_tpot_seconds`` measures it, of the turns that were admitted), ``paid_ttft_p99_ms``,
  ``free_ttft_p99_ms`` (admitted free turns), ``shed`` (turns refused with 503 busy),
  ``tokens_per_s`` (completion tokens / the phase's span), ``cap_min`` / ``cap_final`` (the
  engine's ``chat_admission_limit``, polled every 0.1 s).
- **Targets** (:func:`mixed_checks`): admitted TPOT p99 <= 80 ms where the same run's
  single-stream TPOT p50 <= 40 ms (otherwise the cap reached is printed and it is a MISS: the
  engine cannot meet it at any width); paid TTFT p99 <= max(0.8 s, 1.25 x single-stream TTFT
  p50); free TTFT p99 <= max(2 s, 1.25 x the same); adaptive / uncapped tokens/s >= 0.8.
"""

from __future__ import annotations

import asyncio
import copy
import random
from dataclasses import asdict, replace

from bench.clients import Api, AsyncApi
from bench.engine_runs import Sample, run_turns
from bench.engine_workload import UserPlan
from bench.harness import CpuMeter, disturbed, log, percentile, wait_for_quiet

ADMITTED_TPOT_TARGET_S = 0.080
SINGLE_TPOT_CONDITION_S = 0.040  # the TPOT target applies where one stream alone is this fast
PAID_TTFT_TARGET_S = 0.8
FREE_TTFT_TARGET_S = 2.0
SINGLE_TTFT_FACTOR = 1.25
THROUGHPUT_RATIO_TARGET = 0.8
SHED_MARK = "POST turns -> 503"  # how bench.clients.AsyncApi reports a load-shed turn
PHASES = (("adaptive", True), ("uncapped", False))


def tier_mix(seed: int, users: int, paid: int) -> dict[int, str]:
    """User index -> ``"paid"`` | ``"free"``: ``paid`` of ``users`` drawn by ``random.Random
    (seed)`` (deterministic). Raises ValueError unless 0 <= paid <= users."""
    if not 0 <= paid <= users:
        raise ValueError(f"mixed: {paid} paid users of {users} is not a mix")
    chosen = set(random.Random(seed).sample(range(users), paid))
    return {u: "paid" if u in chosen else "free" for u in range(users)}


def tagged(plans: list[UserPlan], tag: str) -> list[UserPlan]:
    """``plans`` with every message prefixed ``[tag] `` (another phase's prompts then share only
    the system prompt with these in the prefix cache)."""
    return [
        replace(p, turns=tuple(replace(t, content=f"[{tag}] {t.content}") for t in p.turns))
        for p in plans
    ]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def mixed_summary(samples: list[Sample], tiers: dict[int, str], wall_s: float) -> dict:
    """One phase's numbers from its samples (``tiers``: user -> tier): turns, ``shed`` (503
    busy), ``errors`` (other failures), ``admitted_tpot_p99_ms`` / ``_p50_ms`` over admitted
    streams' TPOT, ``paid_ttft_p99_ms``, ``free_ttft_p99_ms`` (admitted free turns),
    ``tokens_per_s`` (completion tokens / ``wall_s``); None where nothing was measured."""
    shed = [s for s in samples if s.error and SHED_MARK in s.error]
    failed = [s for s in samples if s.error and SHED_MARK not in s.error]
    admitted = [s for s in samples if s.error is None]
    tpots = [s.tpot_s for s in admitted if s.tpot_s is not None]

    def ttfts(tier: str) -> list[float]:
        return [s.ttft_s for s in admitted if tiers.get(s.user) == tier and s.ttft_s is not None]

    tokens = sum(s.completion_tokens for s in admitted)
    return {
        "turns": len(samples),
        "admitted": len(admitted),
        "shed": len(shed),
        "shed_by_tier": {t: sum(1 for s in shed if tiers.get(s.user) == t) for t in ("paid", "free")},
        "errors": len(failed),
        "first_error": failed[0].error if failed else None,
        "admitted_tpot_p50_ms": _ms(percentile(tpots, 50, default=None)),
        "admitted_tpot_p99_ms": _ms(percentile(tpots, 99, default=None)),
        "paid_ttft_p99_ms": _ms(percentile(ttfts("paid"), 99, default=None)),
        "free_ttft_p99_ms": _ms(percentile(ttfts("free"), 99, default=None)),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
    }


def mixed_checks(phases: dict[str, dict], single: dict | None) -> list[dict]:
    """PASS/MISS rows ``{"target", "shown", "pass"}`` for the adaptive phase against the targets
    (module docstring); ``single``: the same run's single-stream summary (``ttft_p50_s``,
    ``tpot_p50_s``), None when it was not measured (the relative bounds then fall back to the
    absolute ones and the TPOT target counts as applicable)."""
    on, off = phases["adaptive"], phases["uncapped"]
    single = single or {}
    single_ttft = single.get("ttft_p50_s") or 0.0
    single_tpot = single.get("tpot_p50_s")
    rows: list[dict] = []

    def row(target: str, shown: str, ok: bool) -> None:
        rows.append({"target": target, "shown": shown, "pass": bool(ok)})

    tpot = on["admitted_tpot_p99_ms"]
    if single_tpot is None or single_tpot <= SINGLE_TPOT_CONDITION_S:
        row("mixed: admitted TPOT p99 <= 80 ms", f"{tpot} ms, cap {on['cap_min']}..{on['cap_final']}",
            tpot is not None and tpot <= ADMITTED_TPOT_TARGET_S * 1000)  # fmt: skip
    else:
        row("mixed: admitted TPOT p99 <= 80 ms (single-stream TPOT p50 "
            f"{single_tpot * 1000:.1f} ms > 40 ms: not reachable)",
            f"{tpot} ms; cap reached {on['cap_min']}, final {on['cap_final']}", False)  # fmt: skip
    for tier, floor_s in (("paid", PAID_TTFT_TARGET_S), ("free", FREE_TTFT_TARGET_S)):
        bound_s = max(floor_s, SINGLE_TTFT_FACTOR * single_ttft)
        value = on[f"{tier}_ttft_p99_ms"]
        row(f"mixed: {tier} TTFT p99 <= {bound_s * 1000:.0f} ms (max({floor_s:g} s, "
            f"{SINGLE_TTFT_FACTOR} x single TTFT))", f"{value} ms",
            value is not None and value <= bound_s * 1000)  # fmt: skip
    ratio = (on["tokens_per_s"] or 0) / off["tokens_per_s"] if off["tokens_per_s"] else None
    row(f"mixed: tokens/s adaptive / uncapped >= {THROUGHPUT_RATIO_TARGET}",
        "-" if ratio is None else f"{ratio:.2f}x ({on['tokens_per_s'] or 0:.1f} / "
        f"{off['tokens_per_s']:.1f})",
        ratio is not None and ratio >= THROUGHPUT_RATIO_TARGET)  # fmt: skip
    return rows


class MixedClient:
    """One :class:`AsyncApi` per workload user, each a bench user of that user's tier;
    bench/engine_runs.py ``run_turns`` plays each plan on ``for_user(plan.user)``."""

    name = "full stack, mixed tiers"

    def __init__(self, url: str, tiers: dict[int, str]) -> None:
        self.apis: dict[int, Api] = {}
        self.clients: dict[int, AsyncApi] = {}
        for user, tier in tiers.items():
            api = Api(url, prefix="enginebench-mixed", key_name="engine bench mixed",
                      clear_leftovers=False)  # fmt: skip
            api.user.tier = tier
            api.user.save(update_fields=["tier"])
            self.apis[user] = api
            self.clients[user] = AsyncApi(url, api)

    def for_user(self, user: int) -> AsyncApi:
        return self.clients[user]

    async def open(self) -> None:
        for client in self.clients.values():
            await client.open()

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()

    def delete(self) -> None:
        for api in self.apis.values():
            api.close()


def mixed_part(server, plans: list[UserPlan], tiers: dict[int, str], configured: dict,
               wait_load, wait_max_s) -> dict:  # fmt: skip
    """Both phases on ``server`` (bench.harness.InProcessServer) -> ``{"tiers", "adaptive",
    "uncapped"}``, each a :func:`mixed_summary` with ``cap_min`` / ``cap_final``, the CPU other
    processes used and the raw samples. ``configured``: the settings to restore for this part
    (name -> value, as this process was configured before the bench switched them off); they
    are switched back off afterwards."""
    from django.conf import settings  # noqa: PLC0415

    from inference.admission import admission_for  # noqa: PLC0415

    admission = admission_for(server.engine)
    switched_off = {name: getattr(settings, name) for name in configured}
    for name, value in configured.items():
        setattr(settings, name, copy.deepcopy(value))
    client = MixedClient(server.url, tiers)
    out: dict = {"tiers": {str(u): t for u, t in tiers.items()}}
    try:
        for phase, adaptive in PHASES:
            settings.CHAT_ADMISSION_ADAPTIVE = adaptive
            server.call(_run(admission.reset_cap))
            load = wait_for_quiet(wait_load, wait_max_s)
            meter = CpuMeter()
            meter.start()
            samples, wall, caps = asyncio.run(_played(client, tagged(plans, phase), phase, admission))
            cpu = meter.stop()
            summary = mixed_summary(samples, tiers, wall)
            summary.update(cap_min=min(caps), cap_final=caps[-1], slots=admission.slots,
                           loadavg_1m_before=load, cpu=cpu, disturbed=disturbed(cpu),
                           samples=[asdict(s) for s in samples])  # fmt: skip
            out[phase] = summary
            log(f"mixed, {phase}: {summary['admitted']}/{summary['turns']} admitted, "
                f"{summary['shed']} shed, {summary['tokens_per_s'] or 0:.1f} tok/s, TPOT p99 "
                f"{summary['admitted_tpot_p99_ms']} ms, TTFT p99 paid "
                f"{summary['paid_ttft_p99_ms']} / free {summary['free_ttft_p99_ms']} ms, cap "
                f"{summary['cap_min']}..{summary['cap_final']} of {admission.slots}"
                + ("  (disturbed)" if summary["disturbed"] else ""))  # fmt: skip
    finally:
        for name, value in switched_off.items():
            setattr(settings, name, value)
        client.delete()
    return out


async def _run(action) -> None:
    action()


async def _played(client, plans, phase, admission) -> tuple[list[Sample], float, list[int]]:
    """The workload played while the admission cap is polled every 0.1 s."""
    caps = [admission.limit()]
    task = asyncio.create_task(run_turns(client, plans, f"mixed-{phase}"))
    while not task.done():
        await asyncio.sleep(0.1)
        caps.append(admission.limit())
    samples, wall = await task
    return samples, wall, caps


def mixed_report(mixed: dict) -> list[dict]:
    """Print the mixed part's table; -> its PASS/MISS rows (:func:`mixed_checks`)."""
    print("\ng. Mixed tiers: the concurrent workload, 4 paid / 12 free users (seeded), rate limits "
          "and shedding as configured, adaptive cap vs uncapped")  # fmt: skip
    header = (f"   {'phase':<9} | {'tok/s':>7} | {'admitted':>8} | {'shed':>4} | "
              f"{'TPOT p99 ms':>11} | {'paid TTFT p99':>13} | {'free TTFT p99':>13} | {'cap':>7}")
    print(header)
    print("   " + "-" * (len(header) - 3))
    for phase, _ in PHASES:
        s = mixed[phase]
        print(f"   {phase:<9} | {s['tokens_per_s'] or 0:>7.1f} | {s['admitted']:>8} | "
              f"{s['shed']:>4} | {s['admitted_tpot_p99_ms'] or 0:>11.1f} | "
              f"{s['paid_ttft_p99_ms'] or 0:>13.1f} | {s['free_ttft_p99_ms'] or 0:>13.1f} | "
              f"{s['cap_min']:>3}..{s['cap_final']:<3}"
              + ("  (disturbed)" if s["disturbed"] else ""))  # fmt: skip
    return mixed_checks(mixed, mixed.get("single"))
