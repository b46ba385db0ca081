"""The production run mode, end to end: ``python -m chatsite.prodstack run`` with
``chatsite.settings.production`` (secrets from the environment), on the test database and Redis.

What runs (each a real process): the engine process (uvicorn; the scripted engine double stands
in for vLLM so turns are quick and their text known), three gateways with no engine of their
own that reach it over its OpenAI-compatible ``/v1`` with the service key, a Celery worker and
beat, and a real nginx with the shipped site (deploy/nginx.conf, three upstream servers) and
TLS (deploy/nginx-tls.conf, a self-signed certificate this test trusts). Everything is asked
through nginx over HTTPS unless a test says otherwise. tests/integration/test_production_real.py
runs a turn through the same mode against the real engine.

The engine-less gateways build prompts with the real model folder's tokenizer, so this module
needs the converted model like the real-engine tests (hence the marker).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.management import call_command

from tests.conftest import PASSWORD
from tests.processes import database_url

# real_engine: needs the converted model's tokenizer (see above). django_db: the test database
# is set up for this module (the stack's processes use it); the stack's own writes are committed,
# and nothing is flushed between tests (the module fixture flushes at the end).
pytestmark = [pytest.mark.real_engine, pytest.mark.django_db]

ROOT = Path(__file__).resolve().parents[2]
# The first token waits a second, so the answer is still being written when the client opens
# its event stream (a finished answer's stream is just `done` with the stored HTML).
SCRIPT = [1.0, "Hello", 0.1, " from", 0.1, " the", 0.1, " engine", " process", "."]
ANSWER = "Hello from the engine process."
PROBE_FILE = "prodstack-probe.txt"  # only in the collected static root, never in the app


@dataclass
class ProdStack:
    url: str  # https://127.0.0.1:PORT (nginx, TLS)
    http_url: str  # http://127.0.0.1:PORT (nginx, plain HTTP)
    engine_url: str
    gateways: list[str]
    static_root: Path
    access_log: Path
    logs: Path
    cert: Path

    def client(self, **kwargs) -> httpx.Client:
        """An HTTPS client through nginx that trusts the stack's self-signed certificate."""
        context = ssl.create_default_context(cafile=str(self.cert))
        return httpx.Client(base_url=self.url, verify=context, timeout=60, **kwargs)

    def login(self, username: str) -> tuple[httpx.Client, httpx.Response]:
        """A client signed in through nginx with the login form, as a browser does it (Origin
        header); also returns the login response (its Set-Cookie headers)."""
        client = self.client()
        assert client.get("/accounts/login/").status_code == 200
        response = client.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
            headers={"Origin": self.url},
        )  # fmt: skip
        assert response.status_code == 302, (response.status_code, response.text[:2000])
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
        client.headers["Origin"] = self.url
        return client, response

    def access_log_lines(self) -> list[str]:
        return self.access_log.read_text(errors="replace").splitlines()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _create_user(username: str, **fields) -> None:
    """A user whose password the stack's processes can check: hashed with PBKDF2 (the test
    session's own hasher list holds only the fast MD5 one, which production does not accept);
    ``fields``: other User fields (``tier="paid"``)."""
    from accounts.models import User  # noqa: PLC0415

    User.objects.create(
        username=username, password=PBKDF2PasswordHasher().encode(PASSWORD, secrets.token_hex(8)), **fields
    )


