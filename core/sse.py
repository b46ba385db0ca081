"""Server-Sent Events framing (WHATWG HTML Living Standard, "Server-sent events")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

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


def last_event_id(request: HttpRequest) -> int:
    """The ``Last-Event-ID`` a reconnecting client sent (0 if none or not a number)."""
    try:
        return max(int(request.headers.get("Last-Event-ID", "0")), 0)
    except ValueError:
        return 0
