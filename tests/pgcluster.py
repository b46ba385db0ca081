"""Real PostgreSQL clusters for tests and benchmarks, and a real app process to drive.

- :func:`clusters`: a context manager that makes primaries (``initdb``) and streaming replicas
  (``pg_basebackup -R``) on loopback ports, and stops every one of them when the block exits,
  also when a test fails. The binaries are the PostgreSQL 16 that the ``pgserver`` wheel ships
  (``pgserver/pginstall/bin``). PostgreSQL refuses to run as root; as root the clusters run as
  the ``pgserver`` system user, as pgserver itself does.
- :class:`AppProcess`: this project in a subprocess, configured only by its environment
  (``DATABASE_URL``, ``DATABASE_REPLICA_URLS``, ``CHAT_REGION_DATABASE_URLS``, ...) as a gateway
  or worker is, driven by JSON lines over stdin/stdout. The ops it runs, and the loop that
  serves them, are in tests/pgcluster_ops.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def pg_bin() -> Path:
    """The folder of PostgreSQL's binaries in the pgserver wheel."""
    import pgserver  # noqa: PLC0415

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _run_as() -> str | None:
    """The system user to run PostgreSQL as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("pgserver")
    except KeyError:
        from pgserver.utils import ensure_user_exists  # noqa: PLC0415

        ensure_user_exists("pgserver")
    return "pgserver"


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """One PostgreSQL server (a data directory and a port on 127.0.0.1)."""

    name: str
    data_dir: Path
    port: int
    user: str | None
    running: bool = False

    def _pg(self, program: str, *args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            [str(pg_bin() / program), *args],
            user=self.user, capture_output=True, text=True, timeout=timeout, cwd="/",
        )  # fmt: skip
        if result.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(f"{program} {' '.join(args)} failed:\n{result.stderr}\n{tail}")
        return result.stdout

    def start(self) -> None:
        self._pg("pg_ctl", "start", "-w", "-D", str(self.data_dir), "-l", str(self.data_dir / "server.log"))
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (``immediate``: like a crash, no shutdown checkpoint)."""
        if self.running:
            self._pg("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data_dir))
            self.running = False

    def kill(self) -> None:
        """SIGKILL the postmaster if it is still there (teardown of last resort)."""
        pid_file = self.data_dir / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        self.running = False

    def promote(self) -> None:
        """Promote this standby to a primary; returns once it accepts writes."""
        self._pg("pg_ctl", "promote", "-w", "-D", str(self.data_dir))

    def url(self, dbname: str = "chat") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "chat") -> psycopg.Connection:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def query(self, sql: str, params: tuple = (), dbname: str = "chat") -> list[tuple]:
        """Rows of ``sql`` run directly on this server (not through the app)."""
        with self.connect(dbname) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def require_synchronous_standby(self) -> None:
        """On a primary with a standby: from now on a commit returns only once a standby has
        flushed it (``synchronous_standby_names = '*'``), so a failover loses no committed
        transaction. (Not before the standby exists: commits would wait for it forever.)"""
        self.query("ALTER SYSTEM SET synchronous_standby_names = '*'", dbname="postgres")
        self.query("SELECT pg_reload_conf()", dbname="postgres")
        deadline = time.monotonic() + 30
        while not self.query(
            "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'", dbname="postgres"
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no synchronous standby of {self.name}")
            time.sleep(0.05)

    def pause_replay(self) -> None:
        """On a standby: stop applying WAL (it keeps receiving it), so it falls behind."""
        self.query("SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        self.query("SELECT pg_wal_replay_resume()")


@dataclass
class Clusters:
    """The clusters made in one :func:`clusters` block."""

    base_dir: Path
    user: str | None
    made: list[Cluster] = field(default_factory=list)

    def _dir(self, name: str) -> Path:
        path = self.base_dir / name
        path.mkdir(mode=0o700)
        if self.user:
            shutil.chown(path, self.user, self.user)
        return path

    def primary(self, name: str, *, databases=("chat",)) -> Cluster:
        """A new, started primary with the given (empty) databases."""
        cluster = Cluster(name, self._dir(name), _free_port(), self.user)
        self.made.append(cluster)
        cluster._pg("initdb", "-D", str(cluster.data_dir), "-U", "postgres", "--auth=trust",
                    "--no-sync", "-E", "UTF8", "--locale=C")  # fmt: skip
        settings = {
            "port": cluster.port,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": "''",
            "wal_level": "replica",
            "wal_keep_size": "'256MB'",  # a replica that falls behind can still catch up
            "max_wal_senders": 10,
            "max_connections": 60,
            "shared_buffers": "'32MB'",
            "fsync": "off",  # test data: a killed server is restarted from its files, no OS crash
            "full_page_writes": "off",
        }
        with (cluster.data_dir / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        cluster.start()
        for dbname in databases:
            cluster.query(f'CREATE DATABASE "{dbname}"', dbname="postgres")
        return cluster

    def replica(self, primary: Cluster, name: str) -> Cluster:
        """A new, started streaming replica of ``primary`` (``pg_basebackup -R``: it connects
        back to the primary and replays its WAL), caught up when this returns."""
        cluster = Cluster(name, self._dir(name), _free_port(), self.user)
        self.made.append(cluster)
        cluster._pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                    "-D", str(cluster.data_dir), "-R", "-X", "stream", "-c", "fast",
                    "--no-sync")  # fmt: skip
        with (cluster.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {cluster.port}\n")
            # Named in the primary's pg_stat_replication; '*' in synchronous_standby_names
            # accepts any name.
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
                       f"application_name={name}'\n")  # fmt: skip
        cluster.start()
        wait_replayed(primary, cluster)
        return cluster


def wait_replayed(primary: Cluster, replica: Cluster, timeout: float = 30) -> None:
    """Wait until ``replica`` has replayed everything ``primary`` has written so far."""
    target = primary.query("SELECT pg_current_wal_lsn()::text", dbname="postgres")[0][0]
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.OperationalError):
            done = replica.query(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,), dbname="postgres"
            )[0][0]
            if done:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{replica.name} did not replay up to {target} in {timeout} s")
        time.sleep(0.05)


