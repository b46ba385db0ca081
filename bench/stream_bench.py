"""Resume-stream benchmark: latency and capacity of the real resume endpoint
``GET /v1/conversations/{id}/turns/{turn_id}/events`` on ONE daphne process, for turns generated
by *another* process (so every stream is read back from the turn's Redis Stream).

Run through the dev stack (it provides PostgreSQL and Redis)::

    python -m chatsite.devstack exec -- python -m bench.stream_bench [--streams 2000] [--hold 20]

Setup (in this process): ``django.setup()``, migrate, one user + API key, K conversations, and
K in-flight turns "generated elsewhere": for each, what ``conversations.turnlog.TurnLogWriter``
writes (``chat:a:{answer_id}:conversation`` and ``token`` entries ``0-1``, ``0-2``, ... in
``chat:turn:{answer_id}``) and no final ``done``, so the turn looks still generating.

The server is ``python -m chatsite.serve chatsite.asgi:application`` (daphne with flow control) with ``CHAT_SSE_KEEPALIVE_S`` =
``--keepalive`` (2) and ``CHAT_ENGINE_CLASS=tests.fakes.ScriptedEngine``: no model is loaded and
the engine is never asked for anything; every byte of these streams comes from Redis.

1. Latency: M sequential resumes (``Last-Event-ID: 1`` on a 5-event turn), request sent -> first
   replayed ``event: token`` line; baseline: time to first byte of ``GET /v1/openapi.json``.
2. Capacity: N concurrent resume streams over the K turns (raw asyncio sockets, ramped in
   batches), held ``--hold`` s. Healthy: HTTP 200, still open when the hold ends, no error, and
   at least ``hold / keepalive / 2`` keep-alive comments during the hold. Daphne's RSS, threads
   and fds, Redis ``connected_clients`` and PostgreSQL backends are sampled along the way.
3. End: one ``done`` event per turn; every held stream should deliver it and end cleanly.

If the requested N misses, smaller N are tried, each on a fresh daphne (``--no-fallback``: don't).
Results: stdout and ``var/bench/stream_bench.json``; daphne's log:
``var/bench/stream_bench_daphne.log``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
OUT_DIR = VAR / "bench"
HOST = "127.0.0.1"
ENGINE_CLASS = "tests.fakes.ScriptedEngine"
ENGINE_NOTE = f"{ENGINE_CLASS} (not involved: these streams are read from Redis only)"
TARGET_STREAMS = 2000
PRE_EVENTS = 3  # token events in each capacity turn before its streams open
LATENCY_EVENTS = 5  # token events of the latency turn (resumed from Last-Event-ID: 1)
HEAD_TIMEOUT_S = 30.0  # per stream: connect + response head
RAMP_LIMIT_S = 90.0
FALLBACK_BUDGET_S = 150.0  # no further fallback trial starts after this much wall time

now = time.monotonic


# --------------------------------------------------------------------------------------------
# Small helpers


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))]


def rnd(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def dist(values: list[float], scale: float = 1.0, digits: int = 1) -> dict:
    """p50 / p99 / max of ``values`` times ``scale``."""
    scaled = [v * scale for v in values]
    return {
        "p50": rnd(pct(scaled, 50), digits),
        "p99": rnd(pct(scaled, 99), digits),
        "max": rnd(max(scaled), digits) if scaled else None,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def raise_fd_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (thousands of sockets here and in daphne)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# --------------------------------------------------------------------------------------------
# Setup: Django objects, and Redis turn logs exactly as TurnLogWriter writes them


class Fixture:
    def __init__(self, redis_client):
        from django.conf import settings

        self.settings = settings
        self.redis = redis_client
        self.user = None
        self.key = ""
        self.redis_keys: list[str] = []

    def create_user(self) -> None:
        from django.contrib.auth import get_user_model

        from accounts.services import api_key_create

        username = f"stream-bench-{uuid.uuid4().hex[:10]}"
        self.user = get_user_model().objects.create_user(username=username)
        self.key = api_key_create(user=self.user, name="stream-bench").raw

    def conversations(self, count: int) -> list[str]:
        from conversations.services import conversation_create

        return [str(conversation_create(owner=self.user).conversation_id) for _ in range(count)]

    def inflight_turn(self, conversation_id: str, events: int) -> dict:
        """A turn generated "elsewhere": its owner key and ``events`` token entries, no done."""
        from conversations import turnlog

        answer_id = str(uuid.uuid4())
        ttl = int(self.settings.CHAT_STREAM_TTL_S)
        skey, okey = turnlog.stream_key(answer_id), turnlog.owner_key(answer_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(okey, conversation_id, ex=ttl)
        for i in range(1, events + 1):
            data = json.dumps({"text": f"tok{i} "}, ensure_ascii=False)
            pipe.xadd(skey, {"e": "token", "d": data}, id=f"0-{i}")
        pipe.expire(skey, ttl)
        pipe.execute()
        self.redis_keys += [skey, okey]
        return {"conversation_id": conversation_id, "answer_id": answer_id, "last_id": events}

    def finish_turns(self, turns: list[dict]) -> None:
        """Write each turn's final ``done`` (id last+1), as the generating process would."""
        from conversations import turnlog

        pipe = self.redis.pipeline(transaction=False)
        for t in turns:
            done = {
                "turn_id": t["answer_id"],
                "status": "complete",
                "usage": {"prompt_tokens": 10, "completion_tokens": t["last_id"]},
                "html": "<p>bench</p>",
            }
            entry = {"e": "done", "d": json.dumps(done)}
            pipe.xadd(turnlog.stream_key(t["answer_id"]), entry, id=f"0-{t['last_id'] + 1}")
        pipe.execute()

    def cleanup(self) -> None:
        for i in range(0, len(self.redis_keys), 500):
            with contextlib.suppress(Exception):
                self.redis.delete(*self.redis_keys[i : i + 500])
        if self.user is not None:
            with contextlib.suppress(Exception):
                self.user.delete()  # cascades to its API keys and conversations


