"""bench/stream_bench.py's client: raw HTTP/1.1 over asyncio sockets (lighter than an HTTP
library for thousands of streams): one resume stream of a turn's events, and the timed single
requests of the latency phase."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

from bench.harness import HOST

HEAD_TIMEOUT_S = 30.0  # per stream: connect + response head

now = time.monotonic


class Stream:
    __slots__ = (
        "clean_end", "error", "events", "got_done", "headers_evt", "idx",
        "keepalives", "status", "t_end", "t_headers", "t_send", "turn",
    )  # fmt: skip

    def __init__(self, idx: int, turn: dict):
        self.idx, self.turn = idx, turn
        self.status: int | None = None
        self.error: str | None = None
        self.t_send: float | None = None
        self.t_headers: float | None = None
        self.t_end: float | None = None
        self.keepalives: list[float] = []
        self.events: list[tuple[int | None, str]] = []
        self.got_done = False
        self.clean_end = False  # the server ended the chunked body (terminating chunk)
        self.headers_evt = asyncio.Event()

    def is_open(self) -> bool:
        return self.status == 200 and self.t_end is None


def events_path(turn: dict) -> str:
    return f"/v1/conversations/{turn['conversation_id']}/turns/{turn['answer_id']}/events"


def request_bytes(path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed before the status line")
    code = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed inside the response head")
        if line in (b"\r\n", b"\n"):
            return code, headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def body_chunks(reader: asyncio.StreamReader, chunked: bool, stream: Stream):
    """Yield the body's bytes; mark ``stream.clean_end`` when the server ends the body."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        stream.clean_end = True
        return
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed mid-body (no terminating chunk)")
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.readline(), 1)
            stream.clean_end = True
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


def error_text(code: int, body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    title = re.search(r"<title>(.*?)</title>", text, re.DOTALL)
    return f"HTTP {code}: " + (title.group(1).strip() if title else " ".join(text.split())[:100])


async def run_stream(s: Stream, port: int, key: str) -> None:
    """One resume stream, from ``Last-Event-ID: <last written>``, until the server ends it."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Accept": "text/event-stream",
        "Last-Event-ID": str(s.turn["last_id"]),
    }
    writer = None
    try:
        s.t_send = now()
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), HEAD_TIMEOUT_S)
        writer.write(request_bytes(events_path(s.turn), port, headers))
        await writer.drain()
        code, head = await asyncio.wait_for(read_head(reader), HEAD_TIMEOUT_S)
        s.status, s.t_headers = code, now()
        s.headers_evt.set()
        if code != 200:
            body = b""
            with contextlib.suppress(Exception):
                body = await asyncio.wait_for(reader.read(400), 2)
            s.error = error_text(code, body)
            return
        chunked = "chunked" in head.get("transfer-encoding", "").lower()
        buf, event, event_id = b"", None, None
        async for data in body_chunks(reader, chunked, s):
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.startswith(b":"):
                    if b"keep-alive" in line:
                        s.keepalives.append(now())
                elif line.startswith(b"id:"):
                    event_id = int(line[3:].strip())
                elif line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    s.events.append((event_id, event or "message"))
                    s.got_done = s.got_done or event == "done"
                    event, event_id = None, None
    except TimeoutError:
        s.error = "timeout waiting for the response head" if s.status is None else "timeout"
    except Exception as exc:  # noqa: BLE001
        s.error = f"{type(exc).__name__}: {exc}"[:160]
    finally:
        s.t_end = now()
        s.headers_evt.set()
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)


async def time_openapi(port: int) -> float:
    """Request sent -> first byte of ``GET /v1/openapi.json`` (the whole body is then read)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        t0 = now()
        writer.write(request_bytes("/v1/openapi.json", port, {"Connection": "close"}))
        await writer.drain()
        first = await asyncio.wait_for(reader.read(1), 10)
        ttfb = now() - t0
        if not first.startswith(b"H"):
            raise ConnectionError("openapi: no response")
        while await reader.read(65536):
            pass
        return ttfb
    finally:
        writer.close()


async def time_resume(port: int, key: str, turn: dict) -> float:
    """Request sent (``Last-Event-ID: 1``) -> the first replayed ``event: token`` line."""
    reader, writer = await asyncio.open_connection(HOST, port)
    headers = {"Authorization": f"Bearer {key}", "Last-Event-ID": "1"}

    async def first_token(t0: float) -> float:
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"resume answered {status.decode().strip()!r}")
        while line := await reader.readline():
            if line.startswith(b"event: token"):
                return now() - t0
        raise ConnectionError("resume: closed before the first token")

    try:
        t0 = now()
        writer.write(request_bytes(events_path(turn), port, headers))
        await writer.drain()
        return await asyncio.wait_for(first_token(t0), 10)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1)
