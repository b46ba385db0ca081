"""Resume-stream benchmark: latency and capacity of the real resume endpoint
``GET /v1/conversations/{id}/turns/{turn_id}/events`` on ONE server process, for turns generated
by *another* process (so every stream is read back from the turn's Redis Stream).

Run through the dev stack (it provides PostgreSQL and Redis)::

    python -m chatsite.devstack exec -- python -m bench.stream_bench [--streams 2000] [--hold 20]

Setup (in this process): ``django.setup()``, migrate, one user + API key, K conversations, and
K in-flight turns "generated elsewhere": for each, what ``conversations.turnlog.TurnLogWriter``
writes (``chat:a:{answer_id}:conversation`` and ``token`` entries ``0-1``, ``0-2``, ... in
``chat:turn:{answer_id}``) and no final ``done``, so the turn looks still generating.

The server is ``python -m chatsite.serve`` (uvicorn, chatsite/serve.py) with ``CHAT_SSE_KEEPALIVE_S`` =
``--keepalive`` (2) and ``CHAT_ENGINE_CLASS=tests.fakes.ScriptedEngine``: no model is loaded and
the engine is never asked for anything; every byte of these streams comes from Redis.

1. Latency: M sequential resumes (``Last-Event-ID: 1`` on a 5-event turn), request sent -> first
   replayed ``event: token`` line; baseline: time to first byte of ``GET /v1/openapi.json``.
2. Capacity: N concurrent resume streams over the K turns (raw asyncio sockets, ramped in
   batches), held ``--hold`` s. Healthy: HTTP 200, still open when the hold ends, no error, and
   at least ``hold / keepalive / 2`` keep-alive comments during the hold. Server's RSS, threads
   and fds, Redis ``connected_clients`` and PostgreSQL backends are sampled along the way.
3. End: one ``done`` event per turn; every held stream should deliver it and end cleanly.

4. Stalled clients (bench/stream_stall.py): S clients POST a turn with a long scripted answer and
   stop reading, R others read theirs; the server's RSS per stream and per stalled client, and
   whether each stalled client, reading again, gets every event once and in order.

Every phase runs on each server of ``--servers`` in turn (default ``uvicorn``, the product's;
``uvicorn,daphne-plain`` adds stock daphne, without write backpressure, for comparison),
each fresh, and a table compares them (ratios to the first).

If the requested N misses, smaller N are tried, each on a fresh server (``--no-fallback``: don't).
Results: stdout and ``var/bench/stream_bench.json``; the servers' log:
``var/bench/stream_bench_server.log``.

The setup (fixture, server, sampling) is bench/stream_setup.py, the raw HTTP client
bench/stream_client.py, the phases bench/stream_phases.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time

from bench.harness import HOST, VAR
from bench.stream_phases import capacity_trial, latency_phase, rnd
from bench.stream_setup import ENGINE_CLASS, SERVERS, Fixture, Server, sample
from bench.stream_stall import print_stall, run_stall, stall_env

OUT_DIR = VAR / "bench"
ENGINE_NOTE = f"{ENGINE_CLASS} (not involved: these streams are read from Redis only)"
TARGET_STREAMS = 2000
FALLBACK_BUDGET_S = 150.0  # no further fallback trial starts after this much wall time
LATENCY_EVENTS = 5  # token events of the latency turn (resumed from Last-Event-ID: 1)

now = time.monotonic


def raise_fd_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (thousands of sockets here and in the server)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# --------------------------------------------------------------------------------------------
# Report


def print_trial(res: dict, log) -> None:
    def trio(d: dict) -> str:
        return f"{d['p50']}/{d['p99']}/{d['max']}"

    hb, done, rss = res["heartbeats_per_stream_in_hold"], res["done"], res["rss_mib"]
    life, lag = res["lifetime_of_ended_s"], res["client_loop_lag_ms"]
    opened = (
        f"{res['streams_opened_200']}  (ramp {res['ramp_s']} s; "
        f"time to 200 p50/p99/max {trio(res['time_to_200_ms'])} ms)"
    )
    ended = (
        f"{res['ended_before_hold_end']}  (by the server without done: "
        f"{res['ended_by_server_without_done']}; lifetime p50/max {life['p50']}/{life['max']} s)"
    )
    beats = (
        f"{res['heartbeats_total_in_hold']} in the hold, {res['heartbeats_total']} in all "
        f"(per stream in the hold min/p50/max {hb['min']}/{hb['p50']}/{hb['max']}; "
        f"gap p50/p99/max {trio(res['heartbeat_gap_s'])} s)"
    )
    memory = (
        f"before {rss['before']} MiB -> after ramp {rss['after_ramp']} -> end of hold "
        f"{rss['end_of_hold']} -> after close {rss['after_close']}"
    )
    per_stream = (
        f"{res['kib_per_open_stream_after_ramp']} after ramp, "
        f"{res['kib_per_open_stream_end_of_hold']} at end of hold"
    )
    finish = (
        f"{done['received_done']} / {done['received_done_and_ended_cleanly']} of "
        f"{done['streams_open_when_written']} open (done -> end p50/p99 "
        f"{done['done_to_end_ms']['p50']}/{done['done_to_end_ms']['p99']} ms)"
    )
    rows = [
        ("streams requested", res["streams_requested"]),
        ("streams opened (HTTP 200)", opened),
        ("open right after the ramp", res["open_after_ramp"]),
        ("healthy at end of hold", f"{res['healthy_at_end_of_hold']}  ({res['healthy_rule']})"),
        ("ended before hold end", ended),
        ("heartbeats total", beats),
        ("server RSS", memory),
        ("KiB per open stream", per_stream),
        ("server threads", res["server_threads"]),
        ("server fds", res["server_fds"]),
        ("server CPU during hold", f"{res['server_cpu_percent_during_hold']}% of one core"),
        ("Redis connected_clients", res["redis_connected_clients"]),
        ("PG backends of the server", res["pg_backends"]),
        ("PG backends server-wide", res["pg_backends_server_wide"]),
        ("done: received / ended", finish),
        ("client loop lag p99/max", f"{lag['p99']}/{lag['max']} ms"),
    ]
    if res["errors"]:
        rows.append(("errors", json.dumps(res["errors"])))
    found = {k: v for k, v in res.get("server_log", {}).items() if k != "sample_lines" and v}
    if found:
        rows.append(("server log", json.dumps(found)))
    for name, value in rows:
        log(f"  {name:<27}{value}")
    for line in res.get("server_log", {}).get("sample_lines", [])[:3]:
        log(f"    | {line[:220]}")
    log(f"  result N={res['streams_requested']}: {'PASS' if res['pass'] else 'MISS'}")


def diagnose(trials: list[dict], env: dict) -> list[str]:
    """Plain-language reasons, from each trial's numbers and the server's log."""
    out: list[str] = []
    for res in trials:
        tag, found = f"N={res['streams_requested']}:", res.get("server_log", {})
        if found.get("redis_timeout") and res["ended_by_server_without_done"]:
            out.append(
                f"{tag} {res['ended_by_server_without_done']} of {res['streams_opened_200']} "
                "opened streams were ended by the server without a done, after "
                f"~{res['lifetime_of_ended_s']['p50']} s ({found['redis_timeout']} x 'Timeout "
                "reading from' Redis in the server's log): core.redis_guard.async_client() sets "
                "socket_timeout=2 s and turnfollow.follow() blocks in XREAD for "
                f"CHAT_SSE_KEEPALIVE_S = {env['keepalive_s']:g} s, so an idle read times out "
                "client-side and follow() returns"
            )
        if found.get("pg_too_many_clients"):
            out.append(
                f"{tag} {found['pg_too_many_clients']} x PostgreSQL 'too many clients' (HTTP 500): "
                "each open stream keeps the DB connection its request opened until the response "
                f"ends (max_connections {env['pg_max_connections']}, server-wide; other clients "
                f"held {res['pg_backends_server_wide']['before']} before the ramp)"
            )
        not_found = sum(v for k, v in res["errors"].items() if "No such turn" in k)
        red_peak = res["redis_connected_clients"]["after_ramp"] or 0
        if not_found and red_peak - 1 >= env["redis_asyncio_pool_max"]:
            out.append(
                f"{tag} {not_found} resumes of live turns got 404 'No such turn' once the server "
                f"held {red_peak - 1} Redis connections = the redis.asyncio pool's max "
                f"({env['redis_asyncio_pool_max']}): every blocked XREAD holds a pooled "
                "connection, so turnlog.exists() gets MaxConnectionsError, which it reads as "
                "'no such log' (and every other Redis call of that process fails too)"
            )
        if found.get("too_many_open_files"):
            out.append(f"{tag} 'Too many open files' in the server (limit {env['rlimit_nofile']})")
        if found.get("redis_max_clients"):
            out.append(f"{tag} Redis refused clients (maxclients {env['redis_maxclients']})")
        held = res["open_after_ramp"]
        growth = []
        for name, key in (
            ("Redis connections", "redis_connected_clients"),
            ("the server's PostgreSQL backends", "pg_backends"),
            ("server threads", "server_threads"),
            ("server fds", "server_fds"),
        ):
            a, b = res[key]["before"], res[key]["after_ramp"]
            if a is not None and b is not None and held:
                growth.append(f"{name} {a} -> {b} ({(b - a) / held:.2f}/stream)")
        if held >= 10 and growth:
            out.append(f"{tag} with {held} streams open after the ramp: " + ", ".join(growth))
    return out


def compare(servers: dict[str, dict], log) -> dict:
    """One row per server: streams held, resume latency p50, memory per stream and per stalled
    client, each with its ratio to the first server's (uvicorn's by default)."""
    rows: dict[str, dict] = {}
    for kind, found in servers.items():
        stall, main = found["stall"], found["main"]
        rows[kind] = {
            "streams_held": found["largest_n_passing"] or 0,
            "resume_p50_ms": found["latency"]["resume_first_token_ms"]["p50"],
            "kib_per_open_stream": main["kib_per_open_stream_end_of_hold"],
            "kib_per_stream_at_stall_peak": stall.get("kib_per_stream_at_peak"),
            "kib_per_stalled_client": stall.get("kib_per_stalled_client"),
        }
    base = next(iter(rows.values()))
    log("")
    log("-- servers compared (ratio: server / " + next(iter(rows)) + ")")
    for kind, row in rows.items():
        cells = []
        for name, value in row.items():
            ref = base[name]
            ratio = f" ({value / ref:.2f}x)" if value is not None and ref else ""
            cells.append(f"{name} {value}{ratio}")
        log(f"  {kind:<13}" + "; ".join(cells))
    return rows


# --------------------------------------------------------------------------------------------


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    os.environ.setdefault("CHAT_ENGINE_CLASS", ENGINE_CLASS)  # never load the model here
    # The sampler queries PostgreSQL from this process's event loop (short, read-only);
    # the server's environment drops this again.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def environment(args, fd_limit: tuple[int, int], rclient) -> dict:
    import redis.asyncio as aioredis
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW max_connections")
        pg_max = int(cur.fetchone()[0])
        cur.execute("SHOW superuser_reserved_connections")
        pg_reserved = int(cur.fetchone()[0])
    return {
        "cpus": os.cpu_count(),
        "rlimit_nofile": list(fd_limit),
        "redis_maxclients": int(rclient.config_get("maxclients").get("maxclients", 0)),
        # What core.redis_guard.async_client() gets: redis.asyncio's pool, 100 connections unless the
        # URL says max_connections=...; every blocked XREAD holds one.
        "redis_asyncio_pool_max": aioredis.ConnectionPool.from_url(
            settings.REDIS_URL
        ).max_connections,
        "pg_max_connections": pg_max,
        "pg_superuser_reserved_connections": pg_reserved,
        "db_conn_max_age": settings.DATABASES["default"].get("CONN_MAX_AGE"),
        "keepalive_s": args.keepalive,
        "engine": ENGINE_NOTE,
    }


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=TARGET_STREAMS, help="concurrent streams N")
    parser.add_argument("--hold", type=float, default=20, help="seconds to hold them")
    parser.add_argument("--turns", type=int, default=50, help="in-flight turns K they spread over")
    parser.add_argument("--batch", type=int, default=100, help="streams opened per ramp step")
    parser.add_argument("--resumes", type=int, default=50, help="sequential resumes timed (M)")
    parser.add_argument(
        "--keepalive", type=float, default=2, help="the server's CHAT_SSE_KEEPALIVE_S"
    )
    parser.add_argument("--no-fallback", action="store_true", help="no smaller N after a miss")
    parser.add_argument(
        "--servers",
        default="uvicorn",
        help=f"ASGI servers measured in turn, comma-separated ({', '.join(SERVERS)})",
    )
    parser.add_argument("--stalled", type=int, default=40, help="stalled clients S")
    parser.add_argument("--readers", type=int, default=40, help="reading clients R beside them")
    parser.add_argument(
        "--stall-deltas",
        type=int,
        default=1000,
        help="deltas of the stalled phase's answer (<= 1023)",
    )
    parser.add_argument("--stall-chars", type=int, default=1000, help="characters per delta")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[str] = []

    def log(msg: str = "") -> None:
        lines.append(msg)
        print(msg, flush=True)

    t_start = now()
    fd_limit = raise_fd_limit()
    setup_django()
    import redis
    from django.conf import settings

    rclient = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    fixture = Fixture(rclient)
    fixture.create_user()
    env = environment(args, fd_limit, rclient)
    log(
        "== stream_bench: resuming turns generated elsewhere (Redis Streams), ONE server process =="
    )
    log(f"engine: {ENGINE_NOTE}")
    log(
        f"CPUs {env['cpus']}; RLIMIT_NOFILE (bench and server) {fd_limit[0]}/{fd_limit[1]}; "
        f"Redis maxclients {env['redis_maxclients']}; redis.asyncio pool max "
        f"{env['redis_asyncio_pool_max']}; PostgreSQL max_connections "
        f"{env['pg_max_connections']}; CONN_MAX_AGE {env['db_conn_max_age']}; "
        f"CHAT_SSE_KEEPALIVE_S={args.keepalive:g}"
    )
    results: dict = {"env": env, "args": vars(args), "trials": [], "servers": {}}
    log_path = OUT_DIR / "stream_bench_server.log"
    with contextlib.suppress(FileNotFoundError):
        log_path.unlink()
    extra_env = stall_env(args.stall_deltas, args.stall_chars)
    servers: list[Server] = []

    def trial(n: int, server: Server) -> dict:
        log("")
        log(
            f"-- capacity ({server.kind}): {n} concurrent resume streams over "
            f"{min(args.turns, n)} turns, {args.batch} per ramp step, hold {args.hold:g} s "
            f"(pid {server.proc.pid})"
        )
        res = asyncio.run(capacity_trial(args, n, fixture, server, log))
        res["server"] = server.kind
        res["server_log"] = server.log_findings()
        print_trial(res, log)
        results["trials"].append(res)
        return res

    def measure(kind: str) -> dict:
        """Every phase on a fresh ``kind`` server; smaller N on fresh ones after a miss."""
        t_server = now()
        server = Server(args.keepalive, log_path, kind, extra_env)
        servers.append(server)
        boot = server.start()
        log("")
        log(f"==== {kind}: pid {server.proc.pid} on {HOST}:{server.port}, ready in {boot:.1f} s")

        # Phase 1: latency.
        turn = fixture.inflight_turn(fixture.conversations(1)[0], LATENCY_EVENTS)
        lat = asyncio.run(latency_phase(server.port, fixture.key, turn, args.resumes))
        r, o = lat["resume_first_token_ms"], lat["openapi_ttfb_ms"]
        log(
            f"-- latency ({kind}): {args.resumes} sequential resumes (Last-Event-ID: 1, 5-event turn)"
        )
        log(f"  resume -> first token      p50 {r['p50']} ms, p99 {r['p99']} ms, max {r['max']} ms")
        log(f"  GET /v1/openapi.json TTFB  p50 {o['p50']} ms, p99 {o['p99']} ms")
        log(f"  ratio (p50 resume/openapi) {lat['ratio_resume_p50_over_openapi_p50']}x")

        # Phase 4 first (the capacity trial's thousands of streams would blur its RSS).
        log("")
        log(f"-- stalled clients ({kind})")
        stall = asyncio.run(run_stall(args, fixture, server, log))
        if "failed" not in stall:
            print_stall(stall, log)

        # Phases 2 and 3 at the requested N, on the same server.
        main_res = trial(args.streams, server)
        log(f"  {kind} stopped: {server.stop()}")

        # Fallback: smaller N, each on a fresh server, to find where it breaks (time-boxed).
        # Free PostgreSQL slots now (the server may be shared with other processes), less a margin.
        others = sample(server, rclient)["pg_backends_all"] or 0
        pg_cap = max(10, env["pg_max_connections"] - others - 10)

        # One pooled Redis connection per open stream, too.
        cap = min(pg_cap, env["redis_asyncio_pool_max"] - 10)

        def next_tries(res: dict, n: int) -> list[int]:
            found = res["server_log"]
            pool_full = any("No such turn" in k for k in res["errors"])
            if (found.get("pg_too_many_clients") or pool_full) and n > cap:
                return [cap]  # one PostgreSQL and one Redis connection per open stream
            if found.get("redis_timeout") and res["ended_by_server_without_done"]:
                return [50] if n > 50 else []  # streams die at any N: show it at a small one
            return [c for c in (n // 4, n // 2) if c >= 10]

        largest_ok = args.streams if main_res["pass"] else None
        queue = [] if main_res["pass"] or args.no_fallback else next_tries(main_res, args.streams)
        while queue and now() - t_server < FALLBACK_BUDGET_S:
            n = queue.pop(0)
            fallback = Server(args.keepalive, log_path, kind, extra_env)
            servers.append(fallback)
            fallback.start()
            res = trial(n, fallback)
            log(f"  {kind} stopped: {fallback.stop()}")
            if res["pass"]:
                largest_ok = max(largest_ok or 0, n)
            else:
                queue = sorted({c for c in next_tries(res, n) + queue if c < n})
        return {"latency": lat, "stall": stall, "main": main_res, "largest_n_passing": largest_ok}

    try:
        for kind in args.servers.split(","):
            results["servers"][kind] = measure(kind)
        first = results["servers"][args.servers.split(",")[0]]
        results["latency"] = first["latency"]  # inference/capacity.py and older readers
        results["largest_n_passing"] = first["largest_n_passing"]
        main_res = first["main"]

        results["diagnosis"] = diagnose(results["trials"], env)
        log("")
        log("-- diagnosis")
        for line in results["diagnosis"] or ["(nothing abnormal found)"]:
            log(f"  - {line}")
        results["comparison"] = compare(results["servers"], log)
        verdict = "PASS" if main_res["pass"] and args.streams >= TARGET_STREAMS else "MISS"
        results["target"] = {"streams": TARGET_STREAMS, "verdict": verdict}
        log("")
        largest = results["largest_n_passing"]
        tail = "" if main_res["pass"] else f"  (largest N that passed: {largest or 'none'})"
        log(f">= {TARGET_STREAMS} concurrent streams held ({args.servers.split(',')[0]}): "
            f"{verdict}{tail}")  # fmt: skip
    finally:
        stopped = "; ".join(f"{x.kind} {x.stop()}" for x in servers)
        fixture.cleanup()
        results["wall_s"] = rnd(now() - t_start)
        log(
            f"(servers: {stopped}; bench Redis keys and user removed; wall {results['wall_s']} s; "
            f"results: {OUT_DIR / 'stream_bench.json'})"
        )
        results["output"] = lines
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        (OUT_DIR / "stream_bench.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