# --------------------------------------------------------------------------------------------
# The server under test

LOG_PATTERNS = {
    "cannot_resume_from_redis": r"cannot resume turn",
    "redis_timeout": r"Timeout reading from",
    "tracebacks": r"Traceback \(most recent call last\)",
    "pg_too_many_clients": r"too many clients|remaining connection slots",
    "too_many_open_files": r"Too many open files",
    "redis_max_clients": r"max number of clients",
}


class Daphne:
    def __init__(self, keepalive_s: float, log_path: Path):
        self.port = free_port()
        self.keepalive_s = keepalive_s
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0
        self.app_name = f"stream-bench-daphne-{self.port}"

    def start(self) -> float:
        """Start daphne; return the seconds until ``/v1/openapi.json`` answered 200."""
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        env.update(
            CHAT_SSE_KEEPALIVE_S=str(self.keepalive_s),
            CHAT_ENGINE_CLASS=ENGINE_CLASS,
            DJANGO_SETTINGS_MODULE="chatsite.settings.base",
            PYTHONUNBUFFERED="1",
            PGAPPNAME=self.app_name,  # libpq: tells this daphne's PostgreSQL backends apart
            # Thousands of streams from one bench user: no RPM / TPM limits, no shedding.
            CHAT_RATE_LIMITS_BY_TIER='{"free": {"rpm": null, "tpm": null}}',
            CHAT_SHED_FREE_WAITING="100000",
            # The scripted engine has no batch limit: admit every stream at once.
            CHAT_MAX_NUM_SEQS="100000",
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== daphne on port {self.port} =====\n".encode())
            log.flush()
            t0 = now()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chatsite.serve", "-b", HOST, "-p", str(self.port),
                 "chatsite.asgi:application"],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # inherits the raised RLIMIT_NOFILE
            )  # fmt: skip
        url = f"http://{HOST}:{self.port}/v1/openapi.json"
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return now() - t0
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited ({self.proc.returncode}); see {self.log_path}")
            if now() - t0 > 90:
                raise RuntimeError(f"daphne not ready in 90 s; see {self.log_path}")
            time.sleep(0.2)

    def stop(self) -> str:
        """SIGTERM its process group, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return "not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
            return f"SIGTERM, exit {self.proc.returncode}"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return "SIGKILL after 10 s"

    def log_findings(self) -> dict:
        """Counts of telling lines in this daphne's part of the log, and a few samples."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return {}
        found: dict = {name: len(re.findall(p, text)) for name, p in LOG_PATTERNS.items()}
        samples = [ln for ln in text.splitlines() if "WARNING" in ln or "Error:" in ln]
        found["sample_lines"] = [ln[:300] for ln in dict.fromkeys(samples)][:4]
        return found


