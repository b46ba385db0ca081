"""Paid TTFT in the production topology (issue 17): ``python -m chatsite.prodstack run`` (the
engine process with the real vLLM engine, 2 gateways without an engine, Celery, nginx with TLS)
while free-tier streams saturate the engine, under first come, first served and under priority
scheduling, in one run.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.priority_bench --topology prod [--free 32]

Every request is a user's: ``POST /v1/conversations`` then a streamed
``POST /v1/conversations/{id}/turns`` through nginx (HTTPS) to a gateway, which forwards the turn
to the engine process with its tier and priority (the ``admission`` field); the engine process's
admission queue orders it. The schedule is the engine process's ``CHAT_SCHEDULING``, so each
phase starts its own stack (the same database, Redis and model):

- **A** ``fcfs``: every turn in arrival order, no reserved slots (the baseline);
- **B** ``priority``: paid turns first (pool priority 0 vs 1) and ``CHAT_RESERVED_SLOTS``
  slots free turns may never take.

Both phases: ``CHAT_MAX_NUM_SEQS`` 16 slots, ``--free`` free clients each looping turns back to
back (a prompt from bench/harness.py's list, max_tokens drawn from 32..128; a new conversation
each time, so prompts stay short), and ``--paid`` paid probes one every 0.5-1.0 s (uniform), each
a ``--paid-max-tokens`` answer. Rate limits and shedding are off (bench/harness.py
``TIER_MACHINERY_OFF``, reserved slots excepted): this measures the order, not the refusals.
TTFT = the turn request sent -> its first ``token`` event read (the client's view: nginx, the
gateway, the hop, the engine's queue). The engine's queue (``vllm:num_requests_waiting`` /
``_running`` on its ``/metrics``) is sampled every 0.25 s.

Target (issue 17, the design's paid target): paid TTFT p99 <= 0.8 s under priority. Results: a
table on stdout and ``var/bench/priority_prod.json``; each phase records the CPU used by
processes outside the stack and is flagged when disturbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.harness import PROMPTS, CpuMeter, disturbed, log, ms, percentile, ratio, tier_machinery_off_env

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

MAX_NUM_SEQS = 16
FREE_MAX_TOKENS = (32, 128)
PAID_EVERY_S = (0.5, 1.0)
PAID_P99_TARGET_S = 0.8
PAID_USERS = 8  # probes take turns among these (one answer per conversation at a time anyway)


@dataclass
class Phase:
    name: str
    mode: str
    free_clients: int
    paid: list[float | None] = field(default_factory=list)  # TTFT s, None: failed
    paid_errors: list[str] = field(default_factory=list)
    free_ttfts: list[float] = field(default_factory=list)
    free_done: int = 0
    free_errors: int = 0
    free_tokens: int = 0
    queue: list[tuple[int, int]] = field(default_factory=list)
    wall_s: float = 0.0
    cpu: dict = field(default_factory=dict)

    def summary(self) -> dict:
        ttfts = [t for t in self.paid if t is not None]
        return {
            "mode": self.mode,
            "free_clients": self.free_clients,
            "paid_n": len(ttfts),
            "paid_errors": len(self.paid) - len(ttfts),
            "paid_ttft_p50_s": percentile(ttfts, 50, default=None),
            "paid_ttft_p99_s": percentile(ttfts, 99, default=None),
            "paid_ttft_max_s": max(ttfts) if ttfts else None,
            "free_ttft_p50_s": percentile(self.free_ttfts, 50, default=None),
            "free_done": self.free_done,
            "free_errors": self.free_errors,
            "free_tokens_per_s": self.free_tokens / self.wall_s if self.wall_s else None,
            "waiting_mean": statistics.mean(w for w, _ in self.queue) if self.queue else None,
            "running_mean": statistics.mean(r for _, r in self.queue) if self.queue else None,
            "wall_s": self.wall_s,
            "other_cpu_s": self.cpu.get("other_cpu_s"),
            "disturbed": disturbed(self.cpu, self.wall_s),
        }


def _database_url() -> str:
    from django.db import connection  # noqa: PLC0415

    db = connection.settings_dict
    url = f"postgresql://{db['USER'] or ''}:{db['PASSWORD'] or ''}@{db.get('HOST') or ''}"
    url += f":{db['PORT']}" if db.get("PORT") else ""
    url += f"/{db['NAME']}"
    host = db.get("OPTIONS", {}).get("host")
    return url + (f"?host={host}" if host else "")


def api_keys(tier: str, n: int) -> list[str]:
    """Bearer keys of ``n`` bench users of ``tier`` (created once, a new key per run)."""
    from accounts.models import User  # noqa: PLC0415
    from accounts.services import api_key_create  # noqa: PLC0415

    keys = []
    for i in range(n):
        user, _ = User.objects.get_or_create(username=f"bench-prod-{tier}-{i}", defaults={"tier": tier})
        if user.tier != tier:
            user.tier = tier
            user.save(update_fields=["tier"])
        keys.append(api_key_create(user=user, name="priority bench").raw)
    return keys


@contextlib.contextmanager
def prodstack(mode: str, workdir: Path):
    """The production stack with the engine process's ``CHAT_SCHEDULING`` = ``mode``; yields
    its state (``url``, ``engine_url``, ...) and the nginx certificate's path."""
    state_file = workdir / "state.json"
    state_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        **tier_machinery_off_env(),
        "DATABASE_URL": _database_url(),
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CHAT_SCHEDULING": mode,
        "CHAT_MAX_NUM_SEQS": str(MAX_NUM_SEQS),
        "CHAT_MEMORY_ENABLED": "0",  # retrieval would load the embedding model into each gateway
    }
    env.pop("CHAT_RESERVED_SLOTS")  # the product's reserved slots (priority mode only)
    for name in ("CHAT_ENGINE_CLASS", "CHAT_ENGINE_URL", "CHAT_ENGINE_API_KEY", "DJANGO_DEBUG"):
        env.pop(name, None)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"prodstack-{mode}.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chatsite.prodstack", "run", "--gateways", "2",
             "--base-port", "0", "--https-port", "0", "--http-port", "0",
             "--workdir", str(workdir / "work"), "--state-file", str(state_file),
             "--ready-timeout", "300"],
            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 420
        while not state_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the production stack did not start; see {log_path}")
            time.sleep(0.5)
        yield json.loads(state_file.read_text()), workdir / "work" / "nginx" / "tls-cert.pem"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Client:
    """One user's API client through nginx."""

    def __init__(self, http: httpx.AsyncClient, key: str) -> None:
        self.http, self.headers = http, {"Authorization": f"Bearer {key}"}

    async def turn(self, content: str, max_tokens: int) -> tuple[float | None, int]:
        """A new conversation and one streamed turn; -> (TTFT s from the turn's request to its
        first token event, completion tokens). Raises RuntimeError on an error reply."""
        created = await self.http.post("/v1/conversations", json={}, headers=self.headers)
        if created.status_code != 201 and created.status_code != 200:
            raise RuntimeError(f"conversation: {created.status_code} {created.text[:200]}")
        conversation_id = created.json()["conversation_id"]
        started = time.perf_counter()
        first = None
        event = ""
        async with self.http.stream(
            "POST", f"/v1/conversations/{conversation_id}/turns", headers=self.headers,
            json={"role": "user", "content": content, "max_tokens": max_tokens},
        ) as response:  # fmt: skip
            if response.status_code != 200:
                raise RuntimeError(f"turn: {response.status_code} {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "token" and first is None:
                    first = time.perf_counter()
                elif line.startswith("data: ") and event in ("done", "error", "moderation"):
                    data = json.loads(line[6:])
                    if event != "done":
                        raise RuntimeError(f"{event}: {data.get('message', '')[:200]}")
                    return (None if first is None else first - started), data["usage"]["completion_tokens"]
        raise RuntimeError("the stream ended without done")


async def engine_queue(engine_url: str) -> tuple[int, int]:
    """(waiting, running) from the engine process's /metrics (vLLM's names)."""
    from inference.remote import load_parse  # noqa: PLC0415

    async with httpx.AsyncClient(timeout=5) as http:
        load = load_parse((await http.get(f"{engine_url}/metrics")).text, "")
    return load.waiting, load.running


async def run_phase(phase: Phase, state: dict, cert: Path, free_keys: list[str], paid_keys: list[str], args) -> None:
    import ssl  # noqa: PLC0415

    context = ssl.create_default_context(cafile=str(cert))
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=state["url"].rstrip("/"), verify=context, timeout=300, limits=limits) as http:
        measuring = False

        async def free_client(i: int) -> None:
            client, rng, n = Client(http, free_keys[i]), random.Random(1000 * i + len(phase.name)), 0
            while True:
                n += 1
                try:
                    ttft, tokens = await client.turn(PROMPTS[(i + n) % len(PROMPTS)], rng.randint(*FREE_MAX_TOKENS))
                except (RuntimeError, httpx.HTTPError) as exc:
                    if measuring:
                        phase.free_errors += 1
                    log(f"free turn failed: {exc!r}")
                    await asyncio.sleep(0.5)
                    continue
                if measuring:
                    phase.free_done += 1
                    phase.free_tokens += tokens
                    if ttft is not None:
                        phase.free_ttfts.append(ttft)

        async def sample() -> None:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    phase.queue.append(await engine_queue(state["engine_url"]))
                await asyncio.sleep(0.25)

        async def probe(k: int) -> None:
            try:
                ttft, _ = await Client(http, paid_keys[k % len(paid_keys)]).turn(
                    PROMPTS[k % len(PROMPTS)], args.paid_max_tokens
                )
                phase.paid.append(ttft)
            except (RuntimeError, httpx.HTTPError) as exc:
                phase.paid.append(None)
                phase.paid_errors.append(repr(exc))

        log(f"phase {phase.name}: {phase.mode}, {phase.free_clients} free clients through 2 gateways")
        loop = asyncio.get_running_loop()
        free = [loop.create_task(free_client(i)) for i in range(phase.free_clients)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the free load fills the slots and queues
            with contextlib.suppress(httpx.HTTPError, ValueError):
                waiting, running = await engine_queue(state["engine_url"])
                if waiting > 0 and running >= MAX_NUM_SEQS // 2:
                    break
            await asyncio.sleep(0.2)
        await asyncio.sleep(5.0)  # past the first full batches (slow after a start)
        measuring = True
        meter = CpuMeter()
        meter.start()
        sampler = loop.create_task(sample())
        started = time.perf_counter()
        rng = random.Random(len(phase.name))
        probes = []
        for k in range(args.paid):
            probes.append(loop.create_task(probe(k)))
            await asyncio.sleep(rng.uniform(*PAID_EVERY_S))
        await asyncio.gather(*probes)
        phase.wall_s = time.perf_counter() - started
        phase.cpu = meter.stop()
        measuring = False
        for task in [*free, sampler]:
            task.cancel()
        await asyncio.gather(*free, sampler, return_exceptions=True)


def report(phases: dict[str, Phase]) -> dict:
    s = {name: phase.summary() for name, phase in phases.items()}
    print("\n  Paid TTFT in the production topology (engine process + 2 gateways + nginx), "
          f"{MAX_NUM_SEQS} engine slots\n")  # fmt: skip
    print("  phase  schedule  free clients  paid n  paid TTFT p50 / p99 / max (ms)  free TTFT p50  "
          "free tok/s  engine waiting / running (mean)")  # fmt: skip
    for name, row in s.items():
        print(
            f"  {name:<5}  {row['mode']:<8}  {row['free_clients']:>12}  {row['paid_n']:>6}  "
            f"{ms(row['paid_ttft_p50_s'], 0):>8} / {ms(row['paid_ttft_p99_s'], 0):>6} / "
            f"{ms(row['paid_ttft_max_s'], 0):>6}       {ms(row['free_ttft_p50_s'], 0):>9} ms  "
            f"{row['free_tokens_per_s'] or 0:>9.1f}  "
            f"{row['waiting_mean'] or 0:.1f} / {row['running_mean'] or 0:.1f}"
        )
    a, b = s["A"], s["B"]
    p99_ratio = ratio(b["paid_ttft_p99_s"], a["paid_ttft_p99_s"])
    print(f"\n  paid TTFT p99, priority / fcfs: {p99_ratio:.2f}" if p99_ratio is not None else "")
    target_ok = b["paid_ttft_p99_s"] is not None and b["paid_ttft_p99_s"] <= PAID_P99_TARGET_S
    print(f"  {'PASS' if target_ok else 'MISS'}  paid TTFT p99 under priority <= {PAID_P99_TARGET_S * 1000:.0f} ms "
          f"({ms(b['paid_ttft_p99_s'], 0)} ms)")  # fmt: skip
    errors = sum(row["paid_errors"] + row["free_errors"] for row in s.values())
    print(f"  failed requests: {errors}")
    flagged = [f"{n} ({r['other_cpu_s']:.1f} CPU-s)" for n, r in s.items() if r["disturbed"]]
    print("  phases with background load from other processes: " + (", ".join(flagged) or "none") + "\n")
    return {"phases": s, "paid_p99_ratio": p99_ratio, "target_pass": target_ok, "errors": errors}


def run(args) -> int:
    """The production-topology bench (see the module docstring); -> exit status (0 done, 1 a
    missed target with ``--strict``, 2 failed requests)."""
    import logging  # noqa: PLC0415

    from django.core.management import call_command  # noqa: PLC0415

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    started = time.perf_counter()
    call_command("migrate", verbosity=0)  # the bench's users need the tables (a fresh dev stack)
    free_keys = api_keys("free", args.free)
    paid_keys = api_keys("paid", PAID_USERS)
    phases = {"A": Phase("A", "fcfs", args.free), "B": Phase("B", "priority", args.free)}
    workdir = VAR / "bench" / "prodstack"
    for phase in phases.values():
        log(f"starting the production stack (CHAT_SCHEDULING={phase.mode}; loading the model)")
        with prodstack(phase.mode, workdir) as (state, cert):
            asyncio.run(run_phase(phase, state, cert, free_keys, paid_keys, args))
    summary = report(phases)
    for phase in phases.values():
        for error in phase.paid_errors[:3]:
            log(f"phase {phase.name} paid probe failed: {error}")
    out = args.out.with_name("priority_prod.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"max_num_seqs": MAX_NUM_SEQS, "free": args.free, "paid": args.paid,
                   "paid_max_tokens": args.paid_max_tokens, "cpu_count": os.cpu_count()},
        "total_s": time.perf_counter() - started, **summary,
        "paid_samples": {name: phase.paid for name, phase in phases.items()},
    }, indent=1, default=str))  # fmt: skip
    log(f"results written to {out} ({time.perf_counter() - started:.0f} s)")
    if summary["errors"]:
        return 2
    return 1 if args.strict and not summary["target_pass"] else 0
