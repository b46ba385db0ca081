"""The chat page in a real browser: headless Debian Chromium driven by Playwright (sync API),
against daphne serving the real app in this process (``live``), with the real vLLM engine or
the scripted engine double (``engine_double``, requested after ``live``).

Chromium comes from Debian's ``chromium`` package (``make browser``); nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from playwright.sync_api import Browser, Page, expect, sync_playwright

from conversations.models import Conversation, Turn
from conversations.services import title_from_message
from tests.conftest import PASSWORD

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000

# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium for this module. Playwright's sync API leaves its asyncio loop marked running
    in this thread, which makes Django refuse ORM calls here (SynchronousOnlyOperation) though
    nothing in this thread is async; the flag below says so while the browser lives. Module
    scope: later test modules get a thread without that loop."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def new_page(browser):
    """``new_page()``: a page in a fresh browser context (own cookies). Uncaught page errors
    fail the test."""
    contexts = []
    errors: list[str] = []

    def make() -> Page:
        context = browser.new_context()
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        return page

    yield make
    for context in contexts:
        context.close()
    assert errors == [], f"uncaught JavaScript errors: {errors}"


# --- helpers ------------------------------------------------------------------------------

ANSWER = "#messages article.assistant"
STREAM_TEXT = f"{ANSWER} [data-stream-text]"
COMPOSER_BOX = "#composer textarea"


def assert_scripts_loaded(page: Page) -> None:
    """The page's scripts ran (htmx, its SSE extension and chat.js were served)."""
    if page.evaluate("typeof window.htmx") == "object":
        return
    statuses = page.evaluate(
        "() => Promise.all([...document.scripts].map((s) =>"
        " fetch(s.src).then((r) => `${s.getAttribute('src')}: HTTP ${r.status}`)))"
    )
    pytest.fail(f"htmx did not load, so the chat page cannot work; its scripts: {statuses}")


def ui_login(page: Page, base_url: str, username: str) -> None:
    """Sign in through the login form; lands on a new, empty chat."""
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("main.auth button[type=submit]")
    page.wait_for_url(f"{base_url}/")
    assert_scripts_loaded(page)


def send(page: Page, text: str) -> None:
    page.fill(COMPOSER_BOX, text)
    page.press(COMPOSER_BOX, "Enter")


def stream_state(page: Page) -> tuple[str, bool] | None:
    """(the streamed text so far, still streaming?) of the last answer, or None."""
    return page.evaluate(
        """(sel) => {
            const all = document.querySelectorAll(sel);
            const a = all[all.length - 1];
            if (!a) return null;
            const t = a.querySelector('[data-stream-text]') || a.querySelector('.bubble');
            return [t.textContent, a.classList.contains('streaming')];
        }""",
        ANSWER,
    )


def active_content(page: Page) -> list[str]:
    """Script-capable markup in the messages and the sidebar: script/svg/iframe/object/embed
    elements, any on* attribute, any javascript: link. The page's own icons (``<svg
    data-icon>`` outside any message bubble, chatsite/icons.py) are not model output; an
    ``<svg>`` inside a bubble counts whatever it carries."""
    return page.evaluate(
        """() => {
            const bad = [];
            for (const root of [document.getElementById('messages'),
                                document.querySelector('nav.sidebar')]) {
                for (const el of root.querySelectorAll('*')) {
                    const tag = el.tagName.toLowerCase();
                    const ownIcon = tag === 'svg' && el.hasAttribute('data-icon')
                        && !el.closest('.bubble');
                    if ((['script', 'svg', 'iframe', 'object', 'embed'].includes(tag) && !ownIcon)
                        || [...el.attributes].some((a) => a.name.toLowerCase().startsWith('on'))
                        || /^\\s*javascript:/i.test(el.getAttribute('href') || '')
                        || /^\\s*javascript:/i.test(el.getAttribute('src') || '')) {
                        bad.push(el.outerHTML.slice(0, 200));
                    }
                }
            }
            return bad;
        }"""
    )


# --- 1. the whole journey with the real model --------------------------------------------


