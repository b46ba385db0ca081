"""The production ASGI server: uvicorn, with the product's options in one place.

``python -m chatsite.serve [--host 127.0.0.1] [--port 8000] [--app chatsite.asgi:application]``
is what ``make run`` (chatsite/devstack.py), the local production stack (chatsite/prodstack.py),
the systemd units (deploy/systemd/) and the benchmarks start; tests/conftest.py runs the same
:func:`server_config` in a thread.

Why uvicorn (issue 19 part 5, "Backpressure that reaches the stream"; measured in
bench/stream_bench.py, docs/api.md "Why uvicorn, not daphne"): its HTTP protocols have write flow
control of their own. When a client stops reading, the socket's buffer fills, asyncio pauses
the protocol, and the app's ``send()`` of the next body chunk waits until the buffer drains (or
the client goes), so a stalled reader costs the gateway one transport buffer, not the rest of
the answer; the answer's events wait in the turn's window and its Redis log
(conversations/turnstream.py). daphne needed a Twisted producer subclass of ours for the same;
uvicorn held less memory per stalled client (0.77x) and served readers beside stalled clients
faster, with resume latency within noise, and no code of ours.

The options (each a reason, not a default left alone):

- The client address is nginx's ``X-Real-IP`` (its ``$remote_addr``, which no client can set:
  nginx overwrites the header) when the connection comes from a loopback proxy
  (:class:`RealIPMiddleware`). uvicorn's own ``--proxy-headers`` reads ``X-Forwarded-For`` and
  skips every trusted (loopback) entry from the right, so a client that itself connects from
  loopback, or writes ``127.0.0.1`` into the header, would pick its own address; it is off.
  ``X-Forwarded-Proto`` is read by Django (``SECURE_PROXY_SSL_HEADER``, settings/production.py).
- ``timeout_keep_alive`` above nginx's upstream ``keepalive_timeout`` (50 s): nginx must drop an
  idle upstream connection before the server does, or a request sent on a connection the server
  is just closing fails (a 502).
- ``timeout_graceful_shutdown`` = ``settings.CHAT_SERVER_SHUTDOWN_GRACE_S``: on SIGTERM open
  answer streams get that long to finish before they are cancelled (an event stream never ends
  by itself); a cancelled reader is a dropped connection, so the answer can be resumed from
  another gateway (DESIGN.md, the disconnect rule).
- ``lifespan`` off (Django's ASGI handler has none), websockets off (the product has none).

Signals: uvicorn handles SIGINT/SIGTERM (graceful shutdown); the engine, started later in the
running loop, chains its own shutdown in front of uvicorn's handler (inference/engine.py), so
Ctrl-C on ``make run`` stops the engine's processes as well. uvicorn re-raises the signal once
it has shut down, so the process ends by that signal (systemd counts SIGTERM as a clean stop).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn
from uvicorn.importer import import_from_string

APP = "chatsite.asgi:application"
TRUSTED_PROXIES = ("127.0.0.1", "::1")  # deploy/nginx.conf runs on the same host, on loopback
KEEP_ALIVE_S = 65  # > nginx's upstream keepalive_timeout (50 s, deploy/nginx.conf)


class RealIPMiddleware:
    """ASGI middleware: for an HTTP request whose peer is a trusted proxy
    (:data:`TRUSTED_PROXIES`), the client address (``scope["client"]``, Django's REMOTE_ADDR)
    becomes the proxy's ``X-Real-IP`` when that is an IP address; anything else is left as the
    peer's own address (a missing or malformed header, a peer that is not a proxy of ours)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        client = scope.get("client")
        if scope["type"] == "http" and client and client[0] in TRUSTED_PROXIES:
            real = next((v for k, v in scope["headers"] if k == b"x-real-ip"), None)
            try:
                address = (
                    str(ipaddress.ip_address(real.decode("latin-1").strip())) if real else None
                )
            except ValueError:
                address = None
            if address is not None:
                scope = {**scope, "client": (address, 0)}
        await self.app(scope, receive, send)


def server_config(
    *, app: object = APP, host: str = "127.0.0.1", port: int = 8000, access_log: bool = False
) -> uvicorn.Config:
    """The uvicorn configuration of a gateway or engine process (module docstring) serving
    ``app`` (an ASGI callable or its ``"module:attribute"`` path, imported now) behind
    :class:`RealIPMiddleware` on ``host``:``port`` (0: a free port). ``access_log``: one line
    per request on stderr (nginx logs them in production)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    from django.conf import settings  # noqa: PLC0415 - after the settings module is named

    if isinstance(app, str):
        app = import_from_string(app)
    return uvicorn.Config(
        RealIPMiddleware(app),
        host=host,
        port=port,
        lifespan="off",
        ws="none",
        proxy_headers=False,  # RealIPMiddleware instead (module docstring)
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=settings.CHAT_SERVER_SHUTDOWN_GRACE_S,
        access_log=access_log,
        server_header=False,
    )


def serve_argv(*, host: str = "127.0.0.1", port: int = 8000, app: str = APP) -> list[str]:
    """The command line that serves ``app`` on ``host``:``port`` with this module, for the
    launchers that start the server as a process (devstack, prodstack, benchmarks, tests)."""
    return [
        sys.executable,
        "-m",
        "chatsite.serve",
        "--host",
        host,
        "--port",
        str(port),
        "--app",
        app,
    ]


@dataclass
class ThreadedServer:
    """A uvicorn server running in a thread of this process, on its own event loop (the real
    engine shared with the caller: tests/conftest.py ``chat_server``, bench/harness.py)."""

    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    port: int

    def call(self, coro, timeout: float = 30):
        """Run ``coro`` in the server's loop; its result. Raises what it raises, or TimeoutError."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 15) -> None:
        """Graceful shutdown (open responses get the shutdown grace), then the loop closes."""
        self.server.should_exit = True
        self.thread.join(timeout)


def serve_in_thread(
    app: object, *, host: str = "127.0.0.1", start_timeout_s: float = 30
) -> ThreadedServer:
    """Start :func:`server_config` for ``app`` on a free port of ``host`` in a daemon thread
    with a new event loop of the kind ``uvicorn.Server.run`` makes (no signal handlers: uvicorn
    installs them only in the main thread); return once it listens. Raises RuntimeError if it
    does not within ``start_timeout_s``."""
    config = server_config(app=app, host=host, port=0)
    server = uvicorn.Server(config)
    # The loop production gets (uvloop when installed), so tests see what production runs.
    loop = (config.get_loop_factory() or asyncio.new_event_loop)()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start listening")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return ThreadedServer(server=server, loop=loop, thread=thread, port=port)


def main(argv: list[str] | None = None) -> None:
    """``python -m chatsite.serve`` (module docstring); serves until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description="Serve chatsite with uvicorn.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one)")
    parser.add_argument("--app", default=APP, help="the ASGI application, module:attribute")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.getcwd())  # the app is imported by path, as `uvicorn` would
    config = server_config(app=args.app, host=args.host, port=args.port, access_log=args.access_log)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
