"""Diagnostic ASGI app for ``python -m bench.chat_bench --probe``: the real application plus
server-side timestamps for each turn, printed to the server log as ``PROBE {json}`` lines.

Per turn (the POST that starts it): when the request arrived, when ``engine.generate`` was
called, when the first delta with text came out of the engine, when the POST's response was
sent; plus the process's thread count and how many database connections it has opened so far.
Nothing in the product changes; the wrappers only read clocks. With ``BENCH_PATCH_DB=1``
(``--patch-db``) it also applies an experimental workaround for the database connection leak
(see below), to measure the rest of the stack's overhead; those numbers are not the product's.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")

if os.environ.get("BENCH_PATCH_DB") == "1":
    # Experimental workaround for the connection leak the bench found (not the product's
    # behaviour): no persistent connections (each request's thread opens its own under ASGI),
    # and the generation task's own database work closes its connection when done (no
    # request_finished signal ever closes it).
    from django.conf import settings as _settings

    _settings.DATABASES["default"]["CONN_MAX_AGE"] = 0

from chatsite.asgi import application as _application  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402

from inference import engine as _engine_module  # noqa: E402

_arrival: contextvars.ContextVar[float | None] = contextvars.ContextVar("arrival", default=None)
_connections = 0


def _on_connection(sender, connection, **kwargs):
    global _connections
    _connections += 1


connection_created.connect(_on_connection)


def _emit(**fields) -> None:
    fields["threads"] = threading.active_count()
    fields["db_connections_opened"] = _connections
    print("PROBE " + json.dumps(fields), flush=True)


_original_generate = _engine_module.VllmEngine.generate


async def _generate(self, prompt_token_ids, options, request_id):
    arrival = _arrival.get()
    called = time.perf_counter()
    first = None
    async for delta in _original_generate(self, prompt_token_ids, options, request_id):
        if first is None and delta.text:
            first = time.perf_counter()
        yield delta
    if arrival is not None and first is not None:
        _emit(
            kind="turn",
            request_id=request_id,
            generate_called_ms=(called - arrival) * 1000,
            first_delta_ms=(first - arrival) * 1000,
            engine_ttft_ms=(first - called) * 1000,
        )


_engine_module.VllmEngine.generate = _generate


if os.environ.get("BENCH_PATCH_DB") == "1":
    from django.db import connection as _connection

    from conversations import services as _services

    def _closing(function):
        def wrapper(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            finally:
                _connection.close()

        return wrapper

    _services.answer_store = _closing(_services.answer_store)


async def application(scope, receive, send):
    if scope["type"] != "http" or scope.get("method") != "POST" or "turns" not in scope["path"]:
        return await _application(scope, receive, send)
    arrival = time.perf_counter()
    _arrival.set(arrival)

    async def timed_send(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            _emit(kind="post", response_sent_ms=(time.perf_counter() - arrival) * 1000)
        await send(message)

    return await _application(scope, receive, timed_send)