@pytest.mark.real_engine
def test_signup_send_watch_stream_stop_and_reload_shows_history(live, new_page, settings):
    """Given a new visitor and the real model, when they sign up through the form, send a
    message with Enter, watch the answer stream in and press Stop mid-answer, then the answer
    says "Stopped.", the engine has no unfinished request within 1 s, and after a reload the
    history shows the message and the partial answer, and the sidebar lists the conversation
    titled from the first message."""
    settings.CHAT_MAX_TOKENS = 400
    baseline = live.unfinished()
    page = new_page()
    prompt = "Write a very long story about a dragon and a knight."

    page.goto(f"{live.url}/accounts/signup/")
    page.fill("input[name=username]", "walter")
    page.fill("input[name=password1]", PASSWORD)
    page.fill("input[name=password2]", PASSWORD)
    page.click("main.auth button[type=submit]")
    page.wait_for_url(f"{live.url}/")
    assert_scripts_loaded(page)
    expect(page.locator(".account")).to_contain_text("walter")

    send(page, prompt)

    # The answer streams in: its text grows at least twice while it is still being written.
    page.wait_for_selector(STREAM_TEXT)
    lengths: list[int] = []
    deadline = time.monotonic() + 60
    while True:
        state = stream_state(page)
        assert state is not None
        text, streaming = state
        assert streaming, f"the answer finished before it was seen growing twice: {lengths}"
        if text and (not lengths or len(text) > lengths[-1]):
            lengths.append(len(text))
        if len(lengths) >= 3:
            break
        assert time.monotonic() < deadline, f"the answer did not grow: {lengths}"
        time.sleep(0.02)
    seen = text
    assert live.unfinished() == baseline + 1

    clicked = time.monotonic()
    page.click(f"{ANSWER} button.stop")
    while live.unfinished() > baseline and time.monotonic() - clicked < 1.0:
        time.sleep(0.02)
    assert live.unfinished() == baseline, "the engine still runs the request 1 s after Stop"

    expect(page.locator(f"{ANSWER} [data-stream-note]")).to_have_text("Stopped.")
    expect(page.locator(ANSWER)).to_have_class(re.compile(r"\bcancelled\b"))
    expect(page.locator(f"{ANSWER} button.stop")).to_have_count(0)
    conversation = Conversation.objects.get(owner__username="walter")
    assert page.url == f"{live.url}/c/{conversation.conversation_id}/"  # pushed by htmx
    stored = Turn.objects.get(conversation=conversation, role=Turn.Role.ASSISTANT)
    assert stored.status == Turn.Status.CANCELLED and stored.content.strip()

    page.reload()

    expect(page.locator("#messages article.user .bubble")).to_have_text(prompt)
    answer = page.locator("#messages article.assistant.cancelled")
    expect(answer).to_have_count(1)
    expect(answer.locator(".note")).to_have_text("Stopped.")
    # What streamed (rendered live as Markdown) is the start of the stored answer's render,
    # up to its last word (a word or a Markdown mark may still have been growing).
    rendered = answer.locator(".bubble").inner_text()
    shown = seen.rsplit(None, 1)[0] if len(seen.split()) > 1 else ""
    assert rendered.strip() and letters(rendered).startswith(letters(shown)), (seen, rendered)
    expect(page.locator("#sidebar li.current a.row-link")).to_have_text(title_from_message(prompt))
    assert page.locator("#sidebar li.current a.row-link").get_attribute("href") == (
        f"/c/{conversation.conversation_id}/"
    )



def letters(text: str) -> str:
    """``text`` without whitespace and punctuation, to compare rendered texts by their words."""
    return re.sub(r"[\W_]+", "", text)

# --- 2. keys ------------------------------------------------------------------------------


def test_shift_enter_inserts_newline_and_enter_sends(live, engine_double, make_user, new_page):
    """Given the chat page, when the user presses Shift+Enter in the message box, a newline is
    inserted and nothing is sent; when they then press Enter, the two-line message is sent and
    answered."""
    make_user("sam")
    page = new_page()
    ui_login(page, live.url, "sam")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    page.click(COMPOSER_BOX)
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    page.wait_for_timeout(500)  # a send would have gone out by now

    assert page.input_value(COMPOSER_BOX) == "line one\nline two"
    assert posts == []
    assert engine_double.requests == []
    expect(page.locator("#messages article.user")).to_have_count(0)

    page.keyboard.press("Enter")

    expect(page.locator("#messages article.user .bubble")).to_have_text("line one\nline two")
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("Hello, world.")
    assert len(posts) == 1 and posts[0].endswith("/chat/turns")
    assert len(engine_double.requests) == 1
    assert page.input_value(COMPOSER_BOX) == ""


# --- 3. PF-X1 -----------------------------------------------------------------------------

HOSTILE_DELTAS = [
    "Sure. <scr",
    "ipt>window.__pwned=1</scr",
    "ipt>\n\n",
    "<img src=x one",
    'rror="window.__pwned=2">\n\n',
    "[x](java",
    "script:window.__pwned=3)\n\n",
    "<svg onl",
    'oad="window.__pwned=4">',
    "</svg>\n\nDone.",
]
HOSTILE_MESSAGE = 'Hi <img src=x onerror="window.__pwned=5"> there'


