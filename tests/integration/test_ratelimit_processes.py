"""PF-R4: many server processes share one rate limit exactly (inference/ratelimit.py).

Two OS processes (each a Python interpreter with its own Django setup, asyncio loop and Redis
connection pool, as two gateway processes have) take from the same user's RPM bucket on the
test Redis, on Redis's own clock (no injected ``now``). RPM = 10; each scenario has a fresh
bucket: 20 requests sent round-robin across the processes, and 20 sent at the same moment (10
concurrent in each process, released together): exactly 10 succeed each time.

The same over HTTP: two uvicorn server processes (the production server, scripted engine)
answer /v1/chat/completions, 20 requests round-robin and 20 simultaneous: exactly 10 get 200
and 10 a 429 with Retry-After >= 1. And PF-R1 / PF-R2 over HTTP: streamed and non-streamed
requests draw the same TPM bucket by the same amount (prompt + max_tokens reserved, refunded
to prompt + completion), the fourth ~300-token turn under TPM 1000 is a real 429 (not a 200
then an error event), and the remaining-token headers fall by what was used.

A limiter that read the bucket and wrote it back in two steps, or kept counts per process,
lets more than 10 through here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from django.conf import settings

from accounts.services import api_key_create
from inference.ratelimit import bucket_key
from tests.processes import server_process

# One worker process: reads one JSON command a line, answers one JSON line.
#   {"warm": n}                                       -> opens n Redis connections, loads the script
#   {"user_id": id, "rpm": r, "count": n, "at": t}    -> at wall time t, n concurrent takes;
#                                                        answers [[allowed, retry_after_s], ...]
WORKER = r"""
import asyncio, json, sys, time
import django
django.setup()
from core import redis_guard
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


# --- over HTTP: two daphne gateways (PF-R4) and the TPM bucket for both kinds of request (PF-R1) --
#
# Two production server processes (chatsite.serve) on the test database and Redis, with the
# scripted engine double (an instant answer of 4 tokens) and these limits: free RPM 10 (PF-R4),
# paid TPM 1000 (PF-R1), enterprise TPM 2000 (PF-R2). Each test makes its own users: fresh
# buckets.

GATEWAY_LIMITS = {
    "free": {"rpm": 10, "tpm": None},
    "paid": {"rpm": None, "tpm": 1000},
    "enterprise": {"rpm": None, "tpm": 2000},
}


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    body: str
    usage: dict | None  # the response's OpenAI usage (streamed: the include_usage chunk)


@pytest.fixture(scope="module")
def gateways(django_db_setup) -> Iterator[list[str]]:
    """The URLs of two uvicorn server processes sharing the test Redis."""
    env = {
        "CHAT_ENGINE_CLASS": "tests.fakes.ScriptedEngine",
        "CHAT_RATE_LIMITS_BY_TIER": json.dumps(GATEWAY_LIMITS),
        "CHAT_SHED_FREE_WAITING": "1000",  # nothing here may be shed: only the limits refuse
    }
    with server_process(env, "/readyz") as first:
        with server_process(env, "/readyz") as second:
            yield [first, second]


@pytest.fixture
def api_key(transactional_db, make_user):
    """``api_key(tier)``: the raw API key of a new user of ``tier`` (fresh buckets)."""

    def issue(tier: str) -> str:
        user = make_user(tier=tier)
        return api_key_create(user=user, name="rate limit test").raw

    return issue


