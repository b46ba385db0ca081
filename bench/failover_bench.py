"""Node loss in a pool of two engine nodes (issue 20, "Pools of several nodes"): the steady-state
TTFT with both nodes, then the TTFT spike when one node is SIGKILLed under load, in one run.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.failover_bench [--clients 8] [--steady-s 30]

The stack: two engine processes of this project (A and B: uvicorn with the real vLLM engine, on
loopback, as chatsite/prodstack.py starts its engine process) and one gateway without an engine
(uvicorn, ``CHAT_ENGINE_CLASS=inference.remote.OpenAIRemoteEngine``) whose pool ``nodes`` lists
both (``urls``, inference/nodes.py; the pool file is written to var/bench/). Every request is a
paid user's streamed turn on the gateway's ``/v1``: ``POST /v1/conversations`` then ``POST
.../turns``. Rate limits and shedding are off (bench/harness.py ``TIER_MACHINERY_OFF``).

- **steady**: ``--clients`` clients loop turns for ``--steady-s`` seconds (a new conversation
  each, so each goes to its rendezvous-hash node; max_tokens 48). TTFT = the turn request sent ->
  its first ``token`` event read.
- **node loss**: ``--clients`` turns at once (max_tokens 64) on conversations chosen so half are
  homed on node B; once every stream has shown 3 tokens, B's whole process group is SIGKILLed.
  The *resume gap* of a stream = its last token before the kill -> its first token after: for
  the streams homed on B, the time to notice the loss, re-prefill on A and send the next token
  (the TTFT spike); for the streams on A, the ordinary token gap beside it. Every stream must end
  with ``done``.

Results: a table on stdout and ``var/bench/failover_bench.json``; each phase records the CPU used
outside the stack and is flagged when disturbed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from bench.harness import (
    PROMPTS,
    VAR,
    CpuMeter,
    Spawned,
    server_argv,
    disturbed,
    free_port,
    log,
    percentile,
    tier_machinery_off_env,
)

POOL = "nodes"
STEADY_MAX_TOKENS = 48
LOSS_MAX_TOKENS = 64
TOKENS_BEFORE_KILL = 3


@dataclass
class Stream:
    """One streamed turn: its conversation's ``home`` node, when it was sent, each token event's
    time, and how it ended (``done`` or the error)."""

    conversation_id: str
    home: str = ""
    sent_at: float = 0.0
    token_at: list[float] = field(default_factory=list)
    end: str = ""

    def ttft(self) -> float | None:
        return self.token_at[0] - self.sent_at if self.token_at else None

    def gap_over(self, at: float) -> float:
        """Seconds from the last token before ``at`` to the first after it."""
        before = [t for t in self.token_at if t <= at]
        after = [t for t in self.token_at if t > at]
        return (after[0] if after else at) - (before[-1] if before else self.sent_at)


async def conversation(http: httpx.AsyncClient, key: str) -> str:
    created = await http.post("/v1/conversations", json={"model": POOL}, headers={"Authorization": f"Bearer {key}"})
    if created.status_code != 201:
        raise RuntimeError(f"conversation: {created.status_code} {created.text[:200]}")
    return created.json()["conversation_id"]


async def stream_turn(http: httpx.AsyncClient, key: str, stream: Stream, content: str, max_tokens: int) -> None:
    """Send one turn on ``stream``'s conversation and read it to its end (``stream.end``)."""
    event = ""
    stream.sent_at = time.perf_counter()
    try:
        async with http.stream(
            "POST", f"/v1/conversations/{stream.conversation_id}/turns",
            headers={"Authorization": f"Bearer {key}"},
            json={"role": "user", "content": content, "max_tokens": max_tokens},
        ) as response:  # fmt: skip
            if response.status_code != 200:
                stream.end = f"http {response.status_code}: {(await response.aread())[:200]!r}"
                return
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "token":
                    stream.token_at.append(time.perf_counter())
                elif line.startswith("data: ") and event in ("done", "error", "moderation"):
                    stream.end = event if event == "done" else f"{event}: {line[6:200]}"
                    return
    except httpx.HTTPError as exc:
        stream.end = f"exception: {exc!r}"