# --------------------------------------------------------------------------------------------
# Sampling: the daphne process, Redis, PostgreSQL


def sample(daphne: Daphne, redis_client) -> dict:
    import psutil
    from django.db import connection

    out: dict = {"t": now()}
    try:
        p = psutil.Process(daphne.proc.pid)
        cpu = p.cpu_times()
        out.update(
            rss_kib=p.memory_info().rss // 1024,
            threads=p.num_threads(),
            fds=p.num_fds(),
            cpu_s=cpu.user + cpu.system,
        )
    except (psutil.Error, AttributeError):
        out.update(rss_kib=None, threads=None, fds=None, cpu_s=None)
    try:
        info = redis_client.info("clients")
        out.update(redis_clients=info["connected_clients"], redis_blocked=info["blocked_clients"])
    except Exception:  # noqa: BLE001
        out.update(redis_clients=None, redis_blocked=None)
    try:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FILTER (WHERE application_name = %s),"
                " count(*) FILTER (WHERE backend_type = 'client backend')"
                " FROM pg_stat_activity",
                [daphne.app_name],
            )
            out["pg_backends"], out["pg_backends_all"] = cur.fetchone()
    except Exception:  # noqa: BLE001
        out["pg_backends"] = out["pg_backends_all"] = None
    return out


def mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


# --------------------------------------------------------------------------------------------
# The client: raw HTTP/1.1 over asyncio sockets (lighter than an HTTP library for thousands)


class Stream:
    __slots__ = (
        "clean_end", "error", "events", "got_done", "headers_evt", "idx",
        "keepalives", "status", "t_end", "t_headers", "t_send", "turn",
    )  # fmt: skip

    def __init__(self, idx: int, turn: dict):
        self.idx, self.turn = idx, turn
        self.status: int | None = None
        self.error: str | None = None
        self.t_send: float | None = None
        self.t_headers: float | None = None
        self.t_end: float | None = None
        self.keepalives: list[float] = []
        self.events: list[tuple[int | None, str]] = []
        self.got_done = False
        self.clean_end = False  # the server ended the chunked body (terminating chunk)
        self.headers_evt = asyncio.Event()

    def is_open(self) -> bool:
        return self.status == 200 and self.t_end is None


def events_path(turn: dict) -> str:
    return f"/v1/conversations/{turn['conversation_id']}/turns/{turn['answer_id']}/events"


def request_bytes(path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed before the status line")
    code = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed inside the response head")
        if line in (b"\r\n", b"\n"):
            return code, headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def body_chunks(reader: asyncio.StreamReader, chunked: bool, stream: Stream):
    """Yield the body's bytes; mark ``stream.clean_end`` when the server ends the body."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        stream.clean_end = True
        return
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed mid-body (no terminating chunk)")
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.readline(), 1)
            stream.clean_end = True
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


def error_text(code: int, body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    title = re.search(r"<title>(.*?)</title>", text, re.DOTALL)
    return f"HTTP {code}: " + (title.group(1).strip() if title else " ".join(text.split())[:100])


async def run_stream(s: Stream, port: int, key: str) -> None:
    """One resume stream, from ``Last-Event-ID: <last written>``, until the server ends it."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Accept": "text/event-stream",
        "Last-Event-ID": str(s.turn["last_id"]),
    }
    writer = None
    try:
        s.t_send = now()
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), HEAD_TIMEOUT_S)
        writer.write(request_bytes(events_path(s.turn), port, headers))
        await writer.drain()
        code, head = await asyncio.wait_for(read_head(reader), HEAD_TIMEOUT_S)
        s.status, s.t_headers = code, now()
        s.headers_evt.set()
        if code != 200:
            body = b""
            with contextlib.suppress(Exception):
                body = await asyncio.wait_for(reader.read(400), 2)
            s.error = error_text(code, body)
            return
        chunked = "chunked" in head.get("transfer-encoding", "").lower()
        buf, event, event_id = b"", None, None
        async for data in body_chunks(reader, chunked, s):
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.startswith(b":"):
                    if b"keep-alive" in line:
                        s.keepalives.append(now())
                elif line.startswith(b"id:"):
                    event_id = int(line[3:].strip())
                elif line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    s.events.append((event_id, event or "message"))
                    s.got_done = s.got_done or event == "done"
                    event, event_id = None, None
    except TimeoutError:
        s.error = "timeout waiting for the response head" if s.status is None else "timeout"
    except Exception as exc:  # noqa: BLE001
        s.error = f"{type(exc).__name__}: {exc}"[:160]
    finally:
        s.t_end = now()
        s.headers_evt.set()
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)