def chat(
    client: httpx.Client, key: str, *, model: str, words: int, max_tokens: int, stream: bool
) -> Reply:
    """POST /v1/chat/completions with a user message of ``words`` words (the scripted engine
    counts one token a word, plus 3 for the chat template)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key}"}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200 or not stream:
            text = response.read().decode()
            usage = json.loads(text).get("usage") if response.status_code == 200 else None
            return Reply(response.status_code, response.headers, text, usage)
        lines, usage = [], None
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        return Reply(response.status_code, response.headers, "\n".join(lines), usage)


def at_once(calls: list) -> list:
    """Run each zero-argument callable in its own thread, released together by a barrier;
    return their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(30)
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def warm_clients(urls: list[str], n: int) -> list[httpx.Client]:
    """``n`` clients round-robin over ``urls``, each with its connection already open (a GET of
    the public OpenAPI document, not rate-limited), so a barrier releases requests, not
    handshakes."""
    clients = [httpx.Client(base_url=urls[i % len(urls)], timeout=60) for i in range(n)]
    for client in clients:
        assert client.get("/v1/openapi.json").status_code == 200
    return clients


def assert_refused_with_retry_after(reply: Reply) -> int:
    """A real 429 (JSON error, no event stream) with an integer Retry-After >= 1; returns it."""
    assert reply.status == 429, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    assert json.loads(reply.body)["error"]["type"] == "rate_limited"
    assert "data:" not in reply.body
    retry_after = reply.headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1, retry_after
    return int(retry_after)


def test_pf_r4_http_twenty_requests_round_robin_across_two_gateways_allow_exactly_10(
    gateways, api_key
):
    """PF-R4 over HTTP, round-robin: RPM 10; 20 non-streamed requests alternate between the two
    server processes, one at a time: the first 10 get 200, the other 10 a 429 with
    Retry-After >= 1 (RPM 10 refills one request per 6 s; the run takes well under that)."""
    key = api_key("free")
    clients = warm_clients(gateways, 2)
    started = time.monotonic()
    replies = [
        chat(clients[i % 2], key, model="mini", words=5, max_tokens=8, stream=False)
        for i in range(20)
    ]
    elapsed = time.monotonic() - started
    assert elapsed < 6, f"20 requests took {elapsed:.1f} s: a request refilled meanwhile"
    assert [r.status for r in replies] == [200] * 10 + [429] * 10, [r.body for r in replies]
    for reply in replies[10:]:
        assert_refused_with_retry_after(reply)
    assert [int(r.headers["X-RateLimit-Remaining-Requests"]) for r in replies[:10]] == list(
        range(9, -1, -1)
    )


def test_pf_r4_http_twenty_simultaneous_requests_on_two_gateways_allow_exactly_10(
    gateways, api_key
):
    """PF-R4 over HTTP, simultaneous: 20 requests (10 to each server process) released at once
    by a barrier: exactly 10 get 200 and 10 a 429 with Retry-After >= 1."""
    key = api_key("free")
    clients = warm_clients(gateways, 20)
    replies = at_once(
        [
            lambda c=c: chat(c, key, model="mini", words=5, max_tokens=8, stream=False)
            for c in clients
        ]
    )
    statuses = sorted(r.status for r in replies)
    assert statuses == [200] * 10 + [429] * 10, [r.body for r in replies]
    for reply in replies:
        if reply.status == 429:
            assert_refused_with_retry_after(reply)


PF_R1_WORDS, PF_R1_MAX_TOKENS = 280, 17  # 283 prompt tokens + max_tokens 17 = 300 reserved


def test_pf_r1_http_concurrent_streamed_and_plain_turns_the_fourth_is_a_real_429(
    gateways, api_key
):
    """PF-R1 over HTTP: TPM 1000; four ~300-token requests, two streamed and two not, sent at
    the same moment to both servers: three get 200, the fourth a real 429 (a JSON error with
    Retry-After, never a 200 followed by an error event)."""
    key = api_key("paid")
    clients = warm_clients(gateways, 4)
    replies = at_once(
        [
            lambda c=c, s=stream: chat(
                c, key, model="frontier", words=PF_R1_WORDS, max_tokens=PF_R1_MAX_TOKENS, stream=s
            )
            for c, stream in zip(clients, [True, False, True, False], strict=True)
        ]
    )
    assert sorted(r.status for r in replies) == [200, 200, 200, 429], [r.body for r in replies]
    for reply in replies:
        if reply.status == 200:
            assert reply.usage["prompt_tokens"] + PF_R1_MAX_TOKENS == 300
        else:
            assert_refused_with_retry_after(reply)