@contextlib.contextmanager
def clusters() -> Iterator[Clusters]:
    """Make clusters inside the block; every one is stopped (then killed if need be) and its
    files removed when the block exits, however it exits."""
    user = _run_as()
    # Short path (Unix socket paths are short too) under /tmp, which every user can traverse.
    base_dir = Path(tempfile.mkdtemp(prefix="pgc-"))
    base_dir.chmod(0o755)
    made = Clusters(base_dir, user)
    try:
        yield made
    finally:
        for cluster in reversed(made.made):
            try:
                cluster.stop("immediate")
            except Exception:  # noqa: BLE001 - teardown: make sure it is gone anyway
                cluster.kill()
        shutil.rmtree(base_dir, ignore_errors=True)


# --- the app in a subprocess ---------------------------------------------------------------


class AppError(RuntimeError):
    """An op failed in the app process; ``kind`` is the exception's class name."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass
class Reply:
    """An op's result (``value``) and, per database alias its queries used (in order of first
    use), the server that answered: ``{"alias", "port", "in_recovery"}`` (both None, plus
    ``error``, when that server could no longer be asked after the op)."""

    value: object
    servers: list[dict]

    @property
    def ports(self) -> set[int]:
        """The ports of the servers that answered the op's conversation queries (the user
        lookup by name that ops start with is not counted)."""
        return {s["port"] for s in self.servers if s["port"] is not None}


class AppProcess:
    """This project in a subprocess, configured by ``env`` (added to a clean test env)."""

    def __init__(self, env: dict[str, str], *, module: str = "tests.pgcluster_ops"):
        """``module``: the module run as the app (its ``__main__`` serves ops; default
        tests/pgcluster_ops.py's :data:`OPS`)."""
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "chatsite.settings.base",
                "DB_POOL_MAX": "4",
                "CELERY_TASK_ALWAYS_EAGER": "1",
                **env,
            },
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True,
        )  # fmt: skip

    def call(self, op: str, timeout: float = 120, **kwargs) -> Reply:
        """Run ``op`` (``op_<name>`` in tests/pgcluster_ops.py) in the app; return its result and
        the servers its queries ran on. Raises AppError if it raised there, TimeoutError (and
        kills the app) if it has not answered after ``timeout`` seconds."""
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            raise TimeoutError(
                f"the app process did not answer {op} within {timeout} s; its stderr ends:\n"
                f"{self.stderr_tail()}"
            )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the app process died:\n{self.stderr_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise AppError(reply["error"], reply["message"])
        return Reply(reply["result"]["value"], reply["result"]["servers"])

    def stderr_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters the app process wrote to stderr (its log)."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()

    def __enter__(self) -> AppProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
