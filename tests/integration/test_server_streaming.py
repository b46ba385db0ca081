"""Streaming behaviour under the production ASGI server (uvicorn, chatsite/serve.py), with the
engine double so the timing is scripted: PF-S3 (no buffering, no gzip) and PF-C2 (idle generator cancellation)."""

from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.real_engine  # uses the shared uvicorn server


@pytest.fixture
def live_double(live, engine_double):
    """The shared uvicorn server with the scripted engine installed (after the real one)."""
    return live, engine_double


def start_turn(client, content="hi") -> str:
    response = client.post("/chat/turns", data={"content": content}, headers={"HX-Request": "true"})
    assert response.status_code == 200, response.text
    return re.search(r'sse-connect="([^"]+)"', response.text).group(1)


def test_pf_s3_first_token_arrives_before_the_stall_ends_with_gzip_requested(
    live_double, make_user
):
    """PF-S3 (production-server half): the full middleware stack (GZip included), a client that
    accepts gzip, an engine that emits token 1 then stalls 2 s: token 1 reaches the client long before
    the stall ends, and the stream is not compressed."""
    live, double = live_double
    double.scripts = [["first", 2.0, "second"]]
    make_user("gina")
    client = live.login("gina")
    url = start_turn(client)
    started = time.monotonic()
    arrivals = {}
    with client.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as response:
        assert "Content-Encoding" not in response.headers
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if '"text":"first"' in line:
                arrivals["first"] = time.monotonic() - started
            if '"text":"second"' in line:
                arrivals["second"] = time.monotonic() - started
            if line.startswith("event: done"):
                break
    assert arrivals["first"] < 1.0
    assert arrivals["second"] >= 1.8


def test_pf_c2_closing_the_socket_while_the_view_waits_cancels_within_1s(
    live_double, make_user, settings
):
    """PF-C2: the view is idle, waiting for the next token; the client closes its socket; the
    cancellation path (engine abort) runs within 1 s under uvicorn."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 0
    live, double = live_double
    double.scripts = [["first", 30.0, "never"]]
    make_user("hank")
    client = live.login("hank")
    url = start_turn(client)
    parts = urlsplit(live.url)
    sock = socket.create_connection((parts.hostname, parts.port))
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {parts.netloc}\r\nCookie: {cookie}\r\n\r\n".encode())
    received = b""
    sock.settimeout(5)
    while b'"text":"first"' not in received:
        received += sock.recv(4096)
    time.sleep(0.2)  # now the view is parked waiting for the next token
    assert double.aborted == {}

    sock.close()
    closed_at = time.monotonic()
    while not double.aborted and time.monotonic() - closed_at < 1.0:
        time.sleep(0.01)
    assert double.aborted, "the engine request was not aborted within 1 s"
    assert next(iter(double.aborted.values())) - closed_at < 1.0


def test_static_assets_are_served_by_the_asgi_app(live):
    """The page's scripts load under uvicorn (htmx, its SSE extension, the chat script)."""
    import httpx

    for path in (
        "/static/vendor/htmx-2.0.11.min.js",
        "/static/vendor/htmx-ext-sse-2.2.4.js",
        "/static/chat/chat.js",
    ):
        response = httpx.get(live.url + path)
        assert response.status_code == 200, path
        assert "javascript" in response.headers["Content-Type"]


def test_open_streams_and_generation_tasks_hold_no_database_sessions(
    live_double, make_user, settings
):
    """An open event stream must not pin a PostgreSQL session for its whole life, and
    generation tasks (which outlive their request) must not leak one each: with max_connections
    ~100, the benchmark hit "too many clients already" at 32 concurrent chats. More streams are
    held open at once than the process's connection pool has connections, and the server's
    sessions stay within the pool's size."""
    import concurrent.futures
    import threading

    from django.db import connection

    live, double = live_double
    double.default_script = ["a", 8.0, "b"]
    double.max_num_seqs = 1000  # the gateway's admission queue admits them all at once
    # One user opens more chats at once than a free tier's RPM allows: this test is about
    # database sessions, not rate limits.
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": None, "tpm": None}}
    # Nor about the input gate: ~30 checks at once share 2 cores with the streams here, and a
    # check held past its 1 s timeout would refuse the turn (issue 28's harm classifier costs
    # ~10 ms of CPU per short message; contention stretches that, see docs/moderation.md).
    settings.CHAT_MODERATION_TIMEOUT_S = 10
    make_user("ivy")
    client = live.login("ivy")

    def sessions() -> int:  # called from this thread only (each thread has its own session)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    pool_max = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
    streams = pool_max + 10
    waiting = threading.Semaphore(0)

    def chat(i):
        url = start_turn(client, f"message {i}")
        with client.stream("GET", url) as response:
            for line in response.iter_lines():
                if '"text":"a"' in line:
                    waiting.release()  # this stream is open, waiting for the next token
                if line.startswith("event: done"):
                    return True
        return False

    before = sessions()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        results = pool.map(chat, range(streams))
        # Every stream must be open at the same time, well inside the 8 s pause: a stream
        # that held a pooled connection would make the later ones wait for the pool.
        deadline = time.monotonic() + 6
        for _ in range(streams):
            assert waiting.acquire(timeout=max(deadline - time.monotonic(), 0.01)), (
                "streams queued for the pool"
            )
        during = sessions()
        assert all(results)
    live.drain()
    time.sleep(0.3)
    assert during <= before + pool_max, (before, during)
    assert sessions() <= before + pool_max