@pytest.mark.parametrize("order", [("stream", "plain"), ("plain", "stream")])
def test_pf_r1_http_streamed_and_plain_turns_draw_the_same_bucket_by_the_same_amount(
    gateways, api_key, order
):
    """PF-R1 over HTTP, one after another: TPM 1000 (16.7 tokens a second of refill); turns of
    283 prompt tokens + max_tokens 17, alternating streamed and non-streamed. Each charges
    prompt + max_tokens up front and is refunded down to prompt + completion afterwards, so
    X-RateLimit-Remaining-Tokens after turn k is 1000 - (the earlier turns' prompt +
    completion) - 300, plus what refilled meanwhile; the fourth turn is refused with a 429
    whose Retry-After is the refill time of the missing tokens (PF-R3)."""
    key = api_key("paid")
    client = warm_clients(gateways, 1)[0]
    kinds = [order[i % 2] for i in range(4)]
    refill_per_s = 1000 / 60
    used, replies = 0, []
    started = time.monotonic()
    for kind in kinds[:3]:
        reply = chat(client, key, model="frontier", words=PF_R1_WORDS,
                     max_tokens=PF_R1_MAX_TOKENS, stream=kind == "stream")  # fmt: skip
        assert reply.status == 200, reply.body
        elapsed = time.monotonic() - started
        expected = 1000 - used - 300
        remaining = int(reply.headers["X-RateLimit-Remaining-Tokens"])
        assert expected <= remaining <= expected + refill_per_s * elapsed + 1, (kind, remaining)
        used += reply.usage["prompt_tokens"] + reply.usage["completion_tokens"]
        assert reply.usage["completion_tokens"] < PF_R1_MAX_TOKENS  # something was refunded
        replies.append(reply)
    fourth = chat(client, key, model="frontier", words=PF_R1_WORDS,
                  max_tokens=PF_R1_MAX_TOKENS, stream=kinds[3] == "stream")  # fmt: skip
    elapsed = time.monotonic() - started
    retry_after = assert_refused_with_retry_after(fourth)
    remaining = int(fourth.headers["X-RateLimit-Remaining-Tokens"])
    assert 1000 - used <= remaining <= 1000 - used + refill_per_s * elapsed + 1
    assert retry_after == math.ceil((300 - remaining) / refill_per_s) or retry_after == math.ceil(
        (300 - remaining - 1) / refill_per_s
    ), (retry_after, remaining)


def test_pf_r2_http_a_1900_token_prompt_twice_is_refused_and_remaining_falls_by_what_was_used(
    gateways, api_key
):
    """PF-R2 over HTTP: TPM 2000 (enterprise here); a 1,900-token prompt with max_tokens 10,
    twice: the first answers, the second is a 429; its X-RateLimit-Remaining-Tokens is 2000 -
    (prompt + completion tokens of the first), plus what refilled meanwhile."""
    key = api_key("enterprise")
    client = warm_clients(gateways, 1)[0]
    started = time.monotonic()
    first = chat(client, key, model="frontier", words=1897, max_tokens=10, stream=False)
    assert first.status == 200, first.body
    assert first.usage["prompt_tokens"] == 1900
    first_remaining = int(first.headers["X-RateLimit-Remaining-Tokens"])
    assert 90 <= first_remaining <= 90 + 2000 / 60 * (time.monotonic() - started) + 1
    second = chat(client, key, model="frontier", words=1897, max_tokens=10, stream=True)
    elapsed = time.monotonic() - started
    assert_refused_with_retry_after(second)
    used = first.usage["prompt_tokens"] + first.usage["completion_tokens"]
    remaining = int(second.headers["X-RateLimit-Remaining-Tokens"])
    assert 2000 - used <= remaining <= 2000 - used + 2000 / 60 * elapsed + 1
