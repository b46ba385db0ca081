"""Moderation under a burst (issue 28): many users' messages checked at the same moment.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.moderation_burst [--burst 1 30 120 --rounds 5]

The real local moderator (``settings.CHAT_MODERATOR``) on its worker threads, as a gateway runs
it: ``--burst`` input checks of everyday requests (``bench/data/everyday_requests.jsonl``, 30
different ones per round) started together with ``asyncio.gather`` on one event loop, each
awaited through ``moderation.base.acheck`` with the deployment's timeout. Printed per burst size:
how many checks failed (``moderation_unavailable``: the turn would be refused with a 503) and
the latency from the ``await`` to the verdict, p50 / p99 / max (queueing for a thread included).
Before issue 28's fix, the check timeout counted from submission, so a burst queued past it.
Target: 0 failed (an everyday message is never refused because others arrived with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import django

EVERYDAY = Path(__file__).parent / "data" / "everyday_requests.jsonl"


def _texts(count: int, offset: int) -> list[str]:
    rows = [json.loads(line)["text"] for line in EVERYDAY.read_text().splitlines() if line.strip()]
    return [rows[(offset + i) % len(rows)] for i in range(count)]


async def _burst(texts: list[str]) -> tuple[int, list[float]]:
    from moderation.base import acheck  # noqa: PLC0415
    from moderation.verdicts import policy_for  # noqa: PLC0415

    async def one(text: str) -> tuple[bool, float]:
        started = time.perf_counter()
        verdict = await acheck("input", text, policy_for(None))
        return bool(verdict.error), (time.perf_counter() - started) * 1000

    results = await asyncio.gather(*(one(text) for text in texts))
    return sum(failed for failed, _ in results), [ms for _, ms in results]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(burst_sizes: list[int], rounds: int) -> dict:
    """Each burst size ``rounds`` times; returns and prints failures and latency per size."""
    from moderation.base import moderator_warm  # noqa: PLC0415

    moderator_warm()
    await _burst(_texts(4, 0))  # first passes through each model
    out = {}
    for size in burst_sizes:
        failed, latencies = 0, []
        for r in range(rounds):
            f, ms = await _burst(_texts(size, r * size))
            failed += f
            latencies += ms
        out[size] = {
            "checks": size * rounds, "failed": failed,
            "p50_ms": statistics.median(latencies), "p99_ms": _quantile(latencies, 0.99),
            "max_ms": max(latencies),
        }  # fmt: skip
        row = out[size]
        print(
            f"  burst {size:3d} x {rounds}: failed {failed} of {row['checks']}   "
            f"p50 {row['p50_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms  max {row['max_ms']:.1f} ms   "
            f"{'PASS' if failed == 0 else 'MISS'} (target: 0 failed)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, nargs="+", default=[1, 30, 120])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    django.setup()
    from django.conf import settings  # noqa: PLC0415

    print(f"Moderation burst: {settings.CHAT_MODERATOR}, {settings.CHAT_MODERATION_THREADS} "
          f"threads, timeout {settings.CHAT_MODERATION_TIMEOUT_S:g} s")  # fmt: skip
    asyncio.run(run(args.burst, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