async def steady(http: httpx.AsyncClient, keys: list[str], seconds: float) -> list[Stream]:
    """Each key loops turns on new conversations for ``seconds``; -> every turn."""
    done: list[Stream] = []
    until = time.monotonic() + seconds

    async def client(i: int, key: str) -> None:
        n = 0
        while time.monotonic() < until:
            stream = Stream(await conversation(http, key))
            await stream_turn(http, key, stream, PROMPTS[(i + n) % len(PROMPTS)], STEADY_MAX_TOKENS)
            done.append(stream)
            n += 1

    await asyncio.gather(*(client(i, key) for i, key in enumerate(keys)))
    return done


async def node_loss(http: httpx.AsyncClient, keys: list[str], node_a: str, killed: Spawned) -> tuple[list[Stream], float]:
    """Half the streams homed on ``killed``'s node; kill it once all have shown tokens; -> the
    streams and the kill time (time.perf_counter())."""
    from inference.nodes import hrw_order  # noqa: PLC0415 - after django.setup()

    per_node = len(keys) // 2
    streams: list[Stream] = []
    homes = {node_a: 0, killed.url: 0}
    while len(streams) < 2 * per_node:
        conversation_id = await conversation(http, keys[len(streams)])
        home = hrw_order(conversation_id, [node_a, killed.url])[0]
        if homes[home] < per_node:
            homes[home] += 1
            streams.append(Stream(conversation_id, home))
    prompt = "Write a long story about a lighthouse keeper and a storm at sea."
    tasks = [
        asyncio.create_task(stream_turn(http, key, stream, prompt, LOSS_MAX_TOKENS))
        for key, stream in zip(keys, streams, strict=False)
    ]
    deadline = time.monotonic() + 180
    while not all(len(s.token_at) >= TOKENS_BEFORE_KILL or s.end for s in streams):
        if time.monotonic() > deadline:
            raise RuntimeError("the streams showed no tokens in 180 s")
        await asyncio.sleep(0.02)
    killed_at = time.perf_counter()
    os.killpg(killed.proc.pid, signal.SIGKILL)
    log(f"node B ({killed.url}) SIGKILLed under {len(streams)} streams")
    await asyncio.wait_for(asyncio.gather(*tasks), 300)
    return streams, killed_at


def summary(values: list[float]) -> dict:
    """n, p50, p99 and max in milliseconds (None when there are no values)."""
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def pools_file(path: Path, urls: list[str], service_key: str) -> None:
    """The default pools plus ``nodes`` (both engine nodes), as the gateway's CHAT_POOLS_FILE
    (0600: it holds the service key)."""
    from django.conf import settings  # noqa: PLC0415

    nodes = {
        "name": POOL, "label": "Two engine nodes", "version": "1", "backend": "remote", "urls": urls,
        "model": settings.CHAT_MODEL_NAME, "api_key": service_key, "priority": 0, "max_context": 2048,
        "max_tokens": 512, "price_input_per_m": "1.00", "price_cached_input_per_m": "0.10",
        "price_output_per_m": "2.00", "tiers": ["paid", "enterprise"],
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"pools": [*settings.CHAT_POOLS, nodes]}))
    path.chmod(0o600)


