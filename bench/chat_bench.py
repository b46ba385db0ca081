"""Chat throughput/latency: the bare vLLM engine vs the full stack (daphne + Django + SSE).

Run through the dev stack (it provides PostgreSQL and Redis)::

    make bench                       # = python -m chatsite.devstack exec -- python -m bench.chat_bench
    make bench BENCH_ARGS="--reps 1 --concurrency 1,8"

Phase 1 ("bare") drives :class:`inference.engine.VllmEngine` in this process: N concurrent chats,
each the product's system prompt + one user prompt from a fixed list, greedy, 128 tokens.
The engine is shut down before phase 2.

Phase 2 ("full") starts the real server (``daphne chatsite.asgi:application``) as a subprocess
with greedy, 128-token settings, signs up one user per concurrent chat through the sign-up form,
and runs the same chats the way the page does: ``POST /chat/turns`` (htmx), then the answer's
event stream (``sse-connect`` URL) until ``event: done``.

Per request: TTFT (submit -> first token with text; full stack: from sending the POST), TPOT
((last token - first token) / (completion_tokens - 1)); per batch: completion tokens / wall time.
Each N is repeated ``--reps`` times after a warm-up; TTFT/TPOT percentiles pool the requests of
all repeats, tokens/s is the median over repeats. Results: a table on stdout and
``var/bench/chat_bench.json``.

Targets: full-stack tokens/s >= 0.9x bare at N=32; full-stack TTFT p50 within 50 ms of bare at
every N. Exit status: 0 when the run completed (targets met or not; ``--strict``: 1 on a miss),
2 when requests failed.

Background load skews CPU numbers on a small machine: every batch records the CPU used by this
stack (per process) and by everything else, and batches where other processes used more than 5%
of the machine are listed as disturbed. ``--probe`` serves ``bench/probe_asgi.py`` (the same app
plus server-side timestamps); ``--patch-db`` adds an experimental fix for the database-connection
leak (diagnostic only, not the product's numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chatsite.devstack import stop_process_group

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

# Fixed user prompts; chat i of a batch asks PROMPTS[i % len(PROMPTS)].
PROMPTS = [
    "Write three sentences about the ocean.",
    "Explain what a hash table is.",
    "Give me a short recipe for pancakes.",
    "What are the main causes of climate change?",
    "Describe the water cycle in simple terms.",
    "List five tips for writing clean code.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "How does a bicycle stay upright?",
    "What is the difference between a virus and a bacterium?",
    "Write a short poem about autumn leaves.",
    "Explain recursion to a ten year old.",
    "What should I pack for a weekend hiking trip?",
    "How do vaccines work?",
    "Give three reasons to learn a second language.",
    "What is photosynthesis?",
]

MAX_TOKENS = 128
PASSWORD = "bench-Correct-Horse-Battery-42"
SSE_URL = re.compile(r'sse-connect="([^"]+)"')

# Targets (the issue's acceptance criteria).
TOKS_RATIO_TARGET = 0.9  # full/bare tokens/s at the largest N
TTFT_DELTA_TARGET_MS = 50.0  # full - bare TTFT p50, at every N


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class ChatResult:
    prompt_index: int
    ttft_s: float | None
    tpot_s: float | None
    completion_tokens: int
    text: str
    end_s: float  # from batch start
    error: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class BatchResult:
    n: int
    rep: int
    wall_s: float
    completion_tokens: int
    tokens_per_s: float
    chats: list[ChatResult]
    cpu: dict = field(default_factory=dict)
    probe: list[dict] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tpot(first: float | None, last: float | None, completion_tokens: int) -> float | None:
    if first is None or last is None or completion_tokens < 2:
        return None
    return (last - first) / (completion_tokens - 1)


def summarize(batches: list[BatchResult]) -> dict:
    chats = [c for b in batches for c in b.chats]
    ttfts = [c.ttft_s for c in chats if c.ttft_s is not None]
    tpots = [c.tpot_s for c in chats if c.tpot_s is not None]
    return {
        "requests": len(chats),
        "errors": sum(1 for c in chats if c.error),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p99_s": percentile(tpots, 99),
        "tokens_per_s": statistics.median(b.tokens_per_s for b in batches) if batches else None,
        "tokens_per_s_reps": [round(b.tokens_per_s, 2) for b in batches],
        "completion_tokens_mean": (
            statistics.mean(c.completion_tokens for c in chats) if chats else None
        ),
    }


def system_prompt() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    from django.conf import settings  # noqa: PLC0415

    return settings.CHAT_SYSTEM_PROMPT


def model_path() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    from django.conf import settings  # noqa: PLC0415

    return str(settings.CHAT_MODEL_PATH)


# --------------------------------------------------------------------------------------------
# CPU accounting: how much CPU this bench (the client) and everything else on the machine used
# during a batch, so numbers disturbed by background load can be spotted.

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime ticks) for every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def _role(pid: int) -> str:
    """A short name for a process of the stack (for the CPU breakdown)."""
    if pid == os.getpid():
        return "bench"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return "gone"
    for needle, name in (
        (b"VLLM::Worker", "vllm-worker"),
        (b"VLLM::EngineCore", "vllm-enginecore"),
        (b"chatsite.serve", "daphne"),
        (b"postgres", "postgres"),
        (b"redis", "redis"),
    ):
        if needle in cmd:
            return name
    return "other-stack"


def _system_busy_ticks() -> int:
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return sum(parts[:3]) + sum(parts[5:8])


def _stack_pids(table: dict[int, tuple[int, int]]) -> set[int]:
    """This bench's process tree plus the dev stack's (devstack exec, Redis, PostgreSQL)."""
    roots = {os.getpid(), os.getppid()}
    for pid in table:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(VAR / "pgdata").encode() in f.read():
                    roots.add(pid)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


class CpuMeter:
    """CPU seconds used between start() and stop(): by this process (the benchmark client and,
    in phase 1, the engine's front end), by the whole stack, and by anything else."""

    def start(self) -> None:
        self._t = time.perf_counter()
        self._self = time.process_time()
        self._busy = _system_busy_ticks()
        table = _proc_table()
        self._stack = {pid: table[pid][1] for pid in _stack_pids(table)}
        self._all = {pid: ticks for pid, (_, ticks) in table.items()}

    def stop(self) -> dict:
        wall = time.perf_counter() - self._t
        own = time.process_time() - self._self
        busy = (_system_busy_ticks() - self._busy) / _CLK_TCK
        table = _proc_table()
        stack = 0
        by_role: dict[str, float] = {}
        for pid in _stack_pids(table):
            used = table[pid][1] - self._stack.get(pid, 0)
            stack += used
            role = _role(pid)
            by_role[role] = by_role.get(role, 0.0) + used / _CLK_TCK
        stack_s = stack / _CLK_TCK
        stack_pids = _stack_pids(table)
        others = sorted(
            (
                (ticks - self._all.get(pid, ticks), pid)
                for pid, (_, ticks) in table.items()
                if pid not in stack_pids and pid in self._all
            ),
            reverse=True,
        )
        top_others = []
        for ticks, pid in others[:3]:
            if ticks / _CLK_TCK < 0.5:
                break
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                top_others.append({"pid": pid, "cpu_s": ticks / _CLK_TCK, "cmd": cmd[:120]})
        return {
            "stack_cpu_by_role_s": {k: round(v, 2) for k, v in sorted(by_role.items())},
            "other_top": top_others,
            "wall_s": wall,
            "bench_process_cpu_s": own,
            "stack_cpu_s": stack_s,
            "other_cpu_s": max(busy - stack_s, 0.0),
            "machine_busy_frac": busy / (wall * (os.cpu_count() or 1)) if wall > 0 else None,
        }


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Phase 1: the bare engine, in this process


async def bare_chat(engine, sys_prompt: str, prompt_index: int, request_id: str, t_batch: float):
    from inference.engine import GenerationOptions  # noqa: PLC0415

    prompt = PROMPTS[prompt_index % len(PROMPTS)]
    options = GenerationOptions(max_tokens=MAX_TOKENS, temperature=0.0)
    t0 = time.perf_counter()
    first = last = None
    parts: list[str] = []
    completion_tokens = 0
    error = None
    try:
        ids = engine.encode_chat(
            [{"role": "system", "content": sys_prompt}, {"role": "user", "content": prompt}]
        )
        async for delta in engine.generate(ids, options, request_id):
            if delta.text:
                now = time.perf_counter()
                if first is None:
                    first = now
                last = now
                parts.append(delta.text)
            completion_tokens = delta.completion_tokens
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        error = repr(exc)
    end = time.perf_counter()
    return ChatResult(
        prompt_index=prompt_index,
        ttft_s=None if first is None else first - t0,
        tpot_s=tpot(first, last, completion_tokens),
        completion_tokens=completion_tokens,
        text="".join(parts),
        end_s=end - t_batch,
        error=error,
    )


async def bare_batch(engine, sys_prompt: str, n: int, tag: str) -> tuple[float, list[ChatResult]]:
    t_batch = time.perf_counter()
    chats = await asyncio.gather(
        *(bare_chat(engine, sys_prompt, i, f"bench-{tag}-{i}", t_batch) for i in range(n))
    )
    return time.perf_counter() - t_batch, list(chats)


async def run_bare(args) -> dict[int, list[BatchResult]]:
    from inference.engine import VllmEngine  # noqa: PLC0415

    sys_prompt = system_prompt()
    engine = VllmEngine(
        model_path=model_path(), max_model_len=4096, kv_cache_bytes=1 << 30, max_num_seqs=64
    )
    log("bare: starting the vLLM engine in-process")
    t = time.perf_counter()
    await engine.ensure_started()
    log(f"bare: engine ready in {time.perf_counter() - t:.1f} s; warming up")
    results: dict[int, list[BatchResult]] = {n: [] for n in args.concurrency}
    try:
        for w in range(args.warmup):
            warn_errors("bare warm-up", (await bare_batch(engine, sys_prompt, 1, f"warm{w}"))[1])
        if args.warmup_batch:
            _, chats = await bare_batch(engine, sys_prompt, args.warmup_batch, "warmb")
            warn_errors("bare warm-up", chats)
        for rep in range(args.reps):
            for n in args.concurrency:
                meter = CpuMeter()
                meter.start()
                wall, chats = await bare_batch(engine, sys_prompt, n, f"r{rep}n{n}")
                batch = make_batch(n, rep, wall, chats)
                batch.cpu = meter.stop()
                results[n].append(batch)
                log(f"bare  N={n:<3} rep {rep}: {fmt_batch(batch)}")
    finally:
        engine.shutdown()
    return results


def warn_errors(what: str, chats: list[ChatResult]) -> None:
    errors = [c.error for c in chats if c.error]
    if errors:
        log(f"{what}: {len(errors)}/{len(chats)} requests FAILED (first: {errors[0][:300]})")


def make_batch(n: int, rep: int, wall: float, chats: list[ChatResult]) -> BatchResult:
    tokens = sum(c.completion_tokens for c in chats)
    return BatchResult(n, rep, wall, tokens, tokens / wall if wall > 0 else 0.0, chats)


def fmt_batch(b: BatchResult) -> str:
    ttfts = [c.ttft_s for c in b.chats if c.ttft_s is not None]
    errors = [c.error for c in b.chats if c.error]
    s = (
        f"{b.completion_tokens} tok in {b.wall_s:.2f} s = {b.tokens_per_s:.1f} tok/s, "
        f"TTFT p50 {ms(percentile(ttfts, 50))} ms"
    )
    if b.cpu:
        s += (
            f"; CPU s: bench process {b.cpu['bench_process_cpu_s']:.1f}, "
            f"stack {b.cpu['stack_cpu_s']:.1f}, other {b.cpu['other_cpu_s']:.1f}"
        )
        if b.cpu["other_cpu_s"] > 0.05 * b.wall_s * (os.cpu_count() or 1):
            s += "  <-- BACKGROUND LOAD, numbers disturbed"
            if b.cpu.get("other_top"):
                s += " (" + "; ".join(
                    f"{o['cpu_s']:.1f} s {o['cmd'][:60]}" for o in b.cpu["other_top"]
                ) + ")"
    if errors:
        s += f", {len(errors)} ERRORS (first: {errors[0][:300]})"
    return s


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


# --------------------------------------------------------------------------------------------
# Phase 2: the full stack, over HTTP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchUser:
    client: object  # httpx.AsyncClient
    csrf: str


async def signup(base_url: str, username: str):
    import httpx  # noqa: PLC0415

    client = httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(600, connect=30),
        follow_redirects=False,
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
    )
    r = await client.get("/accounts/signup/")
    r.raise_for_status()
    r = await client.post(
        "/accounts/signup/",
        data={
            "username": username,
            "password1": PASSWORD,
            "password2": PASSWORD,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    if r.status_code != 302:
        await client.aclose()
        raise RuntimeError(f"sign-up of {username} failed: {r.status_code} {r.text[:500]}")
    # Login rotated the CSRF token; the new cookie came with the redirect.
    return BenchUser(client=client, csrf=client.cookies["csrftoken"])


async def full_chat(user: BenchUser, prompt_index: int, t_batch: float) -> ChatResult:
    prompt = PROMPTS[prompt_index % len(PROMPTS)]
    client = user.client
    first = last = None
    parts: list[str] = []
    completion_tokens = 0
    error = None
    extra: dict = {}
    t0 = time.perf_counter()
    try:
        r = await client.post(
            "/chat/turns",
            data={"content": prompt},
            headers={"HX-Request": "true", "X-CSRFToken": user.csrf},
        )
        t_post = time.perf_counter()
        extra["post_s"] = t_post - t0
        if r.status_code != 200:
            raise RuntimeError(f"POST /chat/turns -> {r.status_code}: {r.text[:300]}")
        match = SSE_URL.search(r.text)
        if match is None:
            raise RuntimeError("no sse-connect URL in the turn fragment")
        url = match.group(1)
        done = False
        async with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as resp:
            extra["headers_s"] = time.perf_counter() - t0
            if resp.status_code != 200:
                raise RuntimeError(f"GET {url} -> {resp.status_code}")
            buf = b""
            async for chunk in resp.aiter_raw():
                now = time.perf_counter()
                buf += chunk
                while (cut := buf.find(b"\n\n")) >= 0:
                    block, buf = buf[:cut], buf[cut + 2 :]
                    name = data = None
                    for line in block.split(b"\n"):
                        if line.startswith(b"event: "):
                            name = line[7:]
                        elif line.startswith(b"data: "):
                            data = line[6:]
                    if name == b"token":
                        text = json.loads(data)["text"]
                        if text:
                            if first is None:
                                first = now
                            last = now
                            parts.append(text)
                    elif name == b"done":
                        payload = json.loads(data)
                        completion_tokens = payload["usage"]["completion_tokens"]
                        extra["status"] = payload.get("status")
                        done = True
                    elif name == b"error":
                        raise RuntimeError(f"error event: {data.decode(errors='replace')}")
                if done:
                    break
        if not done:
            raise RuntimeError("event stream ended without 'done'")
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        error = repr(exc)
    end = time.perf_counter()
    if first is not None:
        extra["done_after_last_token_s"] = end - last
    return ChatResult(
        prompt_index=prompt_index,
        ttft_s=None if first is None else first - t0,
        tpot_s=tpot(first, last, completion_tokens),
        completion_tokens=completion_tokens,
        text="".join(parts),
        end_s=end - t_batch,
        error=error,
        extra=extra,
    )


async def full_batch(users: list[BenchUser], n: int) -> tuple[float, list[ChatResult]]:
    t_batch = time.perf_counter()
    chats = await asyncio.gather(*(full_chat(users[i], i, t_batch) for i in range(n)))
    return time.perf_counter() - t_batch, list(chats)


async def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import httpx  # noqa: PLC0415

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                r = await client.get("/readyz")
                if r.status_code == 200:
                    return
            await asyncio.sleep(0.5)
    raise RuntimeError("the server did not become healthy in time")


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CHAT_TEMPERATURE="0",
        CHAT_MAX_TOKENS=str(MAX_TOKENS),
        CHAT_STREAM_ATTACH_TIMEOUT_S="60",
        DJANGO_SETTINGS_MODULE="chatsite.settings.base",
        # The same engine shape as the bare engine measured beside it (64 sequences), and none
        # of the tier machinery that would make the comparison unfair: no reserved slots, no
        # shedding, no rate limits (bench/priority_bench.py measures those).
        CHAT_MAX_NUM_SEQS="64",
        CHAT_RESERVED_SLOTS="0",
        CHAT_SHED_FREE_WAITING="100000",
        CHAT_DEGRADE_PAID_WAITING="100000",
        CHAT_REASONING_LAST_WAITING="100000",
        CHAT_RATE_LIMITS_BY_TIER=UNLIMITED,
        CHAT_ORG_RATE_LIMITS_BY_TIER=UNLIMITED,
    )
    return env


# Every tier without RPM / TPM limits (inference/ratelimit.py: a null limit is unlimited).
UNLIMITED = '{"free": {"rpm": null, "tpm": null}, "paid": {"rpm": null, "tpm": null}, "enterprise": {"rpm": null, "tpm": null}}'


def probe_lines(path: Path, pos: int) -> tuple[list[dict], int]:
    """``PROBE {json}`` lines the server wrote after byte ``pos`` (see bench/probe_asgi.py)."""
    with open(path, "rb") as f:
        f.seek(pos)
        data = f.read()
    found = []
    for line in data.splitlines():
        at = line.find(b"PROBE ")
        if at >= 0:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line[at + 6 :]))
    return found, pos + len(data)


