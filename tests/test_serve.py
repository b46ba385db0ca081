"""The production server's options (chatsite/serve.py): the client address behind nginx."""

from __future__ import annotations

import asyncio

import httpx

from chatsite.serve import RealIPMiddleware, serve_in_thread


class RecordingApp:
    """An ASGI app that answers 204 and keeps each request's ``scope["client"]``."""

    def __init__(self) -> None:
        self.clients: list[tuple[str, int] | None] = []

    async def __call__(self, scope, receive, send) -> None:
        self.clients.append(scope.get("client"))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def call(app, client: tuple[str, int], headers: dict[str, str]) -> tuple[str, int]:
    """Run one HTTP request's scope through ``RealIPMiddleware(app)``; the client it saw."""
    scope = {
        "type": "http",
        "client": client,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(RealIPMiddleware(app)(scope, receive, send))
    return app.clients[-1]


def test_a_loopback_proxy_names_the_client_in_x_real_ip():
    """nginx (on loopback) sets X-Real-IP to the address it saw: that is the client."""
    app = RecordingApp()
    assert call(app, ("127.0.0.1", 50000), {"X-Real-IP": "198.51.100.7"})[0] == "198.51.100.7"
    assert call(app, ("::1", 50000), {"X-Real-IP": "2001:db8::1"})[0] == "2001:db8::1"


def test_x_forwarded_for_never_names_the_client():
    """A client's own X-Forwarded-For entries are not believed (nginx appends to them)."""
    app = RecordingApp()
    seen = call(app, ("127.0.0.1", 50000), {"X-Forwarded-For": "203.0.113.66, 127.0.0.1"})
    assert seen == ("127.0.0.1", 50000)


def test_x_real_ip_from_a_peer_that_is_not_a_proxy_of_ours_is_ignored():
    app = RecordingApp()
    assert call(app, ("192.0.2.10", 40000), {"X-Real-IP": "203.0.113.66"}) == ("192.0.2.10", 40000)


def test_a_malformed_x_real_ip_leaves_the_peer_address():
    app = RecordingApp()
    assert call(app, ("127.0.0.1", 50000), {"X-Real-IP": "not-an-address"}) == ("127.0.0.1", 50000)


def test_the_served_app_sees_the_proxy_address_from_x_real_ip():
    """End to end through the server's configuration (serve_in_thread uses server_config): a
    request over a real socket from loopback with X-Real-IP reaches the app with that client."""
    app = RecordingApp()
    server = serve_in_thread(app)
    try:
        url = f"http://127.0.0.1:{server.port}/"
        assert httpx.get(url, headers={"X-Real-IP": "198.51.100.7"}).status_code == 204
        assert httpx.get(url, headers={"X-Forwarded-For": "203.0.113.66"}).status_code == 204
    finally:
        server.stop()
    assert app.clients[0][0] == "198.51.100.7"
    assert app.clients[1][0] == "127.0.0.1"