# --------------------------------------------------------------------------------------------
# Phase 1: resume latency vs a plain JSON view


async def time_openapi(port: int) -> float:
    """Request sent -> first byte of ``GET /v1/openapi.json`` (the whole body is then read)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        t0 = now()
        writer.write(request_bytes("/v1/openapi.json", port, {"Connection": "close"}))
        await writer.drain()
        first = await asyncio.wait_for(reader.read(1), 10)
        ttfb = now() - t0
        if not first.startswith(b"H"):
            raise ConnectionError("openapi: no response")
        while await reader.read(65536):
            pass
        return ttfb
    finally:
        writer.close()


async def time_resume(port: int, key: str, turn: dict) -> float:
    """Request sent (``Last-Event-ID: 1``) -> the first replayed ``event: token`` line."""
    reader, writer = await asyncio.open_connection(HOST, port)
    headers = {"Authorization": f"Bearer {key}", "Last-Event-ID": "1"}

    async def first_token(t0: float) -> float:
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"resume answered {status.decode().strip()!r}")
        while line := await reader.readline():
            if line.startswith(b"event: token"):
                return now() - t0
        raise ConnectionError("resume: closed before the first token")

    try:
        t0 = now()
        writer.write(request_bytes(events_path(turn), port, headers))
        await writer.drain()
        return await asyncio.wait_for(first_token(t0), 10)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1)


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


async def capacity_trial(args, n: int, fixture: Fixture, daphne: Daphne, log) -> dict:
    k = min(args.turns, n)
    turns = [fixture.inflight_turn(c, PRE_EVENTS) for c in fixture.conversations(k)]
    streams = [Stream(i, turns[i % k]) for i in range(n)]
    need = args.hold / args.keepalive / 2
    stop_probe, lags = asyncio.Event(), []
    probe = asyncio.create_task(loop_lag_probe(stop_probe, lags))

    before = sample(daphne, fixture.redis)
    log(snapshot_line(f"  [N={n}] before:", before))
    rmp = await ramp(streams, args.batch, daphne.port, fixture.key, log)
    tasks = rmp["tasks"]
    ramped = [s for s in streams if s.t_send is not None]
    after_ramp = sample(daphne, fixture.redis)
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
        end_hold = sample(daphne, fixture.redis)
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
    final = sample(daphne, fixture.redis)

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
            "p50": pct(per_stream, 50),
            "max": max(per_stream, default=None),
        },
        "heartbeat_gap_s": dist(gaps, 1, 2),
        "rss_mib": {key: mib(v) for key, v in series("rss_kib").items()},
        "kib_per_open_stream_after_ramp": kib_per_open_stream(after_ramp),
        "kib_per_open_stream_end_of_hold": kib_per_open_stream(end_hold),
        "daphne_threads": series("threads"),
        "daphne_fds": series("fds"),
        "daphne_cpu_percent_during_hold": cpu,
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
        ("daphne RSS", memory),
        ("KiB per open stream", per_stream),
        ("daphne threads", res["daphne_threads"]),
        ("daphne fds", res["daphne_fds"]),
        ("daphne CPU during hold", f"{res['daphne_cpu_percent_during_hold']}% of one core"),
        ("Redis connected_clients", res["redis_connected_clients"]),
        ("PG backends of daphne", res["pg_backends"]),
        ("PG backends server-wide", res["pg_backends_server_wide"]),
        ("done: received / ended", finish),
        ("client loop lag p99/max", f"{lag['p99']}/{lag['max']} ms"),
    ]
    if res["errors"]:
        rows.append(("errors", json.dumps(res["errors"])))
    found = {k: v for k, v in res.get("daphne_log", {}).items() if k != "sample_lines" and v}
    if found:
        rows.append(("daphne log", json.dumps(found)))
    for name, value in rows:
        log(f"  {name:<27}{value}")
    for line in res.get("daphne_log", {}).get("sample_lines", [])[:3]:
        log(f"    | {line[:220]}")
    log(f"  result N={res['streams_requested']}: {'PASS' if res['pass'] else 'MISS'}")


def diagnose(trials: list[dict], env: dict) -> list[str]:
    """Plain-language reasons, from each trial's numbers and daphne's log."""
    out: list[str] = []
    for res in trials:
        tag, found = f"N={res['streams_requested']}:", res.get("daphne_log", {})
        if found.get("redis_timeout") and res["ended_by_server_without_done"]:
            out.append(
                f"{tag} {res['ended_by_server_without_done']} of {res['streams_opened_200']} "
                "opened streams were ended by the server without a done, after "
                f"~{res['lifetime_of_ended_s']['p50']} s ({found['redis_timeout']} x 'Timeout "
                "reading from' Redis in daphne's log): turnlog.redis_client() sets "
                "socket_timeout=2 s and turnlog.follow() blocks in XREAD for "
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
                f"{tag} {not_found} resumes of live turns got 404 'No such turn' once daphne "
                f"held {red_peak - 1} Redis connections = the redis.asyncio pool's max "
                f"({env['redis_asyncio_pool_max']}): every blocked XREAD holds a pooled "
                "connection, so turnlog.exists() gets MaxConnectionsError, which it reads as "
                "'no such log' (and every other Redis call of that process fails too)"
            )
        if found.get("too_many_open_files"):
            out.append(f"{tag} 'Too many open files' in daphne (limit {env['rlimit_nofile']})")
        if found.get("redis_max_clients"):
            out.append(f"{tag} Redis refused clients (maxclients {env['redis_maxclients']})")
        held = res["open_after_ramp"]
        growth = []
        for name, key in (
            ("Redis connections", "redis_connected_clients"),
            ("daphne's PostgreSQL backends", "pg_backends"),
            ("daphne threads", "daphne_threads"),
            ("daphne fds", "daphne_fds"),
        ):
            a, b = res[key]["before"], res[key]["after_ramp"]
            if a is not None and b is not None and held:
                growth.append(f"{name} {a} -> {b} ({(b - a) / held:.2f}/stream)")
        if held >= 10 and growth:
            out.append(f"{tag} with {held} streams open after the ramp: " + ", ".join(growth))
    return out


# --------------------------------------------------------------------------------------------


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    os.environ.setdefault("CHAT_ENGINE_CLASS", ENGINE_CLASS)  # never load the model here
    # The sampler queries PostgreSQL from this process's event loop (short, read-only);
    # daphne's environment drops this again.
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
        # What turnlog.redis_client() gets: redis.asyncio's pool, 100 connections unless the
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
    parser.add_argument("--keepalive", type=float, default=2, help="daphne's CHAT_SSE_KEEPALIVE_S")
    parser.add_argument("--no-fallback", action="store_true", help="no smaller N after a miss")
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
    log("== stream_bench: resuming turns generated elsewhere (Redis Streams), ONE daphne ==")
    log(f"engine: {ENGINE_NOTE}")
    log(
        f"CPUs {env['cpus']}; RLIMIT_NOFILE (bench and daphne) {fd_limit[0]}/{fd_limit[1]}; "
        f"Redis maxclients {env['redis_maxclients']}; redis.asyncio pool max "
        f"{env['redis_asyncio_pool_max']}; PostgreSQL max_connections "
        f"{env['pg_max_connections']}; CONN_MAX_AGE {env['db_conn_max_age']}; "
        f"CHAT_SSE_KEEPALIVE_S={args.keepalive:g}"
    )
    results: dict = {"env": env, "args": vars(args), "trials": []}
    log_path = OUT_DIR / "stream_bench_daphne.log"
    with contextlib.suppress(FileNotFoundError):
        log_path.unlink()
    daphne = Daphne(args.keepalive, log_path)

    def trial(n: int, server: Daphne) -> dict:
        log("")
        log(
            f"-- capacity: {n} concurrent resume streams over {min(args.turns, n)} turns, "
            f"{args.batch} per ramp step, hold {args.hold:g} s (daphne pid {server.proc.pid})"
        )
        res = asyncio.run(capacity_trial(args, n, fixture, server, log))
        res["daphne_log"] = server.log_findings()
        print_trial(res, log)
        results["trials"].append(res)
        return res

    try:
        boot = daphne.start()
        log(f"daphne pid {daphne.proc.pid} on {HOST}:{daphne.port}, ready in {boot:.1f} s")

        # Phase 1: latency.
        turn = fixture.inflight_turn(fixture.conversations(1)[0], LATENCY_EVENTS)
        lat = asyncio.run(latency_phase(daphne.port, fixture.key, turn, args.resumes))
        results["latency"] = lat
        r, o = lat["resume_first_token_ms"], lat["openapi_ttfb_ms"]
        log("")
        log(f"-- latency: {args.resumes} sequential resumes (Last-Event-ID: 1, 5-event turn)")
        log(f"  resume -> first token      p50 {r['p50']} ms, p99 {r['p99']} ms, max {r['max']} ms")
        log(f"  GET /v1/openapi.json TTFB  p50 {o['p50']} ms, p99 {o['p99']} ms")
        log(f"  ratio (p50 resume/openapi) {lat['ratio_resume_p50_over_openapi_p50']}x")

        # Phases 2 and 3 at the requested N, on the same daphne.
        main_res = trial(args.streams, daphne)
        log(f"  daphne stopped: {daphne.stop()}")

        # Fallback: smaller N, each on a fresh daphne, to find where it breaks (time-boxed).
        # Free PostgreSQL slots now (the server may be shared with other processes), less a margin.
        others = sample(daphne, rclient)["pg_backends_all"] or 0
        pg_cap = max(10, env["pg_max_connections"] - others - 10)

        # One pooled Redis connection per open stream, too.
        cap = min(pg_cap, env["redis_asyncio_pool_max"] - 10)

        def next_tries(res: dict, n: int) -> list[int]:
            found = res["daphne_log"]
            pool_full = any("No such turn" in k for k in res["errors"])
            if (found.get("pg_too_many_clients") or pool_full) and n > cap:
                return [cap]  # one PostgreSQL and one Redis connection per open stream
            if found.get("redis_timeout") and res["ended_by_server_without_done"]:
                return [50] if n > 50 else []  # streams die at any N: show it at a small one
            return [c for c in (n // 4, n // 2) if c >= 10]

        largest_ok = args.streams if main_res["pass"] else None
        queue = [] if main_res["pass"] or args.no_fallback else next_tries(main_res, args.streams)
        while queue and now() - t_start < FALLBACK_BUDGET_S:
            n = queue.pop(0)
            server = Daphne(args.keepalive, log_path)
            server.start()
            res = trial(n, server)
            log(f"  daphne stopped: {server.stop()}")
            if res["pass"]:
                largest_ok = max(largest_ok or 0, n)
            else:
                queue = sorted({c for c in next_tries(res, n) + queue if c < n})
        results["largest_n_passing"] = largest_ok

        results["diagnosis"] = diagnose(results["trials"], env)
        log("")
        log("-- diagnosis")
        for line in results["diagnosis"] or ["(nothing abnormal found)"]:
            log(f"  - {line}")
        verdict = "PASS" if main_res["pass"] and args.streams >= TARGET_STREAMS else "MISS"
        results["target"] = {"streams": TARGET_STREAMS, "verdict": verdict}
        log("")
        tail = "" if main_res["pass"] else f"  (largest N that passed: {largest_ok or 'none'})"
        log(f">= {TARGET_STREAMS} concurrent streams held: {verdict}{tail}")
    finally:
        stopped = daphne.stop()
        fixture.cleanup()
        results["wall_s"] = rnd(now() - t_start)
        log(
            f"(daphne: {stopped}; bench Redis keys and user removed; wall {results['wall_s']} s; "
            f"results: {OUT_DIR / 'stream_bench.json'})"
        )
        results["output"] = lines
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        (OUT_DIR / "stream_bench.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
