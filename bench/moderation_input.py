"""bench/moderation_bench.py's part b: the input gate's latency, engine idle vs busy.

``moderation.base.acheck("input", ...)`` on a 4,000-character harmless message (shuffled
differently each call, checked against a policy with 100 blocked terms), sequential calls
(0-10 ms apart) awaited on the server's event loop, first with the engine idle, then while
generations stream from the same engine (each restarts when it ends). Latency is what a turn
waits: from the ``await`` to the verdict (thread hand-off included).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from bench.harness import PROMPTS, SENTENCES, CpuMeter, disturbed, log, ms, percentile

INPUT_CHARS = 4000
BLOCKED_TERMS = 100
LOAD_MAX_TOKENS = 512


@dataclass
class CheckPhase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    streams_seen: list[int] = field(default_factory=list)
    flagged: int = 0
    failed: int = 0
    engine_tokens: int = 0
    wall_s: float = 0.0
    cpu: dict = field(default_factory=dict)

    def summary(self) -> dict:
        lat = self.latencies_s
        return {
            "phase": self.name,
            "checks": len(lat),
            "p50_s": percentile(lat, 50, default=None),
            "p99_s": percentile(lat, 99, default=None),
            "max_s": max(lat) if lat else None,
            "streams_min": min(self.streams_seen) if self.streams_seen else None,
            "streams_mean": (sum(self.streams_seen) / len(self.streams_seen))
            if self.streams_seen else None,
            "flagged": self.flagged,
            "failed": self.failed,
            "engine_tokens_per_s": self.engine_tokens / self.wall_s if self.wall_s else 0.0,
            "wall_s": self.wall_s,
            "other_cpu_s": self.cpu.get("other_cpu_s"),
            "disturbed": disturbed(self.cpu),
        }


def long_message(i: int) -> str:
    """A harmless message of exactly INPUT_CHARS characters, different for each ``i``."""
    rng = random.Random(i)
    parts: list[str] = []
    size = 0
    while size < INPUT_CHARS:
        sentence = rng.choice(SENTENCES)
        parts.append(sentence)
        size += len(sentence) + 1
    return " ".join(parts)[:INPUT_CHARS]


def bench_policy():
    """The deployment's thresholds and actions and 100 blocked terms (a large organisation
    list)."""
    from moderation.verdicts import Policy, policy_for  # noqa: PLC0415

    base = policy_for(None)
    terms = tuple(f"codename orchid {i}" for i in range(BLOCKED_TERMS))
    return Policy(thresholds=dict(base.thresholds), blocked_terms=terms,
                  actions={c: dict(a) for c, a in base.actions.items()})


async def time_checks(engine, phase: CheckPhase, checks: int, policy, offset: int) -> None:
    from moderation.base import acheck  # noqa: PLC0415

    rng = random.Random(offset)
    meter = CpuMeter()
    meter.start()
    started = time.perf_counter()
    for i in range(checks):
        text = long_message(offset + i)
        phase.streams_seen.append(engine.num_unfinished_requests())
        t0 = time.perf_counter()
        verdict = await acheck("input", text, policy)
        phase.latencies_s.append(time.perf_counter() - t0)
        if verdict.error:
            phase.failed += 1
        elif verdict.flagged:
            phase.flagged += 1
        await asyncio.sleep(rng.uniform(0, 0.01))
    phase.wall_s = time.perf_counter() - started
    phase.cpu = meter.stop()


async def load_stream(engine, i: int, counter: dict, ids: list[int]) -> None:
    """One generation after another until cancelled (the engine aborts a cancelled one)."""
    from inference.engine import GenerationOptions  # noqa: PLC0415

    n = 0
    while True:
        n += 1
        options = GenerationOptions(max_tokens=LOAD_MAX_TOKENS, temperature=0.8)
        async for delta in engine.generate(ids, options, f"modbench-load-{i}-{n}"):
            if delta.text:
                counter["tokens"] += 1
                counter["first"] = True


async def input_part(engine, checks: int, streams: int) -> dict[str, CheckPhase]:
    from django.conf import settings  # noqa: PLC0415

    from moderation.base import acheck, moderator_warm  # noqa: PLC0415

    policy = bench_policy()
    await asyncio.get_running_loop().run_in_executor(None, moderator_warm)
    for i in range(20):  # warm the worker threads and the classifiers' caches
        await acheck("input", long_message(10_000 + i), policy)

    idle = CheckPhase("idle")
    log(f"input gate: {checks} checks, engine idle")
    await time_checks(engine, idle, checks, policy, offset=0)

    loaded = CheckPhase(f"{streams} streams")
    counter = {"tokens": 0, "first": False}
    prompts = [
        engine.encode_chat([
            {"role": "system", "content": settings.CHAT_SYSTEM_PROMPT},
            {"role": "user", "content": PROMPTS[i % len(PROMPTS)]},
        ])
        for i in range(streams)
    ]  # fmt: skip
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(load_stream(engine, i, counter, prompts[i])) for i in range(streams)]
    try:
        deadline = time.monotonic() + 120
        while not (counter["first"] and engine.num_unfinished_requests() >= streams):
            if time.monotonic() > deadline:
                raise RuntimeError("the load streams did not start within 120 s")
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # past the first prefills: steady decoding
        log(f"input gate: {checks} checks, {streams} streams decoding")
        before = counter["tokens"]
        await time_checks(engine, loaded, checks, policy, offset=checks)
        loaded.engine_tokens = counter["tokens"] - before
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        deadline = time.monotonic() + 30
        while engine.num_unfinished_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    for phase in (idle, loaded):
        s = phase.summary()
        log(
            f"input gate, {phase.name}: p50 {ms(s['p50_s'])} ms, p99 {ms(s['p99_s'])} ms, "
            f"max {ms(s['max_s'])} ms, {s['failed']} failed, {s['flagged']} flagged"
        )
    return {"idle": idle, "loaded": loaded}