def test_pf_x1_hostile_model_output_and_title_never_run_in_the_browser(
    live, engine_double, make_user, new_page
):
    """PF-X1: given a model whose output carries a <script>, an onerror <img>, a javascript:
    link and an onload <svg> (each split over deltas), and a first message with an onerror
    <img> (so also the sidebar title), then while streaming, after the answer is finished and
    after a reload no script ran, no script-capable element or javascript: link is in the
    messages or the sidebar, and the session cookie is HttpOnly."""
    engine_double.scripts.append([*HOSTILE_DELTAS[:-1], 0.6, HOSTILE_DELTAS[-1]])
    make_user("mallory")
    page = new_page()
    ui_login(page, live.url, "mallory")

    send(page, HOSTILE_MESSAGE)

    # While streaming (the pause before the last delta): the text is there, rendered as
    # Markdown and inert (tests/browser/test_chat_render.py has the live render's own case).
    page.wait_for_function(
        "(sel) => { const t = document.querySelector(sel);"
        " return t && t.textContent.includes('__pwned=4'); }",
        arg=STREAM_TEXT,
    )
    assert active_content(page) == []
    assert stream_state(page)[1], "the answer should still be streaming"

    # Finished: the server's sanitised HTML replaced the streamed text.
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    page.wait_for_timeout(500)  # time for any onerror/onload to fire
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert active_content(page) == []
    expect(page.locator("#messages article.user .bubble")).to_have_text(HOSTILE_MESSAGE)
    expect(page.locator("#sidebar li.current a.row-link")).to_have_text(HOSTILE_MESSAGE)

    page.reload()
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    page.wait_for_timeout(500)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert active_content(page) == []
    expect(page.locator("#messages article.user .bubble")).to_have_text(HOSTILE_MESSAGE)
    expect(page.locator("#sidebar li.current a.row-link")).to_have_text(HOSTILE_MESSAGE)
    assert page.title() == HOSTILE_MESSAGE  # <title> holds it as text

    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies[django_settings.SESSION_COOKIE_NAME]
    assert session["httpOnly"] is True
    assert django_settings.SESSION_COOKIE_NAME not in page.evaluate("document.cookie")


# --- 4. PF-S2 -----------------------------------------------------------------------------


class RechunkingProxy:
    """A loopback TCP proxy in front of the live server. Requests pass unchanged; the bytes of
    a connection whose latest request is for an event stream (``.../events``) go back to the
    browser in 1-3 byte sends with a short pause, so network chunk boundaries fall inside
    UTF-8 characters and ``data:`` lines. Every such byte piece is recorded."""

    REQUEST_LINE = re.compile(rb"(?:GET|POST|HEAD|PUT|PATCH|DELETE|OPTIONS) (\S+) HTTP/1\.[01]\r\n")

    def __init__(self, upstream: str, pause_s: float = 0.002, lifetime_s: float = 120):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.pause_s = pause_s
        self.deadline = time.monotonic() + lifetime_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stream_pieces: list[list[bytes]] = []  # per event-stream response
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> RechunkingProxy:
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        with self._lock:
            sockets = list(self._sockets)
        for s in [self.listener, *sockets]:
            try:
                s.close()
            except OSError:
                pass
        for t in list(self._threads):
            t.join(timeout=2)

    def _alive(self) -> bool:
        return not self._closing.is_set() and time.monotonic() < self.deadline

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="rechunk-proxy")
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while self._alive():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.upstream, timeout=5)
            for s in (client, upstream):
                s.settimeout(0.2)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            state = {"events": None}  # the recorded pieces of the current event stream
            self._spawn(self._requests, client, upstream, state)
            self._spawn(self._responses, upstream, client, state)

    def _recv(self, sock: socket.socket) -> bytes | None:
        """The next bytes; b"" at end of stream; None when the proxy is closing."""
        while self._alive():
            try:
                return sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b""
        return None

    def _requests(self, client, upstream, state) -> None:
        while (data := self._recv(client)):
            matches = self.REQUEST_LINE.findall(data)
            if matches:
                path = matches[-1].split(b"?", 1)[0]
                if path.endswith(b"/events"):
                    pieces: list[bytes] = []
                    with self._lock:
                        self.stream_pieces.append(pieces)
                    state["events"] = pieces
                else:
                    state["events"] = None
            try:
                upstream.sendall(data)
            except OSError:
                break
        try:
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _responses(self, upstream, client, state) -> None:
        sizes = (1, 2, 3)
        turn = 0
        while (data := self._recv(upstream)):
            pieces = state["events"]
            try:
                if pieces is None:
                    client.sendall(data)
                    continue
                at = 0
                while at < len(data):
                    piece = data[at : at + sizes[turn % 3]]
                    turn += 1
                    at += len(piece)
                    client.sendall(piece)
                    pieces.append(piece)
                    time.sleep(self.pause_s)
            except OSError:
                break
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _split_points(pieces: list[bytes]) -> tuple[bytes, set[int]]:
    data = b"".join(pieces)
    points, at = set(), 0
    for piece in pieces[:-1]:
        at += len(piece)
        points.add(at)
    return data, points


