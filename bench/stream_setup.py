"""bench/stream_bench.py's setup: the Django objects and the Redis turn logs exactly as
``conversations.turnlog.TurnLogWriter`` writes them (:class:`Fixture`), the server under test
(:class:`Server`: the product's uvicorn, or stock daphne for the comparison), and samples of
it, Redis and PostgreSQL (:func:`sample`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

from bench.harness import HOST, Spawned, free_port
from bench.harness import server_argv as product_argv

ENGINE_CLASS = "tests.fakes.ScriptedEngine"

now = time.monotonic


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


SERVERS = ("uvicorn", "daphne-plain")


def server_argv(kind: str, port: int, app: str = "chatsite.asgi:application") -> list[str]:
    """The command line of ASGI server ``kind`` on 127.0.0.1:``port``: ``uvicorn`` (the
    product's, ``python -m chatsite.serve``: its own write flow control) or ``daphne-plain``
    (stock daphne, no write backpressure: the reference for a stalled client; installed with
    the ``bench`` extra). The daphne with chatsite's own Twisted producer that uvicorn replaced
    is measured in docs/api.md's table (issue 19 part 5)."""
    if kind == "uvicorn":
        return product_argv(app=app, port=port)
    if kind == "daphne-plain":
        return [sys.executable, "-m", "daphne", "-b", HOST, "-p", str(port), app]
    raise ValueError(f"unknown server {kind!r} (one of {', '.join(SERVERS)})")


class Server(Spawned):
    """One ASGI server process (``kind``: :func:`server_argv`; the product's unless said) with
    ``CHAT_SSE_KEEPALIVE_S`` = ``keepalive_s`` and the scripted engine, appending to
    ``log_path``; its PostgreSQL backends are told apart by ``PGAPPNAME`` = :attr:`app_name`.
    ``extra_env``: more settings (the stalled-client phase's long answer)."""

    def __init__(
        self,
        keepalive_s: float,
        log_path: Path,
        kind: str = "uvicorn",
        extra_env: dict | None = None,
    ):
        port = free_port()
        super().__init__(kind, server_argv(kind, port), port=port, log_path=log_path,
                         append=True)  # fmt: skip
        self.kind = kind
        self.extra_env = extra_env or {}
        self.keepalive_s = keepalive_s
        self.app_name = f"stream-bench-{kind}-{port}"

    def start(self) -> float:
        """Start the server; return the seconds until ``/v1/openapi.json`` answered 200."""
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        env.update(
            CHAT_SSE_KEEPALIVE_S=str(self.keepalive_s),
            CHAT_ENGINE_CLASS=ENGINE_CLASS,
            DJANGO_SETTINGS_MODULE="chatsite.settings.base",
            PYTHONUNBUFFERED="1",
            PGAPPNAME=self.app_name,  # libpq: tells this server's PostgreSQL backends apart
            # Thousands of streams from one bench user: no RPM / TPM limits, no shedding.
            CHAT_RATE_LIMITS_BY_TIER='{"free": {"rpm": null, "tpm": null}}',
            CHAT_SHED_FREE_WAITING="100000",
            # The scripted engine has no batch limit: admit every stream at once.
            CHAT_MAX_NUM_SEQS="100000",
        )
        env.update(self.extra_env)
        self.env = env
        super().start()  # inherits the raised RLIMIT_NOFILE
        return self.wait_ready("/v1/openapi.json", 90, poll_s=0.2)

    def stop(self) -> str:
        """SIGTERM its process group, SIGKILL after 10 s."""
        return super().stop(10)

    def log_findings(self) -> dict:
        """Counts of telling lines in this server's part of the log, and a few samples."""
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
# Sampling: the server process, Redis, PostgreSQL


def sample(server: Server, redis_client) -> dict:
    import psutil
    from django.db import connection

    out: dict = {"t": now()}
    try:
        p = psutil.Process(server.proc.pid)
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
                [server.app_name],
            )
            out["pg_backends"], out["pg_backends_all"] = cur.fetchone()
    except Exception:  # noqa: BLE001
        out["pg_backends"] = out["pg_backends_all"] = None
    return out


def mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)
