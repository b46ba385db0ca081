"""Server-Sent Events framing (WHATWG HTML Living Standard, "Server-sent events")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    # nginx honours this per response: never buffer an event stream (PF-S3).
    "X-Accel-Buffering": "no",
}


def sse_event(event: str, data: dict[str, Any], event_id: int | str | None = None) -> bytes:
    """Encode one event as UTF-8 bytes: optional ``id:``, ``event:``, one ``data:`` line, blank.

    ``data`` is serialised as JSON with ``ensure_ascii=False`` (real UTF-8, PF-S2); JSON never
    contains a raw newline, so one ``data:`` line always suffices.
    """
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def sse_comment(text: str = "") -> bytes:
    """A comment line: ignored by clients, keeps proxies from timing out an idle stream."""
    return f": {text}\n\n".encode()


def sse_response(body: AsyncIterator[bytes], status: int = 200) -> StreamingHttpResponse:
    """A streaming ``text/event-stream`` response with the no-cache/no-buffering headers."""
    response = StreamingHttpResponse(
        body, content_type="text/event-stream; charset=utf-8", status=status
    )
    for name, value in SSE_HEADERS.items():
        response[name] = value
    return response


async def release_db_connection() -> None:
    """Close this request's database connection; call it in a streaming view after its last
    query. A stream can stay open for minutes and must not pin one of PostgreSQL's ~100
    sessions meanwhile (measured: 1 session per open stream, "too many clients" at ~97)."""
    await sync_to_async(_close_connection)()


def _close_connection() -> None:
    # Connections resolve per thread: close them here, in the worker thread that owns them;
    # every alias it used (replicas, regions: chatsite/dbrouter.py).
    connections.close_all()


def last_event_id(request: HttpRequest) -> int:
    """The ``Last-Event-ID`` a reconnecting client sent (0 if none or not a number)."""
    try:
        return max(int(request.headers.get("Last-Event-ID", "0")), 0)
    except ValueError:
        return 0


async def run_in_db_thread(fn, /, **kwargs):
    """Run the blocking ORM call ``fn(**kwargs)`` for work that outlives the request that
    started it (a generation task, a write-back), and return its result.

    Django closes a request's connections when the request finishes; such a task's calls would
    otherwise open a connection per asgiref thread and never close it, until PostgreSQL refuses
    clients (seen in the benchmark: "too many clients already" at 32 concurrent chats). So the
    call runs on the loop's bounded default executor and closes every connection it used
    (default, replicas, regions) afterwards. Exceptions from ``fn`` propagate.
    """

    def call():
        try:
            return fn(**kwargs)
        finally:
            connections.close_all()

    return await sync_to_async(call, thread_sensitive=False)()