UNICODE_DELTAS = ["你好", "世界 ", "🙂🎉", " café ", "naïve"]


def test_pf_s2_browser_reassembles_utf8_and_lines_split_across_network_chunks(
    live, engine_double, make_user, new_page
):
    """PF-S2 (browser side): given a proxy that delivers the event stream in 1-3 byte pieces
    (boundaries inside multi-byte characters and inside ``data:`` lines), when the model sends
    CJK, emoji and accented deltas, then the page shows exactly the joined text, while
    streaming and when finished, with no U+FFFD."""
    expected = "".join(UNICODE_DELTAS)
    engine_double.scripts.append([*UNICODE_DELTAS, 1.0])
    make_user("yuki")
    page = new_page()

    with RechunkingProxy(live.url) as proxy:
        ui_login(page, proxy.url, "yuki")
        send(page, "Say hello in Chinese 🙂")

        page.wait_for_function(
            "([sel, want]) => { const t = document.querySelector(sel);"
            " return t && t.textContent.trim() === want; }",  # a rendered <p>, then a newline
            arg=[STREAM_TEXT, expected],
        )
        assert stream_state(page)[1], "the answer should still be streaming"
        expect(page.locator(f"{ANSWER}.complete")).to_have_count(1, timeout=TIMEOUT_MS)

        final = page.locator(f"{ANSWER} .bubble").inner_text().strip()
        assert final == expected
        assert "\ufffd" not in page.locator("#messages").inner_text()

    # The boundaries really fell inside characters and inside data: lines.
    assert len(proxy.stream_pieces) == 1, "one event-stream connection expected (no reconnect)"
    data, points = _split_points(proxy.stream_pieces[0])
    assert b"event: done" in data
    assert any(0x80 <= data[p] <= 0xBF for p in points), "no split inside a UTF-8 character"
    data_lines = [m.span() for m in re.finditer(rb"data: [^\n]*", data)]
    assert any(start < p < end for p in points for start, end in data_lines)


# --- 5. empty messages --------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "   \n\t  "], ids=["empty", "whitespace"])
def test_empty_message_shows_error_above_box_and_sends_nothing(
    live, engine_double, make_user, new_page, content
):
    """Given the chat page, when the user sends an empty or whitespace-only message, a
    readable error appears above the message box and nothing is sent: no turn, no
    conversation, no engine request."""
    make_user("erin")
    page = new_page()
    ui_login(page, live.url, "erin")

    send(page, content)

    expect(page.locator("#composer-error")).to_have_text(re.compile(r"Type a message"))
    page.wait_for_timeout(300)
    assert engine_double.requests == []
    assert not Conversation.objects.filter(owner__username="erin").exists()
    expect(page.locator("#messages article")).to_have_count(0)
    assert page.url == f"{live.url}/"

    # The error goes away once a real message is sent.
    send(page, "hello")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    expect(page.locator("#composer-error")).to_have_text("")


def test_reload_mid_answer_shows_what_was_generated_and_continues_live(live, engine_double, make_user, new_page, settings):
    """A reload in the middle of an answer is not a stop (DESIGN.md's disconnect rule): the page
    shows the text already generated and the rest streams in live; the answer completes."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 30
    engine_double.scripts = [["one ", 1.5, "two ", 1.0, "three"]]
    make_user("rita")
    page = new_page()
    ui_login(page, live.url, "rita")
    send(page, "count slowly")
    expect(page.locator(f"{ANSWER} [data-stream-text]")).to_have_text("one ")
    page.reload()
    expect(page.locator(f"{ANSWER}.complete .bubble")).to_have_text("one two three", timeout=10_000)
    assert engine_double.aborted == {}
    assert len(engine_double.requests) == 1
