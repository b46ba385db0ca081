"""The shipped nginx site (deploy/nginx.conf) in front of uvicorn: streaming survives the proxy.

A real nginx (Debian's package, ``make nginx``) runs as a child process on a free loopback port
with the shipped file, its placeholders filled in, proxying to the session's uvicorn server.
Checks: PF-S3 through nginx (a gzip-accepting client gets token 1 before a 2 s engine stall
ends, uncompressed), a real answer streams through token by token, closing the client at nginx
aborts the engine request, and pages/static files are compressed and served from disk.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test import override_settings

from tests.conftest import PASSWORD

pytestmark = pytest.mark.real_engine  # uses the shared uvicorn server

ROOT = Path(__file__).resolve().parents[2]
SITE_CONF = ROOT / "deploy" / "nginx.conf"
PROBE_FILE = "nginx-probe.txt"  # only in the collected static root, never in the app


@dataclass
class Nginx:
    url: str
    port: int
    static_root: Path
    log_dir: Path
    pid: int
    upstream_port: int

    def upstream_connections(self) -> list:
        """nginx's open TCP connections to uvicorn (its workers', from /proc via psutil)."""
        workers = psutil.Process(self.pid).children()
        return [
            c
            for w in workers
            for c in w.net_connections(kind="tcp")
            if c.raddr
            and c.raddr.port == self.upstream_port
            and c.status == psutil.CONN_ESTABLISHED
        ]

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def login(self, username: str, headers: dict[str, str] | None = None) -> httpx.Client:
        """A client signed in through nginx, posting the login form the way a browser does
        (with an Origin header, which Django's CSRF check compares with the proxied Host);
        ``headers``: more headers on every request of the client."""
        client = self.client()
        client.headers.update(headers or {})
        assert client.get("/accounts/login/").status_code == 200
        response = client.post(
            "/accounts/login/",
            data={
                "username": username,
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
            headers={"Origin": self.url},
        )
        assert response.status_code == 302, response.text
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
        client.headers["Origin"] = self.url
        return client

    def error_log(self) -> str:
        path = self.log_dir / "nginx.stderr"
        return path.read_text(errors="replace") if path.exists() else ""


def _nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if found is None:
        pytest.fail("nginx is missing: run `make nginx` (apt-get install nginx-light)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_site(*, listen: str, upstream: str, static_root: Path, server_name: str = "_") -> str:
    """The shipped site with its ``{{NAME}}`` placeholders filled in on every line that is not
    a comment, as deploy/README.md's sed command does."""
    values = {
        "LISTEN": listen,
        "UPSTREAM": upstream,
        "STATIC_ROOT": str(static_root),
        "SERVER_NAME": server_name,
    }
    lines = SITE_CONF.read_text().splitlines(keepends=True)
    used = set()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            continue
        for name, value in values.items():
            if "{{" + name + "}}" in line:
                used.add(name)
                line = line.replace("{{" + name + "}}", value)
        assert "{{" not in line, f"unknown placeholder in deploy/nginx.conf: {line!r}"
        lines[i] = line
    assert used == set(values), f"placeholders not used: {set(values) - used}"
    return "".join(lines)


def _main_conf(binary: str, tmp: Path, site: Path) -> str:
    """A minimal main nginx.conf around the site, like Debian's /etc/nginx/nginx.conf (mime
    types, sendfile), with every path nginx writes under ``tmp``."""
    built = subprocess.run([binary, "-V"], capture_output=True, text=True).stderr
    temp_paths = [f"client_body_temp_path {tmp}/client_body;", f"proxy_temp_path {tmp}/proxy;"]
    for module in ("fastcgi", "uwsgi", "scgi"):
        if f"--without-http_{module}_module" not in built:
            temp_paths.append(f"{module}_temp_path {tmp}/{module};")
    # As root, workers would run as `nobody`, which cannot read pytest's 0700 temp folders.
    user = "user root;" if os.geteuid() == 0 else ""
    temp = "\n    ".join(temp_paths)
    return f"""
{user}
worker_processes 1;
events {{ worker_connections 256; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    access_log {tmp}/access.log;
    {temp}
    include {site};
}}
"""


@pytest.fixture(scope="module")
def nginx(chat_server, tmp_path_factory) -> Iterator[Nginx]:
    """nginx in the foreground, as a child of this process, in front of the shared uvicorn."""
    binary = _nginx_binary()
    tmp = tmp_path_factory.mktemp("nginx")
    static_root = tmp / "staticfiles"
    with override_settings(STATIC_ROOT=static_root):
        call_command("collectstatic", interactive=False, verbosity=0)
    (static_root / PROBE_FILE).write_text("served from STATIC_ROOT by nginx\n")
    upstream = urlsplit(chat_server.url).netloc
    stderr_path = tmp / "nginx.stderr"
    for _attempt in range(3):  # the free port may be taken between probing and binding
        port = _free_port()
        site = tmp / "chatsite.conf"
        site.write_text(
            render_site(listen=f"127.0.0.1:{port}", upstream=upstream, static_root=static_root)
        )
        conf = tmp / "nginx.conf"
        conf.write_text(_main_conf(binary, tmp, site))
        with stderr_path.open("ab") as stderr:
            process = subprocess.Popen(
                [binary, "-e", "stderr", "-p", str(tmp), "-c", str(conf),
                 "-g", f"daemon off; pid {tmp}/nginx.pid; error_log stderr;"],
                stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        else:
            if process.poll() is None:
                process.kill()
                process.wait()
            continue
        break
    else:
        pytest.fail(f"nginx did not start:\n{stderr_path.read_text(errors='replace')}")
    try:
        yield Nginx(
            url=f"http://127.0.0.1:{port}",
            port=port,
            static_root=static_root,
            log_dir=tmp,
            pid=process.pid,
            upstream_port=urlsplit(chat_server.url).port,
        )
    finally:
        process.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_turn(client: httpx.Client, content: str = "hi") -> str:
    """Post a message as htmx does; return the answer's event-stream URL from the fragment."""
    response = client.post("/chat/turns", data={"content": content}, headers={"HX-Request": "true"})
    assert response.status_code == 200, response.text
    return re.search(r'sse-connect="([^"]+)"', response.text).group(1)


def raw_stream_until_first_token(nginx: Nginx, client: httpx.Client, url: str) -> socket.socket:
    """Open the event stream on a raw socket to nginx and read until the first token event."""
    sock = socket.create_connection(("127.0.0.1", nginx.port))
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    sock.sendall(
        f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{nginx.port}\r\nCookie: {cookie}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    sock.settimeout(30)
    received = b""
    while b"event: token" not in received:
        chunk = sock.recv(4096)
        assert chunk, f"nginx closed the stream before a token: {received!r}"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    return sock


def test_pf_s3_first_token_arrives_through_nginx_before_the_stall_ends(
    nginx, live, engine_double, make_user
):
    """PF-S3 (nginx half): a client that accepts gzip, an engine that emits token 1 then stalls
    2 s: behind the shipped config token 1 still arrives long before the stall ends, and the
    stream is neither compressed nor buffered."""
    engine_double.scripts = [["first", 2.0, "second"]]
    make_user("nina")
    with contextlib.closing(nginx.login("nina")) as client:
        url = start_turn(client)
        started = time.monotonic()
        arrivals: dict[str, float] = {}
        with client.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as response:
            assert response.status_code == 200
            headers = response.headers
            for line in response.iter_lines():  # httpx would decode gzip here, if any
                if '"text":"first"' in line:
                    arrivals["first"] = time.monotonic() - started
                if '"text":"second"' in line:
                    arrivals["second"] = time.monotonic() - started
                if line.startswith("event: done"):
                    break
    assert arrivals["first"] < 1.0, arrivals
    assert arrivals["second"] >= 1.8, arrivals
    assert "Content-Encoding" not in headers
    assert headers["Content-Type"].startswith("text/event-stream")
    assert "X-Accel-Buffering" not in headers  # nginx acts on it and does not pass it on


def test_a_real_answer_streams_through_nginx_token_by_token(nginx, live, make_user, settings):
    """The real engine behind nginx: the first token reaches the client while the model is
    still generating, and many token events arrive one by one before ``done``."""
    settings.CHAT_MAX_TOKENS = 64  # enough to see it stream, short enough to be quick
    make_user("olga")
    with contextlib.closing(nginx.login("olga")) as client:
        url = start_turn(client, "Write a long story about a lighthouse keeper and a storm.")
        started = time.monotonic()
        token_times: list[float] = []
        done_at = None
        with client.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as response:
            assert "Content-Encoding" not in response.headers
            for line in response.iter_lines():
                if line.startswith("event: token"):
                    token_times.append(time.monotonic() - started)
                    if len(token_times) == 1:
                        unfinished_at_first_token = live.unfinished()
                if line.startswith("event: done"):
                    done_at = time.monotonic() - started
                    break
    assert done_at is not None
    assert len(token_times) >= 20, token_times
    assert unfinished_at_first_token >= 1  # the engine was still generating
    # Streamed, not delivered in one lump at the end: the first token comes well before done,
    # and the arrivals are spread over the generation.
    assert done_at - token_times[0] >= 0.5, (token_times[0], done_at)
    assert token_times[len(token_times) // 2] - token_times[0] >= 0.2, token_times


def test_closing_the_client_at_nginx_aborts_the_engine_request(
    nginx, live, engine_double, make_user, settings
):
    """The client goes away at nginx while the view waits for the next token: nginx closes its
    uvicorn connection and the engine request is aborted within a second."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 0
    engine_double.scripts = [["first", 30.0, "never"]]
    make_user("pavel")
    with contextlib.closing(nginx.login("pavel")) as client:
        url = start_turn(client)
        sock = raw_stream_until_first_token(nginx, client, url)
        time.sleep(0.2)  # now the view is parked waiting for the next token
        assert engine_double.aborted == {}
        sock.close()
        closed_at = time.monotonic()
        while not engine_double.aborted and time.monotonic() - closed_at < 2.0:
            time.sleep(0.01)
    assert engine_double.aborted, f"not aborted within 2 s\n{nginx.error_log()}"
    assert next(iter(engine_double.aborted.values())) - closed_at < 1.0


def test_closing_the_client_at_nginx_aborts_a_real_generation(nginx, live, make_user, settings):
    """Same with the real engine: its unfinished request count returns to where it was, and the
    partial answer is stored as cancelled."""
    from conversations.models import Turn  # noqa: PLC0415

    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 0
    baseline = live.unfinished()
    make_user("quinn")
    with contextlib.closing(nginx.login("quinn")) as client:
        url = start_turn(client, "Write a very long essay on the history of the printing press.")
        sock = raw_stream_until_first_token(nginx, client, url)
        assert live.unfinished() == baseline + 1
        sock.close()
        closed_at = time.monotonic()
        while live.unfinished() != baseline and time.monotonic() - closed_at < 2.0:
            time.sleep(0.02)
    assert live.unfinished() == baseline, "the real engine request was not aborted within 2 s"
    live.drain()
    answer = Turn.objects.get(conversation__owner__username="quinn", role=Turn.Role.ASSISTANT)
    assert answer.status == Turn.Status.CANCELLED


def test_pages_are_compressed_and_static_files_come_from_disk(nginx, live):
    """Pages and scripts are gzip-compressed for a client that accepts it (unlike event
    streams), and /static/ is served by nginx from the collected static root."""
    with nginx.client(headers={"Accept-Encoding": "gzip"}) as client:
        # (Django's GZip middleware may already have compressed the page; nginx passes it on.)
        page = client.get("/accounts/login/")
        assert page.status_code == 200
        assert page.headers["Content-Encoding"] == "gzip"
        assert "csrfmiddlewaretoken" in page.text

        script = client.get("/static/chat/chat.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["Content-Type"]
        # Compressed by nginx (uvicorn's static handler never compresses), cached for an hour.
        assert script.headers["Content-Encoding"] == "gzip"
        assert "max-age=3600" in script.headers["Cache-Control"]
        assert script.content == (ROOT / "static" / "chat" / "chat.js").read_bytes()

        for path in ("/static/vendor/htmx-2.0.11.min.js", "/static/vendor/htmx-ext-sse-2.2.4.js"):
            assert client.get(path).status_code == 200, path

        # A file that exists only in the collected root: nginx serves it from disk, not uvicorn.
        probe = client.get(f"/static/{PROBE_FILE}")
        assert probe.status_code == 200
        assert probe.text == (nginx.static_root / PROBE_FILE).read_text()

        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["ready"] is True
    # The raw bytes really are gzip (httpx decoded them above).
    script_url = nginx.url + "/static/chat/chat.js"
    with httpx.stream("GET", script_url, headers={"Accept-Encoding": "gzip"}) as response:
        body = b"".join(response.iter_raw())
    assert gzip.decompress(body) == (ROOT / "static" / "chat" / "chat.js").read_bytes()
    assert django_settings.STATIC_ROOT != nginx.static_root  # the override did not leak


def test_upstream_connections_to_uvicorn_are_kept_alive_and_reused(nginx, live):
    """HTTP/1.1 keepalive to uvicorn: sequential requests from separate clients reuse one idle
    upstream connection instead of a new TCP connection each."""
    for _ in range(3):
        with nginx.client() as client:  # a new client connection to nginx every time
            assert client.get("/healthz").status_code == 200
    # Idle, yet still open: kept for the next request (earlier tests may have left more).
    kept = {c.laddr.port for c in nginx.upstream_connections()}
    assert kept
    for _ in range(5):
        with nginx.client() as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/accounts/login/").status_code == 200
    # No new upstream connection was opened for those 10 requests.
    after = {c.laddr.port for c in nginx.upstream_connections()}
    assert after and after <= kept, (kept, after)


def test_the_client_address_behind_nginx_is_the_one_nginx_saw_not_one_the_client_wrote(
    nginx, live, make_user
):
    """Behind the shipped nginx the app's client address (sign-in throttling, the sessions
    page) is nginx's ``$remote_addr``: a client that sends its own ``X-Forwarded-For`` and
    ``X-Real-IP`` must not choose the address its sign-ins count against
    (chatsite/serve.py, accounts/request_info.py)."""
    from accounts.models import UserSession

    user = make_user("olga")
    spoofed = {"X-Forwarded-For": "203.0.113.66", "X-Real-IP": "203.0.113.66"}
    with contextlib.closing(nginx.login("olga", headers=spoofed)):
        pass
    assert list(UserSession.objects.filter(user=user).values_list("ip", flat=True)) == ["127.0.0.1"]
