"""Replica read benchmark: history pages per second through the database router with one
primary + one streaming replica, against the same reads on the primary alone, in the same run.

Run through the dev stack (it provides Redis; the two PostgreSQL servers are made here)::

    python -m chatsite.devstack exec -- python -m bench.replica_bench [--threads 8] [--seconds 4]

Setup: a fresh primary and a replica made from it with ``pg_basebackup -R`` (tests/pgcluster.py,
PostgreSQL 16 from the pgserver wheel, loopback TCP), this process configured through the
environment like a gateway (``DATABASE_URL`` = primary, ``DATABASE_REPLICA_URLS`` = replica),
migrated, C users with one conversation of T turns each, replayed on the replica, and the
read-your-writes window (0.5 s here) over. The Redis hot cache is off (``CHAT_HOT_CACHE_TURNS=0``):
this measures the PostgreSQL reads it falls through to.

Measured: N threads each read history pages as fast as they can for S seconds:
``selectors.conversation_get_for_user`` then ``page_selectors.turn_page(limit=50)`` (what
``GET /v1/conversations/{id}`` does), on a random conversation. Two modes, alternated twice:

- *replica*: the router as configured: conversation reads go to the replica;
- *primary only*: ``DATABASE_REPLICAS`` emptied: the same reads on the primary (the baseline).

Printed: pages/s, p50/p99 page latency (ms) per mode, the ratio, and how many transactions
each server committed during each mode (the check that the reads really went where claimed).

Read the ratio honestly: here both servers run on the same small machine (2 cores) as the
benchmark itself, so a replica adds no CPU; the ratio shows the router's overhead, not
scale-out. On separate machines each replica adds its own CPU and cache for reads.
Results: stdout and ``var/bench/replica_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from bench.harness import percentile

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
WINDOW_S = 0.5  # read-your-writes window in this run


def _seed(conversations: int, turns: int) -> list[tuple]:
    """(user, conversation) pairs, each conversation with ``turns`` turns."""
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    from conversations import services  # noqa: PLC0415
    from conversations.models import Turn  # noqa: PLC0415

    pairs = []
    for n in range(conversations):
        user = get_user_model().objects.create_user(username=f"bench{n}", password="x")
        conversation = services.conversation_create(owner=user)
        base = conversation.created_at
        from datetime import timedelta  # noqa: PLC0415

        Turn.objects.using("default").bulk_create(
            Turn(
                conversation=conversation,
                role=Turn.Role.USER if i % 2 == 0 else Turn.Role.ASSISTANT,
                content=f"turn {i} " + "lorem ipsum dolor sit amet " * 8,
                created_at=base + timedelta(milliseconds=i),
            )
            for i in range(turns)
        )
        pairs.append((user, conversation.conversation_id))
    return pairs


def _reader(pairs, deadline: float, latencies: list[float], errors: list[str]) -> None:
    from django.db import connections  # noqa: PLC0415

    from conversations import page_selectors, selectors  # noqa: PLC0415

    rng = random.Random()
    try:
        while time.perf_counter() < deadline:
            user, conversation_id = rng.choice(pairs)
            started = time.perf_counter()
            conversation = selectors.conversation_get_for_user(conversation_id=conversation_id, user=user)
            page, _ = page_selectors.turn_page(conversation=conversation, before=None, limit=50)
            latencies.append(time.perf_counter() - started)
            assert len(page) == 50
            connections.close_all()  # back to the pool, as at the end of a request
    except Exception as exc:  # noqa: BLE001 - reported
        errors.append(repr(exc))


def _commits(server) -> int:
    return server.query("SELECT xact_commit FROM pg_stat_database WHERE datname = 'chat'")[0][0]


def _measure(mode: str, pairs, threads: int, seconds: float, servers) -> dict:
    from django.test import override_settings  # noqa: PLC0415

    overrides = {"DATABASE_REPLICAS": {"default": []}} if mode == "primary only" else {}
    latencies: list[float] = []
    errors: list[str] = []
    before = {name: _commits(s) for name, s in servers.items()}
    with override_settings(**overrides):
        deadline = time.perf_counter() + seconds
        workers = [
            threading.Thread(target=_reader, args=(pairs, deadline, latencies, errors))
            for _ in range(threads)
        ]
        started = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
    commits = {name: _commits(s) - before[name] for name, s in servers.items()}
    if errors:
        raise RuntimeError(f"{mode}: {errors[:3]}")
    return {
        "mode": mode,
        "pages": len(latencies),
        "seconds": elapsed,
        "pages_per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "commits": commits,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0, help="per mode and round")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=400, help="turns per conversation")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from tests.pgcluster import clusters, wait_replayed  # noqa: PLC0415

    with clusters() as made:
        primary = made.primary("primary")
        replica = made.replica(primary, "replica")
        os.environ.update(
            DJANGO_SETTINGS_MODULE="chatsite.settings.base",
            DATABASE_URL=primary.url(),
            DATABASE_REPLICA_URLS=replica.url(),
            CHAT_READ_YOUR_WRITES_S=str(WINDOW_S),
            CHAT_HOT_CACHE_TURNS="0",  # PostgreSQL reads are measured, not the Redis hot cache
            DB_POOL_MAX=str(args.threads + 2),
        )
        import django  # noqa: PLC0415

        django.setup()
        from django.core.management import call_command  # noqa: PLC0415
        from django.db import connections  # noqa: PLC0415

        call_command("migrate", verbosity=0)
        pairs = _seed(args.conversations, args.turns)
        connections.close_all()
        wait_replayed(primary, replica)
        time.sleep(WINDOW_S + 0.2)  # the seeding writes' read-your-writes window is over

        servers = {"primary": primary, "replica": replica}
        _measure("replica", pairs, args.threads, 1.0, servers)  # warm-up (pools, caches)
        _measure("primary only", pairs, args.threads, 1.0, servers)
        rounds = []
        for _ in range(2):
            for mode in ("primary only", "replica"):
                rounds.append(_measure(mode, pairs, args.threads, args.seconds, servers))
        connections.close_all()
        for alias in connections:
            connections[alias].close_pool()

    results = {}
    for mode in ("primary only", "replica"):
        runs = [r for r in rounds if r["mode"] == mode]
        pages = sum(r["pages"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        results[mode] = {
            "pages_per_s": pages / seconds,
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": max(r["p99_ms"] for r in runs),
            "commits": {k: sum(r["commits"][k] for r in runs) for k in ("primary", "replica")},
        }
    ratio = results["replica"]["pages_per_s"] / results["primary only"]["pages_per_s"]
    print(
        f"\nHistory page reads (conversation + 50 turns of {args.turns}), {args.threads} threads, "
        f"{args.conversations} conversations, 2 x {args.seconds:.0f} s per mode"
    )
    print(f"{'mode':<14}{'pages/s':>10}{'p50 ms':>9}{'p99 ms':>9}   commits on primary / replica")
    for mode, r in results.items():
        print(
            f"{mode:<14}{r['pages_per_s']:>10.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
            f"   {r['commits']['primary']:>7} / {r['commits']['replica']}"
        )
    print(f"replica / primary-only throughput: {ratio:.2f}x")
    print(
        "Both servers share this machine's CPU with the benchmark, so this shows the router's "
        "overhead, not scale-out:\na replica on its own machine adds its CPU and cache to reads."
    )
    out = VAR / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "replica_bench.json").write_text(json.dumps({"args": vars(args), "results": results, "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