def _transport_backlog(server, path: str) -> tuple[int, bool | None]:
    """Bytes uvicorn has written for the response to ``path`` that the socket has not taken
    yet (the asyncio transport's write buffer), and whether its protocol's write flow control
    is paused now (None: no such connection)."""
    for protocol in list(server.server.server_state.connections):
        cycle = getattr(protocol, "cycle", None)
        if cycle is not None and cycle.scope["path"] == path.split("?")[0]:
            return protocol.transport.get_write_buffer_size(), protocol.flow.write_paused
    return -1, None


def test_a_client_that_never_reads_costs_the_gateway_one_buffer_not_the_answer(
    live_double, make_user, settings
):
    """A client that stops reading mid-answer (issue 3: "the server's memory stays bounded;
    events wait in Redis, not in the gateway"). A server without write flow control (daphne's
    plain one) buffers the whole unread answer; uvicorn's pauses the response's ``send()``.
    Generation is not held back: the answer is stored in full, another user's stream flows meanwhile, and the gateway
    holds at most about one transport buffer (64 KiB) plus one chunk for the stalled client
    (the kernel's socket buffers are not the process's memory)."""
    import socket as socketlib

    from conversations.models import Turn

    live, double = live_double
    settings.CHAT_MAX_TOKENS_CEILING_BY_TIER = {"free": 8000}
    settings.CHAT_MAX_TOKENS = 8000
    # A 4,000-token answer: above the default pools' answer ceilings.
    settings.CHAT_POOLS = [
        {**p, "max_context": 4096, "max_tokens": 4000} for p in settings.CHAT_POOLS
    ]
    # ~8 MB of events: more than the kernel's socket buffers take on loopback (the send buffer
    # autotunes up to net.ipv4.tcp_wmem's maximum, 4 MiB here, and absorbed a 2.6 MB answer
    # whole), so the server's own write path has to hold back.
    big = ["x" * 2000] * 4000
    settings.CHAT_MODERATION_OUTPUT = False  # not what is measured (and "xxx..." gets flagged)
    double.scripts = [big, ["other", " answer"]]
    make_user("slow")
    make_user("fast")
    slow = live.login("slow")
    url = start_turn(slow, "a long one")
    parts = urlsplit(live.url)
    sock = socketlib.socket()
    sock.setsockopt(socketlib.SOL_SOCKET, socketlib.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    cookie = "; ".join(f"{k}={v}" for k, v in slow.cookies.items())
    sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {parts.netloc}\r\nCookie: {cookie}\r\n\r\n".encode())
    sock.recv(1024)  # the stream started; now this client never reads again

    fast = live.login("fast")
    other = start_turn(fast, "quick one")
    with fast.stream("GET", other) as response:
        body = "\n".join(response.iter_lines())
    assert "event: done" in body and '"text":" answer"' in body

    question_id = url.split("/")[4]
    deadline = time.monotonic() + 30
    while not Turn.objects.filter(reply_to_id=question_id).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    answer = Turn.objects.get(reply_to_id=question_id)
    assert answer.status == Turn.Status.COMPLETE
    assert len(answer.content) == 2000 * 4000

    backlog, paused = live.call(_async(_transport_backlog, live.server, url))
    assert paused is True
    assert 0 <= backlog < 256 * 1024, f"gateway buffers {backlog} bytes for a stalled client"
    sock.close()


async def _async(fn, *args):
    return fn(*args)
