"""A PostgreSQL cluster run by Patroni (a real HA manager) for tests and benchmarks.

:func:`patroni_cluster` starts one etcd (Debian's ``etcd-server``, the ``make test`` target
``etcd``) and two Patroni members (PyPI ``patroni[etcd3]``) over the PostgreSQL 16 binaries that
the ``pgserver`` wheel ships (:func:`tests.pgcluster.pg_bin`), all on loopback ports in a temporary
folder, and stops and removes everything when the block exits, also when a test fails.

Patroni decides alone: the member holding the leader key in etcd is the primary; when that key
expires (the primary's Patroni stops renewing it) the replica promotes itself. Timings:
``ttl`` 20 s (Patroni's floor; see :data:`TTL_S`), ``loop_wait`` 2 s, ``retry_timeout`` 3 s, so
writes come back within ttl + loop_wait (+ a margin). ``synchronous_mode``: a commit returns once the replica has it, so
a failover loses no acknowledged write. ``use_pg_rewind`` (with
``remove_data_directory_on_rewind_failure`` as the fallback) lets a killed primary rejoin as a
replica of the new one when its Patroni is started again.

As root, PostgreSQL (and so Patroni, which starts it) runs as the ``pgserver`` system user, as in
tests/pgcluster.py. That user cannot read the venv's interpreter (a link into root's pyenv), so
Patroni then runs on Debian's ``/usr/bin/python3`` (the same 3.11) with the venv's
site-packages on its path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import yaml

from tests.pgcluster import _free_port, _run_as, pg_bin

# Timings (seconds): the leader key's TTL, Patroni's loop period, and how long it retries etcd
# and PostgreSQL before demoting. The issue asks for ttl 10; Patroni (3.x and 4.x alike,
# patroni/config.py _validate_and_adjust_timeouts) raises any ttl below 20 to 20 with a warning,
# so 20 is the shortest it runs with, and what is set here so the numbers say what runs.
TTL_S = 20
LOOP_WAIT_S = 2
RETRY_TIMEOUT_S = 3


def etcd_binary() -> str:
    """Path of Debian's etcd (``make etcd`` installs ``etcd-server``). Raises FileNotFoundError."""
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        raise FileNotFoundError("etcd is not installed: run `make etcd` (Debian's etcd-server)")
    return path


def _patroni_command(user: str | None) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment that start Patroni as ``user``."""
    import patroni  # noqa: PLC0415 - raises ImportError when the test extra is missing

    if user is None:
        return [sys.executable, "-m", "patroni"], {}
    site_packages = str(Path(patroni.__file__).resolve().parent.parent)
    return ["/usr/bin/python3", "-m", "patroni"], {"PYTHONPATH": site_packages}


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    """The HTTP status of GET ``url``, or None if nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return None


@dataclass
class Member:
    """One Patroni member: its PostgreSQL port, REST API port and processes."""

    name: str
    base_dir: Path
    pg_port: int
    api_port: int
    config_file: Path
    user: str | None
    process: subprocess.Popen | None = None

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    def start(self) -> None:
        """Start (or start again) this member's Patroni process; it starts PostgreSQL."""
        command, extra_env = _patroni_command(self.user)
        log = (self.base_dir / "patroni.log").open("ab")
        self.process = subprocess.Popen(
            [*command, str(self.config_file)],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", **extra_env},
            user=self.user, cwd=str(self.base_dir), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def rest(self, path: str) -> int | None:
        """GET ``path`` on this member's REST API: 200 on ``/primary`` when it is the leader,
        200 on ``/replica`` when it is a running replica; None if Patroni is not answering."""
        return _http_status(f"http://127.0.0.1:{self.api_port}{path}")

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return None

    def kill(self) -> None:
        """SIGKILL this member's Patroni process and its postmaster, as a machine failure would
        (no demotion, no leader key released, no shutdown checkpoint)."""
        pid = self.postmaster_pid()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop Patroni (SIGTERM: it stops PostgreSQL), killing both if they linger."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def url(self, dbname: str = "chat") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"

    def query(self, sql: str, params: tuple = (), dbname: str = "chat") -> list[tuple]:
        """Rows of ``sql`` run directly on this member's PostgreSQL."""
        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def log_tail(self, chars: int = 3000) -> str:
        path = self.base_dir / "patroni.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@dataclass
class PatroniCluster:
    """etcd plus the Patroni members of one :func:`patroni_cluster` block."""

    base_dir: Path
    etcd_port: int
    members: list[Member] = field(default_factory=list)

    def leader(self, timeout: float = 60) -> Member:
        """The member whose REST API says it is the primary (waits up to ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for member in self.members:
                if member.rest("/primary") == 200:
                    return member
            time.sleep(0.2)
        raise TimeoutError("no Patroni leader:\n" + "\n".join(m.log_tail() for m in self.members))

    def wait_replica(self, member: Member, timeout: float = 60) -> None:
        """Wait until ``member`` runs as a streaming replica (REST ``/replica`` answers 200)."""
        deadline = time.monotonic() + timeout
        while member.rest("/replica") != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{member.name} is not a replica:\n{member.log_tail()}")
            time.sleep(0.2)

    def wait_synchronous(self, leader: Member, member: Member, timeout: float = 90) -> None:
        """Wait until ``member`` is the synchronous standby that Patroni may promote: named in
        Patroni's sync key (REST ``/synchronous`` answers 200) and streaming from ``leader``
        with ``sync_state = 'sync'``. Until then a replica that Patroni reports as running
        (``/replica`` 200) may not be streaming yet (its first start asks for a replication
        slot the leader makes a moment later, and retries 5 s on), and a primary killed then
        leaves no member Patroni will promote ("not the healthiest node"; issue 26: seen on
        the faster CPUs, where the test reached the kill within 6 s of the cluster's start)."""
        deadline = time.monotonic() + timeout
        while True:
            streaming = member.rest("/synchronous") == 200 and any(
                name == member.name and state == "sync" for name, state in sync_state(leader)
            )
            if streaming:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{member.name} is not {leader.name}'s synchronous standby after {timeout} s:\n"
                    f"{member.log_tail()}"
                )
            time.sleep(0.2)

    def url(self, target_session_attrs: str, dbname: str = "chat") -> str:
        """A libpq multi-host URL naming every member: ``read-write`` reaches the primary,
        wherever it is now; ``prefer-standby`` a replica while one is up, else the primary."""
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in self.members)
        return (
            f"postgresql://postgres@{hosts}/{dbname}"
            f"?target_session_attrs={target_session_attrs}&connect_timeout=2"
        )


