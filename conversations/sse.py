"""Server-Sent Events framing (WHATWG HTML Living Standard, "Server-sent events")."""

from __future__ import annotations

import json
from typing import Any

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