@contextlib.contextmanager
def run_prodstack(tmp: Path, *, gateways: int, extra_args: list[str], extra_env: dict[str, str]) -> Iterator[ProdStack]:
    """``python -m chatsite.prodstack run`` on the test database and Redis; yields once its
    state file says everything is ready; stops it (SIGTERM, as Ctrl-C) afterwards."""
    state_file = tmp / "state.json"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": django_settings.REDIS_URL,
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DB_POOL_MAX": "4",
        # Retrieval would load the embedding model into every gateway: not what this tests.
        "CHAT_MEMORY_ENABLED": "0",
        **extra_env,
    }
    for name in ("CHAT_ENGINE_CLASS", "CHAT_ENGINE_URL", "CHAT_ENGINE_API_KEY", "DJANGO_DEBUG"):
        env.pop(name, None)
    log_path = tmp / "prodstack.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chatsite.prodstack", "run", "--gateways", str(gateways),
             "--base-port", "0", "--https-port", "0", "--http-port", "0",
             "--workdir", str(tmp / "work"), "--state-file", str(state_file),
             "--ready-timeout", "240", *extra_args],
            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    state: dict = {}
    try:
        deadline = time.monotonic() + 420
        while not state_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the production stack did not start:\n{log_path.read_text(errors='replace')[-6000:]}")
            time.sleep(0.5)
        state = json.loads(state_file.read_text())
        yield ProdStack(
            url=state["url"].rstrip("/"),
            http_url=state["http_url"].rstrip("/"),
            engine_url=state["engine_url"],
            gateways=state["gateways"],
            static_root=Path(state["static_root"]),
            access_log=Path(state["access_log"]),
            logs=Path(state["logs"]),
            cert=tmp / "work" / "nginx" / "tls-cert.pem",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in state.get("pids", {}).values():  # whatever the launcher left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[ProdStack]:
    """The production stack for this module: engine process (scripted double), 3 gateways,
    Celery worker and beat, nginx with TLS. The database is flushed afterwards."""
    from django.db import connection  # noqa: PLC0415

    with django_db_blocker.unblock():
        # Never run (and flush) against a real database: only a test database.
        assert connection.settings_dict["NAME"].startswith("test_"), connection.settings_dict["NAME"]
        for name in ("prod-anna", "prod-ben", "prod-cleo", "prod-dora"):
            _create_user(name)
    try:
        with run_prodstack(
            tmp_path_factory.mktemp("prodstack"),
            gateways=3,
            extra_args=["--engine-class", "tests.fakes.ScriptedEngine"],
            extra_env={"CHAT_SCRIPTED_ENGINE_SCRIPT": json.dumps(SCRIPT)},
        ) as running:
            (running.static_root / PROBE_FILE).write_text("served from STATIC_ROOT by nginx\n")
            yield running
    finally:
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


class _Markup(HTMLParser):
    """What a CSP without 'unsafe-inline' would block in a page: inline scripts, <style>
    elements, style="" attributes and on*="" handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.inline_scripts: list[str] = []
        self.script_srcs: list[str] = []
        self.style_elements = 0
        self.blocked_attributes: list[str] = []
        self._in_inline_script = False

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        if tag == "script":
            if names.get("src"):
                self.script_srcs.append(names["src"])
            elif names.get("type", "text/javascript") not in ("application/json", "application/ld+json"):
                self._in_inline_script = True
                self.inline_scripts.append("")
        if tag == "style":
            self.style_elements += 1
        for name, value in attrs:
            if name == "style" or name.startswith("on") or (name == "href" and (value or "").startswith("javascript:")):
                self.blocked_attributes.append(f"<{tag} {name}={value!r}>")

    def handle_data(self, data):
        if self._in_inline_script:
            self.inline_scripts[-1] += data

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_inline_script = False


def _csp(response: httpx.Response) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy", "")
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


def _stream_turn(client: httpx.Client, content: str, path: str = "/chat/turns") -> tuple[str, list[str], dict]:
    """Post a message as htmx does and read its answer stream to the end through nginx;
    returns (events URL, token texts, the done event's data)."""
    response = client.post(path, data={"content": content}, headers={"HX-Request": "true"})
    assert response.status_code == 200, response.text[:2000]
    url = re.search(r'sse-connect="([^"]+)"', response.text).group(1)
    tokens: list[str] = []
    done: dict = {}
    event = ""
    with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as stream:
        assert stream.status_code == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token":
                tokens.append(json.loads(line[6:])["text"])
            elif line.startswith("data: ") and event in ("done", "error"):
                done = {"event": event, **json.loads(line[6:])}
                break
    return url, tokens, done


def test_a_streamed_turn_goes_through_nginx_a_gateway_and_the_engine_process(stack):
    """Given the production stack; when a signed-in user sends a message through nginx; then
    the answer streams back token by token from the engine process (the gateways have no engine:
    the text is the engine double's script), ends with done, and the Celery worker writes it to
    PostgreSQL; the conversation page shows it after a reload."""
    from conversations.models import Turn  # noqa: PLC0415

    client, _ = stack.login("prod-anna")
    with contextlib.closing(client):
        url, tokens, done = _stream_turn(client, "Say hello through the whole stack.")
        assert tokens == ["Hello", " from", " the", " engine", " process", "."], (done, stack.log("engine"))
        assert done["event"] == "done" and done["status"] == "complete", done
        assert ANSWER in done["html"]

        deadline = time.monotonic() + 60
        while not Turn.objects.filter(turn_id=done["turn_id"]).exists():
            assert time.monotonic() < deadline, f"not written back:\n{stack.log('celery-worker')}"
            time.sleep(0.3)
        stored = Turn.objects.get(turn_id=done["turn_id"])
        assert (stored.role, stored.content, stored.status) == ("assistant", ANSWER, "complete")

        conversation_path = url.split("/turns/")[0] + "/"
        page = client.get(conversation_path)
        assert page.status_code == 200
        assert ANSWER in page.text
        assert "Content-Security-Policy" in page.headers


def test_pages_carry_a_csp_that_allows_no_inline_script_and_have_none(stack):
    """Every page a user sees has a Content-Security-Policy with script-src 'self' (no
    'unsafe-inline', no 'unsafe-eval'), style-src 'self', and its markup has nothing such a
    policy blocks: no inline <script>, no <style>, no style="" or on*="" attributes."""
    anonymous = stack.client()
    signed_in, _ = stack.login("prod-ben")
    pages = [(anonymous, "/accounts/login/"), (anonymous, "/accounts/signup/")] + [
        (signed_in, path)
        for path in ("/", "/settings/", "/settings/api-keys/", "/settings/memory/", "/usage/")
    ]
    with contextlib.closing(anonymous), contextlib.closing(signed_in):
        for client, path in pages:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)
            policy = _csp(response)
            assert policy.get("script-src") == ["'self'"], (path, policy)
            assert policy.get("style-src") == ["'self'"], (path, policy)
            assert policy.get("default-src") == ["'self'"], (path, policy)
            assert policy.get("frame-ancestors") == ["'none'"], (path, policy)
            header = response.headers["Content-Security-Policy"]
            assert "unsafe-inline" not in header and "unsafe-eval" not in header, (path, header)
            markup = _Markup()
            markup.feed(response.text)
            assert markup.inline_scripts == [], (path, markup.inline_scripts)
            assert markup.style_elements == 0, path
            assert markup.blocked_attributes == [], (path, markup.blocked_attributes)
            assert markup.script_srcs and all(src.startswith("/static/") for src in markup.script_srcs), path
            assert '"allowEval":false' in response.text, path  # htmx never evaluates strings


def test_static_files_come_from_nginx_not_a_gateway(stack):
    """/static/ is served by nginx from the collected static root: a file that exists only there
    (not in the app's static folders, where a gateway would look) is found, with nginx's
    one-hour caching, and the app's scripts are the repository's bytes."""
    with stack.client() as client:
        probe = client.get(f"/static/{PROBE_FILE}")
        assert probe.status_code == 200
        assert probe.text == (stack.static_root / PROBE_FILE).read_text()
        script = client.get("/static/chat/chat.js")
        assert script.status_code == 200
        assert script.content == (ROOT / "static" / "chat" / "chat.js").read_bytes()
        assert "javascript" in script.headers["Content-Type"]
        assert "max-age=3600" in script.headers["Cache-Control"]
        assert client.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200
    for gateway in stack.gateways:  # a gateway itself does not have the collected-only file
        assert httpx.get(f"{gateway}/static/{PROBE_FILE}", headers={"X-Forwarded-Proto": "https"}).status_code == 404


def test_requests_are_spread_over_every_gateway(stack):
    """Through nginx, consecutive requests are served by all three gateways (the access log
    names the upstream of each), and never by the engine process."""
    marker = len(stack.access_log_lines())
    for _ in range(12):
        with stack.client() as client:
            assert client.get("/accounts/login/").status_code == 200
    time.sleep(0.2)
    served_by = {
        match.group(1)
        for line in stack.access_log_lines()[marker:]
        if (match := re.search(r"upstream=(\S+)", line)) and "GET /accounts/login/" in line
    }
    gateways = {g.removeprefix("http://") for g in stack.gateways}
    assert served_by == gateways, (served_by, gateways)
    assert stack.engine_url.removeprefix("http://") not in served_by


def test_https_responses_carry_hsts_and_the_security_headers(stack):
    """Behind TLS (X-Forwarded-Proto https from nginx): HSTS for a year with subdomains and
    preload, nosniff, DENY framing, same-origin referrer and opener policies."""
    with stack.client() as client:
        response = client.get("/accounts/login/")
    assert response.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"


def test_plain_http_is_redirected_to_https_without_hsts(stack):
    """A plain-HTTP request to nginx is redirected to the HTTPS site (same path), and carries no
    HSTS header (RFC 6797 §7.2: only sent over secure transport)."""
    response = httpx.get(f"{stack.http_url}/accounts/login/?next=/usage/", follow_redirects=False)
    assert response.status_code == 301
    assert response.headers["Location"] == f"{stack.url}/accounts/login/?next=/usage/"
    assert "Strict-Transport-Security" not in response.headers


def test_session_and_csrf_cookies_are_secure_httponly_and_samesite(stack):
    """The session cookie set at sign-in and the CSRF cookie are Secure (HTTPS only), HttpOnly
    (no script reads them) and SameSite=Lax."""
    client, login = stack.login("prod-cleo")
    client.close()
    cookies = {c.split("=", 1)[0]: c for c in login.headers.get_list("set-cookie")}
    assert "sessionid" in cookies, cookies
    with stack.client() as anonymous:
        csrf_headers = anonymous.get("/accounts/login/").headers.get_list("set-cookie")
    csrf = next(c for c in csrf_headers if c.startswith("csrftoken="))
    for cookie in (cookies["sessionid"], csrf):
        attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")[1:]}
        assert "secure" in attributes, cookie
        assert "httponly" in attributes, cookie
        assert attributes.get("samesite", "").lower() == "samesite=lax", cookie


def test_probes_answer_on_each_gateway_over_plain_http_but_pages_redirect(stack):
    """Monitoring asks each uvicorn process directly over plain HTTP: /readyz and /healthz
    answer there (exempt from the HTTPS redirect); a page asked the same way is redirected."""
    for gateway in stack.gateways:
        ready = httpx.get(f"{gateway}/readyz")
        assert ready.status_code == 200, (gateway, ready.text)
        assert ready.json()["status"] == "ready"
        assert httpx.get(f"{gateway}/healthz").status_code == 200
        page = httpx.get(f"{gateway}/accounts/login/", follow_redirects=False)
        assert page.status_code == 301, gateway
        assert page.headers["Location"].startswith("https://")


@pytest.mark.browser
def test_the_chat_works_in_a_browser_under_the_csp(stack):
    """Headless Chromium through nginx over HTTPS (HTTP/2): sign in, send a message, watch the
    answer stream in and be replaced by the server's HTML; no Content-Security-Policy
    violation is reported and no script error happens on the way."""
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415

    from tests.browser.chat_ui_support import CHROMIUM, CHROMIUM_ARGS  # noqa: PLC0415

    console: list[str] = []
    errors: list[str] = []
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"  # Playwright's loop in this thread (see chat_ui_support)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(ignore_https_errors=True)
                context.set_default_timeout(20_000)
                page = context.new_page()
                page.add_init_script(
                    "document.addEventListener('securitypolicyviolation', e =>"
                    " console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI));"
                )
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
                page.on("response", lambda r: console.append(f"{r.request.method} {r.url} {r.status}"))
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{stack.url}/accounts/login/")
                page.fill("input[name=username]", "prod-dora")
                page.fill("input[name=password]", PASSWORD)
                page.click("form button[type=submit], form input[type=submit]")
                page.wait_for_url(f"{stack.url}/")
                page.wait_for_function("typeof window.htmx === 'object'")  # deferred scripts ran
                page.fill("#composer textarea", "Hello from a browser")
                page.keyboard.press("Enter")
                answer = page.locator("[data-stream-text].markdown").last
                expect(answer).to_contain_text(ANSWER, timeout=20_000)
                page.reload()
                expect(page.locator("body")).to_contain_text(ANSWER, timeout=20_000)
                protocol = page.evaluate("performance.getEntriesByType('navigation')[0].nextHopProtocol")
            except AssertionError as failure:
                raise AssertionError(f"{failure}\nconsole: {console}\nerrors: {errors}") from None
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
    violations = [line for line in console if "Content Security Policy" in line or "CSP violation" in line]
    assert violations == [], console
    assert errors == [], errors
    assert protocol == "h2"
