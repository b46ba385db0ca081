"""PF-S2 in a real browser (headless Debian Chromium, Playwright, the scripted engine double):
through a proxy that re-chunks the event stream into 1-3 byte network pieces, the page
reassembles UTF-8 characters and ``data:`` lines split across chunks.

Chromium comes from Debian's ``chromium`` package (``make browser``); nothing is downloaded.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.browser.chat_ui_support import (  # noqa: F401 - fixtures
    ANSWER,
    STREAM_TEXT,
    TIMEOUT_MS,
    browser,
    new_page,
    send,
    stream_state,
    ui_login,
)

pytestmark = pytest.mark.browser


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
