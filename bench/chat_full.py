"""bench/chat_bench.py's phase 2: the full stack over HTTP. The real server (uvicorn,
``chatsite.asgi:application``) as a subprocess with greedy, MAX_TOKENS-token settings, one user
per concurrent chat signed up through the sign-up form, and the chats the way the page runs
them: ``POST /chat/turns`` (htmx), then the answer's event stream (``sse-connect`` URL) until
``event: done``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.chat_batches import (
    MAX_TOKENS,
    BatchResult,
    ChatResult,
    fmt_batch,
    make_batch,
    warn_errors,
)
from bench.clients import PageUser, page_signup, sse_events
from bench.harness import (
    PROMPTS,
    ROOT,
    VAR,
    CpuMeter,
    Spawned,
    free_port,
    log,
    server_argv,
    tier_machinery_off_env,
    tpot,
)

SSE_URL = re.compile(r'sse-connect="([^"]+)"')

# Connection counts and such, for the JSON (diagnostics, not measurements).
DIAG: dict = {}


async def full_chat(user: PageUser, prompt_index: int, t_batch: float) -> ChatResult:
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
            async for name, data, now in sse_events(resp):
                if name == "token":
                    text = data["text"]
                    if text:
                        if first is None:
                            first = now
                        last = now
                        parts.append(text)
                elif name == "done":
                    completion_tokens = data["usage"]["completion_tokens"]
                    extra["status"] = data.get("status")
                    done = True
                    break
                elif name == "error":
                    raise RuntimeError(f"error event: {json.dumps(data)}")
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


async def full_batch(users: list[PageUser], n: int) -> tuple[float, list[ChatResult]]:
    t_batch = time.perf_counter()
    chats = await asyncio.gather(*(full_chat(users[i], i, t_batch) for i in range(n)))
    return time.perf_counter() - t_batch, list(chats)


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CHAT_TEMPERATURE="0",
        CHAT_MAX_TOKENS=str(MAX_TOKENS),
        CHAT_STREAM_ATTACH_TIMEOUT_S="60",
        DJANGO_SETTINGS_MODULE="chatsite.settings.base",
        # The same engine shape as the bare engine measured beside it (64 sequences), and none
        # of the tier machinery that would make the comparison unfair.
        CHAT_MAX_NUM_SEQS="64",
        **tier_machinery_off_env(),
    )
    return env


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
    log_path = VAR / "bench" / "server.log"
    results: dict[int, list[BatchResult]] = {n: [] for n in args.concurrency}
    users: list[PageUser] = []
    server = Spawned("the server", server_argv(app, port), port=port, env=env, log_path=log_path)
    server.start()
    try:
        log(f"full: uvicorn on {server.url} (log: {log_path}); waiting for /readyz")
        t = time.perf_counter()
        server.wait_ready("/readyz", timeout_s=600)
        log(f"full: healthy in {time.perf_counter() - t:.1f} s; signing up users")
        run_id = f"{int(time.time()):x}"
        needed = max([*args.concurrency, args.warmup_batch, 1])
        for i in range(needed):
            users.append(await page_signup(server.url, f"bench{run_id}u{i}"))
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
        server.stop()
    return results