def pg_connections() -> int | None:
    """Open connections to this database (diagnostic: does the server reuse connections?)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return None
    try:
        import psycopg  # noqa: PLC0415

        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchone()
            return int(row[0]) - 1  # minus this one
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        log(f"could not count PostgreSQL connections: {exc!r}")
        return None


DIAG: dict = {}


async def run_full(args) -> dict[int, list[BatchResult]]:
    env = server_env()
    python = sys.executable
    log("full: migrating")
    subprocess.run(
        [python, "manage.py", "migrate", "--noinput"],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    probing = args.probe or args.patch_db
    app = "bench.probe_asgi:application" if probing else "chatsite.asgi:application"
    if args.patch_db:
        env["BENCH_PATCH_DB"] = "1"
        log("full: --patch-db: serving with the experimental DB-connection workaround")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = VAR / "bench" / "server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    results: dict[int, list[BatchResult]] = {n: [] for n in args.concurrency}
    users: list[BenchUser] = []
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(
            [python, "-m", "chatsite.serve", "-b", "127.0.0.1", "-p", str(port),
             app],
            env=env,
            cwd=ROOT,
            stdout=server_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            log(f"full: daphne on {base_url} (log: {log_path}); waiting for /readyz")
            t = time.perf_counter()
            await wait_healthy(base_url, server, timeout_s=600)
            log(f"full: healthy in {time.perf_counter() - t:.1f} s; signing up users")
            run_id = f"{int(time.time()):x}"
            needed = max([*args.concurrency, args.warmup_batch, 1])
            for i in range(needed):
                users.append(await signup(base_url, f"bench{run_id}u{i}"))
            DIAG["pg_connections_before_chats"] = pg_connections()
            log(f"full: {len(users)} users signed up; warming up")
            for _ in range(args.warmup):
                warn_errors("full warm-up", (await full_batch(users, 1))[1])
            if args.warmup_batch:
                warn_errors("full warm-up", (await full_batch(users, args.warmup_batch))[1])
            DIAG["pg_connections_after_warmup"] = pg_connections()
            log(f"full: warmed up; PostgreSQL connections open: {DIAG['pg_connections_after_warmup']}")
            log_pos = log_path.stat().st_size
            for rep in range(args.reps):
                for n in args.concurrency:
                    meter = CpuMeter()
                    meter.start()
                    wall, chats = await full_batch(users, n)
                    batch = make_batch(n, rep, wall, chats)
                    batch.cpu = meter.stop()
                    batch.cpu["pg_connections_after"] = pg_connections()
                    if probing:
                        await asyncio.sleep(0.3)  # let the server flush its last lines
                        batch.probe, log_pos = probe_lines(log_path, log_pos)
                    results[n].append(batch)
                    log(
                        f"full  N={n:<3} rep {rep}: {fmt_batch(batch)}; "
                        f"PostgreSQL connections open after: {batch.cpu['pg_connections_after']}"
                    )
            DIAG["pg_connections_after_chats"] = pg_connections()
            log(
                "full: PostgreSQL connections open: "
                f"{DIAG['pg_connections_before_chats']} before the chats, "
                f"{DIAG['pg_connections_after_chats']} after"
            )
        finally:
            for user in users:
                with contextlib.suppress(Exception):
                    await user.client.aclose()
            log("full: stopping the server")
            stop_process_group(server)
    return results


# --------------------------------------------------------------------------------------------
# Report


def report(args, bare: dict[int, list[BatchResult]], full: dict[int, list[BatchResult]]) -> dict:
    rows = []
    for n in args.concurrency:
        b = summarize(bare.get(n, []))
        f = summarize(full.get(n, []))
        ratio = (
            f["tokens_per_s"] / b["tokens_per_s"]
            if b["tokens_per_s"] and f["tokens_per_s"] is not None
            else None
        )
        delta_ms = (
            (f["ttft_p50_s"] - b["ttft_p50_s"]) * 1000
            if b["ttft_p50_s"] is not None and f["ttft_p50_s"] is not None
            else None
        )
        rows.append({"n": n, "bare": b, "full": f, "toks_ratio": ratio, "ttft_p50_delta_ms": delta_ms})

    header = (
        f"{'N':>3} | {'bare TTFT p50/p99 ms':>20} | {'full TTFT p50/p99 ms':>20} | "
        f"{'bare TPOT p50/p99 ms':>20} | {'full TPOT p50/p99 ms':>20} | "
        f"{'bare tok/s':>10} | {'full tok/s':>10} | {'full/bare':>9} | {'dTTFT p50 ms':>12}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in rows:
        b, f = r["bare"], r["full"]

        def pair(s, key):
            return f"{ms(s[key + '_p50_s'])} / {ms(s[key + '_p99_s'])}"

        def num(x, fmt):
            return "-" if x is None else format(x, fmt)

        print(
            f"{r['n']:>3} | {pair(b, 'ttft'):>20} | {pair(f, 'ttft'):>20} | "
            f"{pair(b, 'tpot'):>20} | {pair(f, 'tpot'):>20} | "
            f"{num(b['tokens_per_s'], '.1f'):>10} | {num(f['tokens_per_s'], '.1f'):>10} | "
            f"{num(r['toks_ratio'], '.3f'):>9} | {num(r['ttft_p50_delta_ms'], '+.0f'):>12}"
        )
    print()

    # Targets
    n_max = max(args.concurrency)
    top = next(r for r in rows if r["n"] == n_max)
    errors = sum(r["bare"]["errors"] + r["full"]["errors"] for r in rows)
    checks = []
    ok = top["toks_ratio"] is not None and top["toks_ratio"] >= TOKS_RATIO_TARGET
    checks.append(
        {
            "target": f"full tok/s >= {TOKS_RATIO_TARGET}x bare at N={n_max}",
            "value": top["toks_ratio"],
            "pass": ok,
        }
    )
    for r in rows:
        d = r["ttft_p50_delta_ms"]
        checks.append(
            {
                "target": f"full TTFT p50 within {TTFT_DELTA_TARGET_MS:.0f} ms of bare at N={r['n']}",
                "value": d,
                "pass": d is not None and d <= TTFT_DELTA_TARGET_MS,
            }
        )
    if errors:
        checks.append({"target": "no failed requests", "value": errors, "pass": False})
    skipped = args.skip_bare or args.skip_full
    for c in checks:
        v = c["value"]
        shown = "-" if v is None else (f"{v:.3f}x" if "tok/s" in c["target"] else f"{v:+.0f} ms")
        if c["target"] == "no failed requests":
            shown = f"{v} failed"
        verdict = "PASS" if c["pass"] else ("SKIP" if v is None and skipped else "MISS")
        print(f"  {verdict}  {c['target']}  ({shown})")
    all_ok = all(c["pass"] for c in checks)
    print(f"\n  overall: {'PASS' if all_ok else 'MISS'}\n")

    # Same greedy prompts -> the outputs should match (batching can change float rounding).
    matches = []
    for n in args.concurrency:
        same = total = 0
        for bb, fb in zip(bare.get(n, []), full.get(n, []), strict=False):
            for bc, fc in zip(bb.chats, fb.chats, strict=False):
                total += 1
                same += bc.text == fc.text
        matches.append({"n": n, "identical_outputs": same, "compared": total})
    print(
        "  identical bare/full outputs: "
        + ", ".join(f"N={m['n']}: {m['identical_outputs']}/{m['compared']}" for m in matches)
    )
    disturbed = [
        f"{phase} N={b.n} rep {b.rep} ({b.cpu['other_cpu_s']:.1f} CPU-s)"
        for phase, results in (("bare", bare), ("full", full))
        for batches in results.values()
        for b in batches
        if b.cpu and b.cpu["other_cpu_s"] > 0.05 * b.wall_s * (os.cpu_count() or 1)
    ]
    print(
        "  batches with background load from other processes (>5% of the machine): "
        + (", ".join(disturbed) if disturbed else "none")
    )
    client = [
        (b.cpu["bench_process_cpu_s"], b.wall_s)
        for batches in full.values()
        for b in batches
        if b.cpu
    ]
    if client:
        print(
            f"  benchmark client CPU during full-stack batches: {sum(c for c, _ in client):.1f} "
            f"CPU-s over {sum(w for _, w in client):.0f} s wall"
        )
    print("  stack CPU by process, mean CPU-s per batch (bare | full):")
    for n in args.concurrency:
        def roles(batches):
            acc: dict[str, float] = {}
            for b in batches:
                for k, v in b.cpu.get("stack_cpu_by_role_s", {}).items():
                    acc[k] = acc.get(k, 0.0) + v / len(batches)
            return ", ".join(f"{k} {v:.1f}" for k, v in sorted(acc.items()) if v >= 0.05) or "-"

        print(f"    N={n}: {roles(bare.get(n, []))} | {roles(full.get(n, []))}")
    full_extra = {}
    for n in args.concurrency:
        chats = [c for b in full.get(n, []) for c in b.chats]
        posts = [c.extra.get("post_s") for c in chats if "post_s" in c.extra]
        heads = [c.extra.get("headers_s") for c in chats if "headers_s" in c.extra]
        tails = [c.extra.get("done_after_last_token_s") for c in chats if "done_after_last_token_s" in c.extra]
        full_extra[n] = {
            "post_p50_s": percentile(posts, 50),
            "post_p99_s": percentile(posts, 99),
            "stream_headers_p50_s": percentile(heads, 50),
            "done_after_last_token_p50_s": percentile(tails, 50),
        }
    print(
        "  full-stack breakdown (p50 ms): "
        + "; ".join(
            f"N={n}: POST {ms(x['post_p50_s'])} (p99 {ms(x['post_p99_s'])}), "
            f"stream headers {ms(x['stream_headers_p50_s'])}, "
            f"done after last token {ms(x['done_after_last_token_p50_s'])}"
            for n, x in full_extra.items()
        )
    )
    if args.probe or args.patch_db:
        print("  server-side probe, p50 ms from POST arrival (bench/probe_asgi.py):")
        for n in args.concurrency:
            lines = [p for b in full.get(n, []) for p in b.probe]
            turns = [p for p in lines if p["kind"] == "turn"]
            posts = [p for p in lines if p["kind"] == "post"]

            def p50(items, key):
                value = percentile([p[key] for p in items], 50)
                return "-" if value is None else f"{value:.0f}"

            last = lines[-1] if lines else {}
            print(
                f"    N={n}: engine.generate called {p50(turns, 'generate_called_ms')}, "
                f"first delta {p50(turns, 'first_delta_ms')} "
                f"(engine TTFT {p50(turns, 'engine_ttft_ms')}), "
                f"POST response sent {p50(posts, 'response_sent_ms')}; "
                f"threads {last.get('threads')}, "
                f"DB connections opened so far {last.get('db_connections_opened')}"
            )
    print()
    return {
        "rows": rows,
        "checks": checks,
        "overall_pass": all_ok,
        "identical_outputs": matches,
        "disturbed_batches": disturbed,
        "full_breakdown": {str(k): v for k, v in full_extra.items()},
    }


def batches_json(results: dict[int, list[BatchResult]]) -> dict:
    return {str(n): [asdict(b) for b in batches] for n, batches in results.items()}


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m bench.chat_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated N values")
    parser.add_argument("--reps", type=int, default=2, help="repeats of each N (default 2)")
    parser.add_argument("--warmup", type=int, default=2, help="single warm-up chats (default 2)")
    parser.add_argument(
        "--warmup-batch",
        type=int,
        default=None,
        help="one concurrent warm-up batch of this size (default: the largest N)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a target is missed (default: 0)"
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="serve bench.probe_asgi (server-side timestamps; diagnostic, not the plain app)",
    )
    parser.add_argument(
        "--patch-db",
        action="store_true",
        help="diagnostic: serve with an experimental fix for the DB connection leak "
        "(CONN_MAX_AGE=0, background DB work closes its connection); implies --probe",
    )
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "chat_bench.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.warmup_batch is None:
        args.warmup_batch = max(args.concurrency)
    return args


async def amain(args) -> int:
    started = time.perf_counter()
    bare: dict[int, list[BatchResult]] = {}
    full: dict[int, list[BatchResult]] = {}
    if not args.skip_bare:
        bare = await run_bare(args)
        # Let the EngineCore process exit and its memory go before the server starts its own.
        await asyncio.sleep(2)
    if not args.skip_full:
        full = await run_full(args)
    summary = report(args, bare, full)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "concurrency": args.concurrency,
            "reps": args.reps,
            "warmup": args.warmup,
            "warmup_batch": args.warmup_batch,
            "server_app": (
                "bench.probe_asgi:application" if args.probe or args.patch_db
                else "chatsite.asgi:application"
            ),
            "patch_db": args.patch_db,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "system_prompt": system_prompt(),
            "prompts": PROMPTS,
            "model_path": model_path(),
            "cpu_count": os.cpu_count(),
            "loadavg_end": os.getloadavg(),
        },
        "total_s": total_s,
        "diagnostics": DIAG,
        **summary,
        "bare": batches_json(bare),
        "full": batches_json(full),
    }
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    errors = sum(r["bare"]["errors"] + r["full"]["errors"] for r in summary["rows"])
    if errors:
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
