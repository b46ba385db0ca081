"""PF-R4: many server processes share one rate limit exactly (inference/ratelimit.py).

Two OS processes (each a Python interpreter with its own Django setup, asyncio loop and Redis
connection pool, as two gateway processes have) take from the same user's RPM bucket on the
test Redis, on Redis's own clock (no injected ``now``). RPM = 10; each scenario has a fresh
bucket: 20 requests sent round-robin across the processes, and 20 sent at the same moment (10
concurrent in each process, released together): exactly 10 succeed each time.

A limiter that read the bucket and wrote it back in two steps, or kept counts per process,
lets more than 10 through here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings

from inference.ratelimit import bucket_key

# One worker process: reads one JSON command a line, answers one JSON line.
#   {"warm": n}                                       -> opens n Redis connections, loads the script
#   {"user_id": id, "rpm": r, "count": n, "at": t}    -> at wall time t, n concurrent takes;
#                                                        answers [[allowed, retry_after_s], ...]
WORKER = r"""
import asyncio, json, sys, time
import django
django.setup()
from chatsite import redis_guard
from inference.ratelimit import Limits, rate_limit_take

async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        if "warm" in command:
            client = redis_guard.async_client()
            await asyncio.gather(*(client.ping() for _ in range(command["warm"])))
            answer = "warm"
        else:
            limits = Limits(rpm=command["rpm"], tpm=None)
            delay = command["at"] - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            decisions = await asyncio.gather(*(
                rate_limit_take(user_id=command["user_id"], org_id=None, user_limits=limits,
                                org_limits=None, tokens=0)
                for _ in range(command["count"])
            ))
            answer = [[d.allowed, d.retry_after_s] for d in decisions]
        print(json.dumps(answer), flush=True)

asyncio.run(main())
"""


class Worker:
    """A worker subprocess driven line by line."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatsite.settings.base",
            "REDIS_URL": settings.REDIS_URL,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER], env=env, cwd=settings.BASE_DIR,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def send(self, command: dict) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def receive(self):
        line = self.proc.stdout.readline()
        assert line, f"the worker exited with {self.proc.wait(5)}"
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Worker]]:
    """Two worker processes, each with 10 open Redis connections and the script loaded."""
    pair = [Worker(), Worker()]
    try:
        for worker in pair:
            worker.send({"warm": 10})
        for worker in pair:
            assert worker.receive() == "warm"
        yield pair
    finally:
        for worker in pair:
            worker.close()


@pytest.fixture
def fresh_user():
    """A user id no other scenario has used; its bucket is deleted afterwards."""
    import redis  # noqa: PLC0415

    user_id = uuid.uuid4().int % 10**15
    yield user_id
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(bucket_key("user", user_id, "rpm"))
    client.close()


def test_pf_r4_twenty_requests_round_robin_across_two_processes_allow_exactly_10(
    workers, fresh_user
):
    """PF-R4, round-robin: requests alternate between the processes, one at a time."""
    outcomes = []
    for i in range(20):
        worker = workers[i % 2]
        worker.send({"user_id": fresh_user, "rpm": 10, "count": 1, "at": 0})
        outcomes.extend(worker.receive())
    allowed = [ok for ok, _ in outcomes]
    assert allowed == [True] * 10 + [False] * 10
    assert all(retry_after >= 1 for ok, retry_after in outcomes if not ok)


def test_pf_r4_twenty_simultaneous_requests_from_two_processes_allow_exactly_10(
    workers, fresh_user
):
    """PF-R4, simultaneous: both processes release 10 concurrent takes at the same instant."""
    at = time.time() + 0.5
    for worker in workers:
        worker.send({"user_id": fresh_user, "rpm": 10, "count": 10, "at": at})
    outcomes = [outcome for worker in workers for outcome in worker.receive()]
    assert len(outcomes) == 20
    assert sum(ok for ok, _ in outcomes) == 10
    assert all(retry_after >= 1 for ok, retry_after in outcomes if not ok)
