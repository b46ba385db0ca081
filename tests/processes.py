"""Real server processes for tests: uvicorn gateways (chatsite/serve.py) and Celery workers on
the test database and Redis (the same ones the in-process test server uses)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from django.conf import settings as django_settings
from django.db import connections

from chatsite.serve import serve_argv


def database_url(alias: str = "default") -> str:
    """A URL for the (test) database ``alias`` as this process sees it, for a subprocess."""
    db = connections[alias].settings_dict
    host = db.get("HOST") or ""
    url = f"postgresql://{quote(db['USER'] or '')}:{quote(db['PASSWORD'] or '')}@{host}"
    if db.get("PORT"):
        url += f":{db['PORT']}"
    url += f"/{db['NAME']}"
    if db.get("OPTIONS", {}).get("host"):
        url += f"?host={db['OPTIONS']['host']}"
    return url


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment pointed at the test database and Redis."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": django_settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings.base",
        **(extra_env or {}),
    }


@contextlib.contextmanager
def server_process(extra_env: dict[str, str], ready_path: str) -> Iterator[str]:
    """A server subprocess (chatsite/serve.py) on the test database and Redis; yields its URL
    once ``ready_path`` answers 200, and stops it afterwards. Its log goes to a temporary file
    (a pipe nobody reads would stall a server that logs a lot, as one does while its database
    is down); the end of it is in the error when the server does not become ready."""
    port = free_port()
    # Tasks run in the gateway itself unless a test starts a real worker for them.
    env = stack_env({"CELERY_TASK_ALWAYS_EAGER": "1", **extra_env})
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        serve_argv(port=port),
        env=env, cwd=django_settings.BASE_DIR,
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip

    def log_tail() -> str:
        log.seek(0)
        return log.read().decode(errors="replace")[-2000:]

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(f"{url}{ready_path}", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log_tail()
            assert time.monotonic() < deadline, f"the server subprocess did not become ready:\n{log_tail()}"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@dataclass
class CeleryWorker:
    """A real ``celery worker`` subprocess (prefork pool) and where its log goes."""

    proc: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children) at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@contextlib.contextmanager
def celery_worker_process(
    tmp_path, extra_env: dict[str, str] | None = None, queues: str = "celery"
) -> Iterator[CeleryWorker]:
    """Start a real Celery worker on the test database and Redis; yield once it is ready
    (its log says so), stop it afterwards. ``extra_env`` overrides settings for the worker."""
    log_path = str(tmp_path / f"celery-{time.monotonic_ns()}.log")
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-l", "INFO",
         "--concurrency", "1", "-Q", queues, "--without-gossip", "--without-mingle"],
        env=stack_env({"CELERY_TASK_ALWAYS_EAGER": "0", **(extra_env or {})}),
        cwd=django_settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    worker = CeleryWorker(proc, log_path)
    deadline = time.monotonic() + 60
    try:
        while "ready." not in worker.log():
            assert proc.poll() is None, worker.log()[-3000:]
            assert time.monotonic() < deadline, "the Celery worker did not become ready"
            time.sleep(0.2)
        yield worker
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()


# --- vllm serve: the session's one OpenAI server of vLLM's own (tests/conftest.py vllm_serve) ---

SERVED_NAME = "smol-remote"


@dataclass
class RemoteServer:
    """A running ``vllm serve`` subprocess."""

    url: str
    proc: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        """SIGKILL the whole group at once (the API server, EngineCore and its worker): the node
        dies as a crashed machine would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def metric(self, name: str) -> float:
        """The sum of a Prometheus sample family from the server's /metrics (0 if absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
            if match:
                total += float(match.group(2))
        return total


@contextlib.contextmanager
def vllm_server(tmp_dir) -> Iterator[RemoteServer]:
    """Start vLLM's OpenAI server for the shipped model on a free loopback port; yield once
    ``/v1/models`` answers; stop the whole process group afterwards (the API server and its
    EngineCore child)."""
    port = free_port()
    log_path = os.path.join(tmp_dir, "vllm-serve.log")
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(django_settings.CHAT_MODEL_PATH),
         # Its own name (a remote pool's `model`) and the shipped model's (a node of a pool).
         "--served-model-name", SERVED_NAME, django_settings.CHAT_MODEL_NAME,
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
         "--max-model-len", "2048", "--max-num-seqs", "8", "--scheduling-policy", "priority",
         "--enable-prompt-tokens-details", "--enable-prefix-caching"],
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        cwd=django_settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    server = RemoteServer(url=f"http://127.0.0.1:{port}", proc=proc, log_path=log_path)
    deadline = time.monotonic() + 240
    try:
        while True:
            try:
                if httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "vllm serve exited:\n" + server.log()[-4000:]
            assert time.monotonic() < deadline, "vllm serve did not become ready:\n" + server.log()[-4000:]
            time.sleep(1)
        yield server
    finally:
        stop_group(proc)
        log.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, give it 20 s (the EngineCore and its worker exit a
    few seconds after the API server), then SIGKILL whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