def run(args) -> int:
    """The bench (module docstring); -> 0, or 2 when a stream did not end with done."""
    import logging  # noqa: PLC0415

    from django.core.management import call_command  # noqa: PLC0415

    from accounts.services import service_api_key  # noqa: PLC0415
    from bench.priority_prod import _database_url, api_keys  # noqa: PLC0415

    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    keys = api_keys("paid", args.clients)
    service_key = service_api_key()
    work = VAR / "bench" / "failover"
    env = {
        **os.environ, **tier_machinery_off_env(), "DATABASE_URL": _database_url(),
        "CHAT_SERVICE_API_KEY": service_key, "CHAT_MEMORY_ENABLED": "0", "CELERY_TASK_ALWAYS_EAGER": "1",
    }  # fmt: skip
    for name in ("CHAT_ENGINE_CLASS", "CHAT_ENGINE_URL", "CHAT_ENGINE_API_KEY", "CHAT_POOLS_FILE"):
        env.pop(name, None)
    ports = [free_port() for _ in range(3)]
    node_a, node_b = (
        Spawned(name, server_argv(port=port), port=port, env=env, log_path=work / f"{name}.log")
        for name, port in (("node-a", ports[0]), ("node-b", ports[1]))
    )
    pools_path = work / "pools.yaml"
    pools_file(pools_path, [node_a.url, node_b.url], service_key)
    gateway = Spawned(
        "gateway", server_argv(port=ports[2]), port=ports[2], log_path=work / "gateway.log",
        env={**env, "CHAT_ENGINE_CLASS": "inference.remote.OpenAIRemoteEngine", "CHAT_ENGINE_URL": node_a.url,
             "CHAT_ENGINE_API_KEY": service_key, "CHAT_POOLS_FILE": str(pools_path)},
    )  # fmt: skip
    phases: dict[str, dict] = {}
    try:
        for server in (node_a, node_b):  # one at a time: two model loads on 2 cores thrash
            server.start()
            log(f"{server.name} ready in {server.wait_ready('/readyz', 600):.0f} s")
        gateway.start()
        log(f"gateway ready in {gateway.wait_ready('/readyz', 300):.0f} s")

        async def measure() -> tuple[list[Stream], list[Stream], float]:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=300) as http:
                meter = CpuMeter()
                meter.start()
                steady_streams = await steady(http, keys, args.steady_s)
                phases["steady"] = {"cpu": meter.stop()}
                meter.start()
                loss_streams, killed_at = await node_loss(http, keys, node_a.url, node_b)
                phases["node_loss"] = {"cpu": meter.stop()}
                return steady_streams, loss_streams, killed_at

        steady_streams, loss_streams, killed_at = asyncio.run(measure())
    finally:
        for server in (gateway, node_a, node_b):
            with contextlib.suppress(Exception):
                server.stop()
        pools_path.unlink(missing_ok=True)

    moved = [s for s in loss_streams if s.home == node_b.url]
    stayed = [s for s in loss_streams if s.home == node_a.url]
    ttft = [t for s in steady_streams if s.end == "done" and (t := s.ttft()) is not None]
    rows = {
        "steady TTFT, two nodes": summary(ttft),
        "node loss: TTFT of its turns": summary([t for s in loss_streams if (t := s.ttft()) is not None]),
        "node loss: resume gap, moved (B)": summary([s.gap_over(killed_at) for s in moved]),
        "node loss: token gap, stayed (A)": summary([s.gap_over(killed_at) for s in stayed]),
    }
    errors = [s.end for s in steady_streams + loss_streams if s.end != "done"]
    for phase in phases.values():
        phase["disturbed"] = disturbed(phase["cpu"])
    print(f"\n{'':36} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for name, row in rows.items():
        cells = [f"{row[k]:9.1f}" if row[k] is not None else f"{'-':>9}" for k in ("p50_ms", "p99_ms", "max_ms")]
        print(f"{name:36} {row['n']:4d} {' '.join(cells)}")
    print(
        f"errors: {len(errors)}; disturbed: "
        + ", ".join(f"{name} {'yes' if phase['disturbed'] else 'no'}" for name, phase in phases.items())
        + f"; load average {os.getloadavg()[0]:.2f}\n"
    )
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"clients": args.clients, "steady_s": args.steady_s, "steady_max_tokens": STEADY_MAX_TOKENS,
                   "loss_max_tokens": LOSS_MAX_TOKENS, "tokens_before_kill": TOKENS_BEFORE_KILL,
                   "cpu_count": os.cpu_count()},
        "total_s": time.perf_counter() - started, "results": rows, "phases": phases, "errors": errors[:20],
    }, indent=1, default=str))  # fmt: skip
    log(f"results written to {out}")
    return 2 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (even; default 8)")
    parser.add_argument("--steady-s", type=float, default=30, help="seconds of the steady phase")
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "failover_bench.json")
    args = parser.parse_args(argv)
    if args.clients < 2 or args.clients % 2:
        parser.error("--clients must be an even number >= 2 (half are homed on each node)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
