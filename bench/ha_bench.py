"""Failover benchmark: steady-state turn appends on a Patroni-managed cluster, then the
write-unavailable window when its primary is lost, in the same run (issue 20, "make bench gains a
failover part").

Run through the dev stack (it provides Redis; etcd, Patroni and PostgreSQL are started here)::

    python -m chatsite.devstack exec -- python -m bench.ha_bench [--steady-s 10] [--rate 20]

Setup: tests/patroni_cluster.py (one etcd, two Patroni members over pgserver's PostgreSQL 16,
ttl 20 s (Patroni's floor), loop_wait 2 s, retry_timeout 3 s, synchronous mode), and the app in
its own process (tests/ha_load.py) reaching the primary through a libpq multi-host URL with
``target_session_attrs=read-write``, reads through ``prefer-standby``, the pool's
``DB_POOL_TIMEOUT_S`` at 2 s (docs/operations.md "Failover").

Measured, one conversation, user turns through ``services.turn_append_user`` (each its own
request: connection returned at its end):

1. *steady*: appends at ``--rate`` per second for ``--steady-s`` seconds: achieved rate, p50/p99
   append latency (ms; includes the synchronous standby's flush);
2. *max*: appends back to back (rate 1000/s asked) for ``--max-s`` seconds: achieved rate and
   latencies: the ceiling of one sequential client on this machine;
3. *failover*: appends at ``--rate`` per second; after 3 s the primary's Patroni and postmaster
   are SIGKILLed; the loop runs until writes have been back for 3 s (at most 60 s). Printed: the
   write-unavailable window (last acknowledged write before the first refusal -> first
   acknowledged write after it), refused attempts, acknowledged turns missing or duplicated on
   the new primary (must be 0), reads that failed during the outage, and how long the old
   member took to rejoin as a replica once its Patroni was started again.

Read the numbers honestly: everything runs on one small shared machine, so latencies include
CPU contention; the window is dominated by Patroni's ttl (the leader key must expire), not by
the app. Results: stdout and ``var/bench/ha_bench.json``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

from bench.harness import percentile

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
KILL_AFTER_S = 3


def _summary(result: dict, seconds: float) -> dict:
    latencies = [(a[3] - a[2]) * 1000 for a in result["acked"]]
    span = (result["acked"][-1][3] - result["acked"][0][2]) if result["acked"] else seconds
    return {
        "acked": len(result["acked"]),
        "refused": len(result["failed"]),
        "rate_per_s": round(len(result["acked"]) / span, 1) if span else 0.0,
        "p50_ms": round(percentile(latencies, 50, default=0.0), 1),
        "p99_ms": round(percentile(latencies, 99, default=0.0), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate", type=float, default=20.0, help="appends per second (steady, failover)"
    )
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--max-s", type=float, default=5.0)
    args = parser.parse_args(argv)

    from tests.ha_load import write_unavailable_window  # noqa: PLC0415
    from tests.patroni_cluster import LOOP_WAIT_S, RETRY_TIMEOUT_S, TTL_S, patroni_cluster  # noqa: PLC0415
    from tests.pgcluster import AppProcess  # noqa: PLC0415

    results: dict = {
        "patroni": {"ttl_s": TTL_S, "loop_wait_s": LOOP_WAIT_S, "retry_timeout_s": RETRY_TIMEOUT_S}
    }
    with patroni_cluster() as cluster:
        old = cluster.leader()
        env = {
            "DATABASE_URL": cluster.url("read-write"),
            "DATABASE_REPLICA_URLS": cluster.url("prefer-standby"),
            "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            "CHAT_READ_YOUR_WRITES_S": "0",
            "DB_POOL_TIMEOUT_S": "2",
        }
        with AppProcess(env, module="tests.ha_load") as app:
            app.call("migrate")
            app.call("user_create", username="bench", region="eu-west")
            conversation_id = app.call("conversation_create", username="bench").value[
                "conversation_id"
            ]

            def loop(rate: float, max_s: float) -> dict:
                return app.call(
                    "append_loop", timeout=max_s + 60, username="bench", conversation_id=conversation_id,
                    rate=rate, max_s=max_s, settle_s=3,
                ).value  # fmt: skip

            results["steady"] = _summary(loop(args.rate, args.steady_s), args.steady_s)
            results["max"] = _summary(loop(1000.0, args.max_s), args.max_s)

            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                running = pool.submit(loop, args.rate, 60.0)
                time.sleep(KILL_AFTER_S)
                killed_at = time.time()
                old.kill()
                failover = running.result(timeout=150)
            new = cluster.leader(timeout=30)
            started = time.monotonic()
            old.start()
            cluster.wait_replica(old, timeout=90)
            rejoin_s = time.monotonic() - started

            stored = collections.Counter(
                row[0]
                for row in new.query(
                    "SELECT turn_id::text FROM conversations_turn WHERE conversation_id = %s",
                    (conversation_id,),
                )
            )
            acked = [a[1] for a in failover["acked"]]
            first_failure = failover["failed"][0][1] if failover["failed"] else killed_at
            resumed = next((a[2] for a in failover["acked"] if a[2] > first_failure), float("inf"))
            during = [r for r in failover["reads"] if first_failure <= r[0] < resumed]
            window = write_unavailable_window(failover)
            results["failover"] = {
                **_summary(failover, 60.0),
                "write_unavailable_s": round(window, 2) if window is not None else None,
                "bound_s": TTL_S + LOOP_WAIT_S + 5,
                "acked_missing": sum(1 for i in acked if stored[i] == 0),
                "acked_duplicated": sum(1 for i in acked if stored[i] > 1),
                "reads_during_outage": len(during),
                "reads_failed_during_outage": sum(1 for r in during if not r[1]),
                "rejoin_as_replica_s": round(rejoin_s, 1),
            }

    s, m, f = results["steady"], results["max"], results["failover"]
    print(
        f"HA bench (Patroni ttl {TTL_S} s, loop_wait {LOOP_WAIT_S} s, retry_timeout {RETRY_TIMEOUT_S} s, sync mode)"
    )
    print(
        f"  steady  {s['rate_per_s']:7.1f} appends/s asked {args.rate:g}/s  p50 {s['p50_ms']:6.1f} ms  p99 {s['p99_ms']:6.1f} ms"
    )
    print(
        f"  max     {m['rate_per_s']:7.1f} appends/s (one sequential client)  p50 {m['p50_ms']:6.1f} ms  p99 {m['p99_ms']:6.1f} ms"
    )
    print(f"  failover: write-unavailable window {f['write_unavailable_s']} s (bound {f['bound_s']} s), "
          f"{f['refused']} refused, acknowledged missing {f['acked_missing']} / duplicated {f['acked_duplicated']}, "
          f"reads during outage {f['reads_during_outage']} ({f['reads_failed_during_outage']} failed), "
          f"old primary back as replica in {f['rejoin_as_replica_s']} s")  # fmt: skip
    out = VAR / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ha_bench.json").write_text(
        json.dumps({"args": vars(args), "results": results}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
