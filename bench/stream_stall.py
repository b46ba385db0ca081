"""bench/stream_bench.py's stalled-client phase (issue 19 part 5, "Backpressure that reaches the
stream"): what a client that stops reading costs the server process.

On a server started with a long scripted answer (``--stall-deltas`` deltas of
``--stall-chars`` characters, ~10 ms apart; output moderation off, it is not what is measured
here), S clients POST a turn each with a small receive buffer (``SO_RCVBUF`` =
:data:`STALL_RCVBUF`), read the response head and the first event, and stop reading; R other
clients POST a turn each and read it to the end. The server's RSS is sampled before, at its
peak while all S + R streams are open, and once the answers are all generated with only the S
stalled streams left (what they hold: the turn's in-memory window, conversations/turnstream.py,
plus whatever the server buffers for a socket that takes nothing). Then the stalled clients
read again: each must get every event of its answer once, in order, and the ``done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

from bench.harness import HOST, VAR
from bench.stream_client import body_chunks, read_head
from bench.stream_phases import dist, rnd
from bench.stream_setup import Fixture, Server, mib, sample

STALL_RCVBUF = 4096  # bytes: the stalled clients' receive buffer (the kernel may double it)
DELTA_PAUSE_S = 0.01  # between two deltas of the scripted answer

now = time.monotonic


def stall_env(deltas: int, chars: int) -> dict[str, str]:
    """The server settings of the phase: a scripted answer of ``deltas`` deltas of ``chars``
    characters (tests/fakes.py ``ScriptedEngine.from_settings``), at most 1,023 (the free
    tier's answer ceiling, settings.CHAT_MAX_TOKENS_CEILING_BY_TIER). The pools' own answer
    ceilings (``max_tokens``, 512 for the default pools) would cut it short, and a client
    would then rightly get fewer events than asked: the pools are written to
    ``var/bench/stall_pools.yaml`` with ``max_tokens`` = ``deltas`` + 1 (JSON is YAML)."""
    from django.conf import settings

    pools = [
        {**pool, "max_tokens": max(pool["max_tokens"], deltas + 1)} for pool in settings.CHAT_POOLS
    ]
    path = VAR / "bench" / "stall_pools.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pools, indent=1))
    delta = ("lorem ipsum " * (chars // 12 + 1))[: chars - 1] + " "
    return {
        "CHAT_SCRIPTED_ENGINE_SCRIPT": json.dumps([delta, DELTA_PAUSE_S]),
        "CHAT_SCRIPTED_ENGINE_REPEAT": str(deltas),
        "CHAT_MAX_TOKENS": str(deltas + 1),
        "CHAT_POOLS_FILE": str(path),
        "CHAT_MODERATION_OUTPUT": "false",
    }


class TurnClient:
    """One POST of a turn over a raw socket, read as SSE events (ids, names, the done's usage).

    The body is de-chunked before it is parsed (bench/stream_client.py ``body_chunks``): the
    server may split one event over several HTTP chunks (a ``done`` carries the whole answer's
    HTML), so reading SSE lines straight off the socket would misread them."""

    def __init__(self, port: int, key: str, conversation_id: str, rcvbuf: int | None) -> None:
        self.port, self.key, self.conversation_id, self.rcvbuf = port, key, conversation_id, rcvbuf
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.status: int | None = None
        self.ids: list[int] = []
        self.got_done = False
        self.completion_tokens: int | None = None  # from the done event's usage
        self.clean_end = False  # set by body_chunks at the terminating chunk
        self.error: str | None = None
        self.t_send = self.t_done = None
        self._body = None  # the body's chunks (an async iterator), once the head is read
        self._buf, self._event = b"", None

    async def open(self) -> None:
        """Connect, send the turn, read the head and the first event."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if self.rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (HOST, self.port))
        # A small stream buffer too: asyncio stops reading the socket past 2 x limit.
        self.reader, self.writer = await asyncio.open_connection(
            sock=sock, limit=self.rcvbuf or 65536
        )
        body = json.dumps({"role": "user", "content": "a long answer, please"}).encode()
        head = (
            f"POST /v1/conversations/{self.conversation_id}/turns HTTP/1.1\r\n"
            f"Host: {HOST}:{self.port}\r\nAuthorization: Bearer {self.key}\r\n"
            "Accept: text/event-stream\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.t_send = now()
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        self.status, headers = await asyncio.wait_for(read_head(self.reader), 30)
        if self.status != 200:
            raise ConnectionError(f"HTTP {self.status}")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._body = aiter(body_chunks(self.reader, chunked, self))
        await self.read(until_events=1)

    async def read(self, until_events: int | None = None) -> None:
        """Read events until ``until_events`` have come, or the ``done`` event and its data
        (the answer's usage)."""
        while not (self.got_done and self.completion_tokens is not None) and (
            until_events is None or len(self.ids) < until_events
        ):
            if b"\n" not in self._buf:
                try:
                    self._buf += await anext(self._body)
                except StopAsyncIteration:
                    raise ConnectionError("closed before done") from None
                continue
            line, self._buf = self._buf.split(b"\n", 1)
            if line.startswith(b"id:"):
                self.ids.append(int(line[3:].strip()))
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
                if self._event == b"done":
                    self.got_done, self.t_done = True, now()
            elif line.startswith(b"data:") and self._event == b"done":
                self.completion_tokens = json.loads(line[5:])["usage"]["completion_tokens"]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _rss_peak(server: Server, fixture: Fixture, stop: asyncio.Event, out: list[int]) -> None:
    while not stop.is_set():
        kib = (await asyncio.to_thread(sample, server, fixture.redis))["rss_kib"]
        if kib is not None:
            out.append(kib)
        await asyncio.sleep(0.5)


async def _settled_rss(server: Server, fixture: Fixture, limit_s: float = 60) -> int | None:
    """The server's RSS (KiB) once it stopped growing (the server warms its moderation and
    embedding models in a thread after it answers: chatsite/asgi.py); at most ``limit_s``."""
    deadline, last = now() + limit_s, None
    while True:
        kib = (await asyncio.to_thread(sample, server, fixture.redis))["rss_kib"]
        if kib is None or (last is not None and abs(kib - last) < 1024) or now() > deadline:
            return kib
        last = kib
        await asyncio.sleep(2)


async def stall_phase(args, fixture: Fixture, server: Server, log) -> dict:
    """The phase (module docstring) on ``server``, which runs with :func:`stall_env`; -> its
    numbers (RSS in MiB, per-client growth in KiB)."""
    s, r = args.stalled, args.readers
    ids = fixture.conversations(s + r + 1)
    expected = list(range(1, args.stall_deltas + 2))  # every delta, then done

    warm = TurnClient(server.port, fixture.key, ids[-1], None)
    await warm.open()
    await warm.read()
    warm.close()
    base = await _settled_rss(server, fixture)

    stop, peaks = asyncio.Event(), []
    sampler = asyncio.create_task(_rss_peak(server, fixture, stop, peaks))
    stalled = [TurnClient(server.port, fixture.key, c, STALL_RCVBUF) for c in ids[:s]]
    readers = [TurnClient(server.port, fixture.key, c, None) for c in ids[s : s + r]]
    t0 = now()
    opened = await asyncio.gather(*(c.open() for c in stalled + readers), return_exceptions=True)
    for client, result in zip(stalled + readers, opened, strict=True):
        if isinstance(result, BaseException):
            client.error = f"{type(result).__name__}: {result}"[:160]
    reading = [c for c in readers if c.error is None]
    done = await asyncio.gather(*(c.read() for c in reading), return_exceptions=True)
    for client, result in zip(reading, done, strict=True):
        if isinstance(result, BaseException):
            client.error = f"{type(result).__name__}: {result}"[:160]
    # The stalled clients' answers were generated beside the readers' (generation never waits
    # for a reader); give the last of them the time one answer takes.
    await asyncio.sleep(args.stall_deltas * DELTA_PAUSE_S * 0.2 + 2)
    held = (await asyncio.to_thread(sample, server, fixture.redis))["rss_kib"]
    stop.set()
    await sampler

    live = [c for c in stalled if c.error is None]
    drained = await asyncio.gather(
        *(asyncio.wait_for(c.read(), 60) for c in live), return_exceptions=True
    )
    for client, result in zip(live, drained, strict=True):
        if isinstance(result, BaseException):
            client.error = f"{type(result).__name__}: {result}"[:160]
        client.close()
    for client in readers:
        client.close()
    await asyncio.sleep(1)
    after = (await asyncio.to_thread(sample, server, fixture.redis))["rss_kib"]

    errors: dict[str, int] = {}
    for client in stalled + readers:
        if client.error:
            errors[client.error] = errors.get(client.error, 0) + 1
    peak = max(peaks, default=held)
    # Complete: every id once, in order, and the server's own count (the done's usage) says
    # the answer had every delta (a short answer would be a short expectation, not a loss).
    complete = [
        c for c in stalled if c.ids == expected and c.completion_tokens == args.stall_deltas
    ]
    mismatch = next((c for c in stalled if c not in complete and c.error is None), None)
    return {
        "server": server.kind,
        "stalled": s,
        "readers": r,
        "answer_events": len(expected),
        "answer_text_kib": rnd(args.stall_deltas * args.stall_chars / 1024),
        "rss_mib": {
            "before": mib(base),
            "peak": mib(peak),
            "stalled_held": mib(held),
            "after_close": mib(after),
        },
        "kib_per_stream_at_peak": rnd((peak - base) / (s + r)) if base and peak else None,
        "kib_per_stalled_client": rnd((held - base) / s) if base and held and s else None,
        "reader_answer_s": dist([c.t_done - c.t_send for c in readers if c.t_done], 1, 2),
        "readers_done": sum(c.got_done for c in readers),
        "stalled_complete_after_drain": len(complete),
        "first_mismatch": _describe(mismatch, expected) if mismatch else None,
        "phase_s": rnd(now() - t0),
        "errors": errors,
    }


def _describe(client: TurnClient, expected: list[int]) -> str:
    """Where ``client``'s event ids first differ from ``expected`` (for the report)."""
    ids = client.ids
    at = next(
        (i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), min(len(ids), len(expected))
    )
    return (
        f"{len(ids)} events of {len(expected)}; first difference at position {at}: "
        f"got {ids[at : at + 3]}, expected {expected[at : at + 3]}; the done's usage says "
        f"{client.completion_tokens} completion tokens"
    )


def print_stall(res: dict, log) -> None:
    rss = res["rss_mib"]
    log(f"  answer: {res['answer_events']} events, {res['answer_text_kib']} KiB of text; "
        f"{res['stalled']} stalled clients (SO_RCVBUF {STALL_RCVBUF}), {res['readers']} readers")  # fmt: skip
    log(f"  RSS before {rss['before']} MiB -> peak {rss['peak']} -> stalled only "
        f"{rss['stalled_held']} -> after close {rss['after_close']}")  # fmt: skip
    log(f"  KiB per stream at peak      {res['kib_per_stream_at_peak']}")
    log(f"  KiB per stalled client      {res['kib_per_stalled_client']}")
    ra = res["reader_answer_s"]
    log(f"  readers done {res['readers_done']}/{res['readers']}, answer p50/p99 "
        f"{ra['p50']}/{ra['p99']} s")  # fmt: skip
    log(f"  stalled clients that got every event once, in order, after reading again: "
        f"{res['stalled_complete_after_drain']}/{res['stalled']}")  # fmt: skip
    if res["first_mismatch"]:
        log(f"  first stalled client that did not: {res['first_mismatch']}")
    if res["errors"]:
        log(f"  errors {json.dumps(res['errors'])}")


async def run_stall(args, fixture: Fixture, server: Server, log) -> dict:
    """:func:`stall_phase` with its own error handling (a failed phase is reported, not
    raised, so the other server is still measured)."""
    try:
        return await stall_phase(args, fixture, server, log)
    except Exception as exc:  # noqa: BLE001
        with contextlib.suppress(Exception):
            log(f"  stall phase failed: {type(exc).__name__}: {exc}")
        return {"server": server.kind, "failed": f"{type(exc).__name__}: {exc}"[:200]}
