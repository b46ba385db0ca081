"""bench/stream_bench.py's phases: 1, resume latency against a plain JSON view; 2 and 3, N
concurrent resume streams ramped up, held, then ended by one ``done`` per turn."""

from __future__ import annotations

import asyncio
import itertools
import re
import statistics
import time

from bench.harness import percentile
from bench.stream_client import HEAD_TIMEOUT_S, Stream, run_stream, time_openapi, time_resume
from bench.stream_setup import Fixture, Server, mib, sample

PRE_EVENTS = 3  # token events in each capacity turn before its streams open
RAMP_LIMIT_S = 90.0

now = time.monotonic


def rnd(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def dist(values: list[float], scale: float = 1.0, digits: int = 1) -> dict:
    """p50 / p99 / max of ``values`` times ``scale``."""
    scaled = [v * scale for v in values]
    return {
        "p50": rnd(percentile(scaled, 50, default=None), digits),
        "p99": rnd(percentile(scaled, 99, default=None), digits),
        "max": rnd(max(scaled), digits) if scaled else None,
    }


async def latency_phase(port: int, key: str, turn: dict, m: int) -> dict:
    for _ in range(5):  # warm-up: lazy imports, URL resolver, first connections
        await time_resume(port, key, turn)
        await time_openapi(port)
    resumes = [await time_resume(port, key, turn) for _ in range(m)]
    openapi = [await time_openapi(port) for _ in range(m)]
    med_r, med_o = statistics.median(resumes), statistics.median(openapi)
    return {
        "resumes": m,
        "resume_first_token_ms": dist(resumes, 1000, 2),
        "openapi_ttfb_ms": dist(openapi, 1000, 2),
        "ratio_resume_p50_over_openapi_p50": rnd(med_r / med_o, 2) if med_o else None,
    }


# --------------------------------------------------------------------------------------------
# Phases 2 and 3: capacity, hold, done


async def loop_lag_probe(stop: asyncio.Event, out: list[float]) -> None:
    """This (client) process's event-loop lag, to tell client from server saturation."""
    while not stop.is_set():
        t0 = now()
        await asyncio.sleep(0.1)
        out.append(now() - t0 - 0.1)


def snapshot_line(tag: str, smp: dict) -> str:
    return (
        f"{tag} RSS {mib(smp['rss_kib'])} MiB, threads {smp['threads']}, fds {smp['fds']}, "
        f"Redis clients {smp['redis_clients']} (blocked {smp['redis_blocked']}), "
        f"PG backends {smp['pg_backends']} (server-wide {smp['pg_backends_all']})"
    )


async def ramp(streams: list[Stream], batch: int, port: int, key: str, log) -> dict:
    """Open the streams ``batch`` at a time, each batch once the previous one has its heads."""
    n = len(streams)
    tasks, first_failure, aborted = [], None, None
    t0 = now()
    for start in range(0, n, batch):
        chunk = streams[start : start + batch]
        tasks += [asyncio.create_task(run_stream(s, port, key)) for s in chunk]
        t_b = now()
        waits = [asyncio.create_task(s.headers_evt.wait()) for s in chunk]
        await asyncio.wait(waits, timeout=HEAD_TIMEOUT_S + 5)
        bad = [s for s in chunk if s.status != 200 or s.error]
        if bad and first_failure is None:
            first_failure = {
                "stream_index": bad[0].idx,
                "error": bad[0].error or f"HTTP {bad[0].status}",
            }
        done_so_far = start + len(chunk)
        if bad or (start // batch) % 5 == 4 or done_so_far >= n:
            open_now = sum(s.is_open() for s in streams[:done_so_far])
            log(
                f"  [N={n}] ramp {done_so_far:5d}/{n}: batch {1000 * (now() - t_b):6.0f} ms, "
                f"open {open_now}, failed in batch {len(bad)}"
                + (f" ({bad[0].error})" if bad else "")
            )
        if now() - t0 > RAMP_LIMIT_S:
            aborted = f"ramp over {RAMP_LIMIT_S:g} s; stopped after {done_so_far} streams"
            log(f"  [N={n}] {aborted}")
            break
    return {
        "tasks": tasks,
        "seconds": now() - t0,
        "first_failure": first_failure,
        "aborted": aborted,
    }


async def capacity_trial(args, n: int, fixture: Fixture, server: Server, log) -> dict:
    k = min(args.turns, n)
    turns = [fixture.inflight_turn(c, PRE_EVENTS) for c in fixture.conversations(k)]
    streams = [Stream(i, turns[i % k]) for i in range(n)]
    need = args.hold / args.keepalive / 2
    stop_probe, lags = asyncio.Event(), []
    probe = asyncio.create_task(loop_lag_probe(stop_probe, lags))

    before = sample(server, fixture.redis)
    log(snapshot_line(f"  [N={n}] before:", before))
    rmp = await ramp(streams, args.batch, server.port, fixture.key, log)
    tasks = rmp["tasks"]
    ramped = [s for s in streams if s.t_send is not None]
    after_ramp = sample(server, fixture.redis)
    open_after_ramp = after_ramp["open"] = sum(s.is_open() for s in ramped)
    log(
        snapshot_line(
            f"  [N={n}] ramp done in {rmp['seconds']:.1f} s, {open_after_ramp} open;", after_ramp
        )
    )

    hold_start = now()
    end_hold = after_ramp
    while now() - hold_start < args.hold:
        await asyncio.sleep(min(5.0, args.hold - (now() - hold_start)))
        end_hold = sample(server, fixture.redis)
        open_now = end_hold["open"] = sum(s.is_open() for s in ramped)
        log(
            snapshot_line(f"  [N={n}] hold {now() - hold_start:4.1f} s, {open_now} open;", end_hold)
        )
    hold_end = now()

    # Verdicts at the end of the hold.
    opened = [s for s in ramped if s.status == 200]
    healthy, per_stream, gaps = [], [], []
    for s in opened:
        ka = [t for t in s.keepalives if hold_start <= t <= hold_end]
        per_stream.append(len(ka))
        gaps += [b - a for a, b in itertools.pairwise(ka)]
        alive = s.t_end is None or s.t_end > hold_end
        if alive and s.error is None and len(ka) >= need:
            healthy.append(s)
    ended = [s for s in opened if s.t_end is not None and s.t_end <= hold_end]
    ended_no_done = [s for s in ended if s.clean_end and not s.got_done and s.error is None]
    errors: dict[str, int] = {}
    for s in ramped:
        if s.error:
            reason = re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<id>", s.error)
            errors[reason] = errors.get(reason, 0) + 1

    # End: a done event per turn; every held stream should deliver it and end.
    still_open = [s for s in opened if s.t_end is None]
    t_done = now()
    fixture.finish_turns(turns)
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(10.0, 3 * args.keepalive))
    got_done = [s for s in still_open if s.got_done]
    done_clean = [s for s in got_done if s.clean_end]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stop_probe.set()
    await probe
    final = sample(server, fixture.redis)

    def series(key: str) -> dict:
        return {
            "before": before[key],
            "after_ramp": after_ramp[key],
            "end_of_hold": end_hold[key],
            "after_close": final[key],
        }

    def kib_per_open_stream(smp: dict) -> float | None:
        """RSS growth since ``before`` over the streams open when ``smp`` was taken."""
        if not smp.get("open") or smp["rss_kib"] is None or before["rss_kib"] is None:
            return None
        return rnd((smp["rss_kib"] - before["rss_kib"]) / smp["open"])

    cpu = None
    if (
        end_hold["cpu_s"] is not None
        and after_ramp["cpu_s"] is not None
        and end_hold is not after_ramp
    ):
        cpu = rnd(
            100 * (end_hold["cpu_s"] - after_ramp["cpu_s"]) / (end_hold["t"] - after_ramp["t"])
        )
    healthy_ok = len(healthy) == n
    return {
        "streams_requested": n,
        "turns": k,
        "streams_attempted": len(ramped),
        "streams_opened_200": len(opened),
        "open_after_ramp": open_after_ramp,
        "healthy_at_end_of_hold": len(healthy),
        "healthy_rule": (
            f"HTTP 200, open when the hold ends, no error, >= {need:.3g} keep-alives "
            f"in the {args.hold:g} s hold"
        ),
        "ended_before_hold_end": len(ended),
        "ended_by_server_without_done": len(ended_no_done),
        "lifetime_of_ended_s": dist([s.t_end - s.t_headers for s in ended if s.t_headers], 1, 2),
        "errors": errors,
        "first_failure": rmp["first_failure"],
        "ramp_s": rnd(rmp["seconds"], 2),
        "ramp_aborted": rmp["aborted"],
        "time_to_200_ms": dist([s.t_headers - s.t_send for s in opened if s.t_headers], 1000),
        "heartbeats_total_in_hold": sum(per_stream),
        "heartbeats_total": sum(len(s.keepalives) for s in opened),
        "heartbeats_per_stream_in_hold": {
            "min": min(per_stream, default=None),
            "p50": percentile(per_stream, 50, default=None),
            "max": max(per_stream, default=None),
        },
        "heartbeat_gap_s": dist(gaps, 1, 2),
        "rss_mib": {key: mib(v) for key, v in series("rss_kib").items()},
        "kib_per_open_stream_after_ramp": kib_per_open_stream(after_ramp),
        "kib_per_open_stream_end_of_hold": kib_per_open_stream(end_hold),
        "server_threads": series("threads"),
        "server_fds": series("fds"),
        "server_cpu_percent_during_hold": cpu,
        "redis_connected_clients": series("redis_clients"),
        "redis_blocked_clients": series("redis_blocked"),
        "pg_backends": series("pg_backends"),
        "pg_backends_server_wide": series("pg_backends_all"),
        "client_loop_lag_ms": dist(lags, 1000),
        "done": {
            "streams_open_when_written": len(still_open),
            "received_done": len(got_done),
            "received_done_and_ended_cleanly": len(done_clean),
            "done_to_end_ms": dist([s.t_end - t_done for s in done_clean], 1000),
        },
        "pass": healthy_ok and len(done_clean) == n,
    }