def _member_config(cluster: PatroniCluster, member: Member) -> dict:
    return {
        "scope": "chat",
        "namespace": "/chatsite/",
        "name": member.name,
        "restapi": {
            "listen": f"127.0.0.1:{member.api_port}",
            "connect_address": f"127.0.0.1:{member.api_port}",
        },
        "etcd3": {"hosts": f"127.0.0.1:{cluster.etcd_port}"},
        "bootstrap": {
            "dcs": {
                "ttl": TTL_S,
                "loop_wait": LOOP_WAIT_S,
                "retry_timeout": RETRY_TIMEOUT_S,
                "maximum_lag_on_failover": 16 * 1024 * 1024,
                "synchronous_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "remove_data_directory_on_rewind_failure": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "wal_keep_size": "256MB",
                        "max_connections": 60,
                        "shared_buffers": "32MB",
                        # Test data: a SIGKILLed postmaster restarts from its files (no OS crash).
                        "fsync": "off",
                        "full_page_writes": "on",  # pg_rewind needs it
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{member.pg_port}",
            "connect_address": f"127.0.0.1:{member.pg_port}",
            "data_dir": str(member.data_dir),
            "bin_dir": str(pg_bin()),
            "pgpass": str(member.base_dir / "pgpass"),
            "authentication": {
                "superuser": {"username": "postgres"},
                "replication": {"username": "postgres"},
                "rewind": {"username": "postgres"},
            },
            "parameters": {"unix_socket_directories": str(member.base_dir)},
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
        },
        "tags": {"nofailover": False, "noloadbalance": False},
        "log": {"level": "INFO"},
    }


def _start_etcd(base_dir: Path) -> tuple[subprocess.Popen, int]:
    client, peer = _free_port(), _free_port()
    data_dir = base_dir / "etcd"
    log = (base_dir / "etcd.log").open("ab")
    process = subprocess.Popen(
        [
            etcd_binary(), "--name", "etcd0", "--data-dir", str(data_dir),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"etcd0=http://127.0.0.1:{peer}",
            "--initial-cluster-state", "new",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while _http_status(f"http://127.0.0.1:{client}/health") != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                "etcd did not start:\n" + (base_dir / "etcd.log").read_text()[-3000:]
            )
        time.sleep(0.1)
    return process, client


@contextlib.contextmanager
def patroni_cluster(*, members: int = 2, databases=("chat",)) -> Iterator[PatroniCluster]:
    """etcd and ``members`` Patroni members, the first bootstrapped as the primary, the others
    streaming replicas of it (synchronous mode; the block starts once the first of them is the
    synchronous standby), with ``databases`` created. Everything is
    stopped and its files removed when the block exits, however it exits."""
    user = _run_as()
    base_dir = Path(tempfile.mkdtemp(prefix="patroni-"))
    base_dir.chmod(0o755)
    etcd = None
    cluster = None
    try:
        etcd, etcd_port = _start_etcd(base_dir)
        cluster = PatroniCluster(base_dir, etcd_port)
        for n in range(members):
            member_dir = base_dir / f"pg{n}"
            member_dir.mkdir(mode=0o700)
            if user:
                shutil.chown(member_dir, user, user)
            member = Member(f"pg{n}", member_dir, _free_port(), _free_port(),
                            member_dir / "patroni.yml", user)  # fmt: skip
            member.config_file.write_text(yaml.safe_dump(_member_config(cluster, member)))
            cluster.members.append(member)
        first, *others = cluster.members
        first.start()
        leader = cluster.leader(timeout=90)
        for member in others:
            member.start()
        for member in others:
            cluster.wait_replica(member, timeout=90)
        if others:  # one synchronous standby (Patroni's synchronous_node_count, default 1)
            cluster.wait_synchronous(leader, others[0], timeout=90)
        for dbname in databases:
            leader.query(f'CREATE DATABASE "{dbname}"', dbname="postgres")
        yield cluster
    finally:
        for member in cluster.members if cluster else []:
            member.stop()
        if etcd is not None:
            etcd.kill()
            etcd.wait()
        shutil.rmtree(base_dir, ignore_errors=True)


def sync_state(member: Member) -> list[tuple]:
    """(application_name, sync_state) of the standbys streaming from ``member``."""
    return member.query(
        "SELECT application_name, sync_state FROM pg_stat_replication", dbname="postgres"
    )


if __name__ == "__main__":  # a quick manual check: python -m tests.patroni_cluster
    with patroni_cluster() as c:
        print(json.dumps({"leader": c.leader().name, "url": c.url("read-write")}))
