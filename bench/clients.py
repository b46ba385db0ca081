"""The benches' clients of the stack: the one SSE parser, a bench user with an API key driving
``/v1`` (synchronously, or from an event loop for concurrent turns), and a user signed up through
the sign-up form driving the page as a browser does.

TTFT is measured by every client the same way: request sent -> first ``token`` event with text;
TPOT by :func:`bench.harness.tpot`. Users of this module have set Django up (the dev stack
provides PostgreSQL and Redis: ``python -m chatsite.devstack exec -- ...``).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from dataclasses import dataclass

from bench.harness import log, tpot


def sse_split(buffer: bytes) -> tuple[list[tuple[str, object]], bytes]:
    """The complete SSE blocks at the front of ``buffer`` as (event name, data) pairs, and the
    incomplete rest. The name defaults to "message"; data is the block's ``data:`` line decoded
    as JSON ("[DONE]" kept as that string, None without a data line); comments (keep-alives)
    and ``id:`` lines are skipped."""
    events = []
    while (cut := buffer.find(b"\n\n")) >= 0:
        block, buffer = buffer[:cut], buffer[cut + 2 :]
        name, data = "message", None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                raw = line[5:].strip()
                data = raw.decode() if raw == b"[DONE]" else json.loads(raw)
        if name != "message" or data is not None:
            events.append((name, data))
    return events, buffer


async def sse_events(response):
    """(event name, data, arrival perf_counter seconds) for each SSE event of an httpx
    streaming response (async)."""
    buffer = b""
    async for chunk in response.aiter_raw():
        now = time.perf_counter()
        events, buffer = sse_split(buffer + chunk)
        for name, data in events:
            yield name, data, now


def sse_events_sync(response):
    """:func:`sse_events` for a synchronous httpx streaming response."""
    buffer = b""
    for chunk in response.iter_raw():
        now = time.perf_counter()
        events, buffer = sse_split(buffer + chunk)
        for name, data in events:
            yield name, data, now


@dataclass
class TurnSample:
    """One streamed turn of :meth:`Api.turn`, as the client saw it."""

    gate: str  # the phase it belongs to ("on" | "off" | ...: the bench's name for it)
    round: int
    prompt_index: int
    ttft_s: float | None
    tpot_s: float | None
    done_after_last_token_s: float | None
    completion_tokens: int
    status: str  # the done event's status; "blocked" when a moderation event ended the answer
    error: str | None = None
    usage: dict | None = None  # the done event's usage (prompt, cached, completion tokens, cost)


def connections_close_all() -> None:
    from django.db import connections  # noqa: PLC0415

    connections.close_all()


class Api:
    """A bench user (tier paid) with an API key, made in the database, and a synchronous client
    for ``/v1``; :meth:`close` deletes its conversations and the user. ``prefix`` names it
    (``{prefix}-{random}``); ``clear_leftovers`` first deletes every ``{prefix}-`` user left by
    an interrupted run (only for a prefix no other bench running meanwhile uses)."""

    def __init__(self, url: str, *, prefix: str = "modbench", key_name: str = "moderation bench",
                 clear_leftovers: bool = True) -> None:  # fmt: skip
        import httpx  # noqa: PLC0415

        from accounts.models import User  # noqa: PLC0415
        from accounts.services import api_key_create  # noqa: PLC0415

        if clear_leftovers:  # their conversations go with them
            User.objects.filter(username__startswith=f"{prefix}-").delete()
        self.user = User.objects.create_user(
            username=f"{prefix}-{secrets.token_hex(4)}", password=secrets.token_urlsafe(16),
            tier="paid",
        )  # fmt: skip
        self.key = api_key_create(user=self.user, name=key_name).raw
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {self.key}"},
            timeout=httpx.Timeout(300, connect=30),
        )  # fmt: skip
        self.conversations: list[str] = []

    def turn(self, prompt: str, max_tokens: int, gate: str, round_: int, index: int,
             system_prompt: str = "", conversation_id: str | None = None) -> TurnSample:  # fmt: skip
        """One fresh conversation (``system_prompt``: its instructions; "" for the default) and
        one streamed turn of ``prompt``, timed; or, given ``conversation_id`` (the conversation
        of :attr:`last_conversation`), the next turn there. A failure is the sample's
        ``error``."""
        if conversation_id is None:
            created = self.client.post(
                "/v1/conversations", json={"system_prompt": system_prompt} if system_prompt else {}
            )
            created.raise_for_status()
            conversation_id = created.json()["conversation_id"]
            self.conversations.append(conversation_id)
        first = last = end = None
        completion, status, error, usage = 0, "", None, None
        body = {"role": "user", "content": prompt, "max_tokens": max_tokens}
        t0 = time.perf_counter()
        try:
            with self.client.stream(
                "POST", f"/v1/conversations/{conversation_id}/turns", json=body
            ) as response:
                if response.status_code != 200:
                    response.read()
                    raise RuntimeError(
                        f"POST turns -> {response.status_code}: {response.text[:300]}"
                    )
                for name, data, now in sse_events_sync(response):
                    if name == "token" and data and data.get("text"):
                        first = first or now
                        last = now
                    elif name == "done":
                        usage = data["usage"]
                        completion = usage["completion_tokens"]
                        status = data.get("status", "")
                        end = now
                        break
                    elif name == "moderation":
                        status = "blocked"
                        end = now
                        break
                    elif name == "error":
                        raise RuntimeError(f"error event: {data}")
            if end is None:
                raise RuntimeError("the event stream ended without done")
        except Exception as exc:  # noqa: BLE001 - counted and shown
            error = repr(exc)
        return TurnSample(
            gate=gate, round=round_, prompt_index=index,
            ttft_s=None if first is None else first - t0,
            tpot_s=tpot(first, last, completion),
            done_after_last_token_s=None if end is None or last is None else end - last,
            completion_tokens=completion, status=status, error=error, usage=usage,
        )  # fmt: skip

    @property
    def last_conversation(self) -> str:
        """The id of the conversation :meth:`turn` created last."""
        return self.conversations[-1]

    def close(self) -> None:
        for conversation_id in self.conversations:
            with contextlib.suppress(Exception):
                self.client.delete(f"/v1/conversations/{conversation_id}")
        self.client.close()
        for attempt in (1, 2):
            connections_close_all()  # this thread's connection may be minutes old
            try:
                self.user.delete()
                return
            except Exception as exc:  # noqa: BLE001 - a leftover bench user is harmless
                if attempt == 2:
                    log(f"could not delete bench user {self.user.username}: {exc!r}")


class AsyncApi:
    """An :class:`Api` user's ``/v1`` conversations from an event loop (many turns at once);
    the conversations it creates are the Api's, deleted by its ``close``."""

    name = "full stack"

    def __init__(self, url: str, api: Api) -> None:
        self.api = api
        self.url = url
        self.client = None

    async def open(self) -> None:
        """A client for this event loop (each measurement runs in a loop of its own)."""
        import httpx  # noqa: PLC0415

        self.client = httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.api.key}"},
            timeout=httpx.Timeout(600, connect=30),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )  # fmt: skip

    async def new_conversation(self) -> dict:
        response = await self.client.post("/v1/conversations", json={})
        response.raise_for_status()
        conversation_id = response.json()["conversation_id"]
        self.api.conversations.append(conversation_id)
        return {"id": conversation_id}

    async def turn(self, conversation: dict, content: str, max_tokens: int, t0: float) -> tuple:
        """One streamed turn -> (first token time, last token time, prompt tokens, completion
        tokens), perf_counter seconds. Raises RuntimeError on a refusal or an error event."""
        first = last = None
        body = {"role": "user", "content": content, "max_tokens": max_tokens}
        async with self.client.stream(
            "POST", f"/v1/conversations/{conversation['id']}/turns", json=body
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"POST turns -> {response.status_code}: {response.text[:300]}")
            async for name, data, now in sse_events(response):
                if name == "token" and data and data.get("text"):
                    first = first or now
                    last = now
                elif name in ("done", "moderation"):
                    # A withdrawn answer (the output gate flagged the 135M model's text) still
                    # streamed its tokens: they count like any other.
                    usage = data["usage"]
                    return first, last, usage["prompt_tokens"], usage["completion_tokens"]
                elif name == "error":
                    raise RuntimeError(f"{name} event: {str(data)[:300]}")
        raise RuntimeError("the event stream ended without done")

    async def close(self) -> None:
        await self.client.aclose()


@dataclass
class PageUser:
    client: object  # httpx.AsyncClient, logged in (session cookie)
    csrf: str


PASSWORD = "bench-Correct-Horse-Battery-42"


async def page_signup(base_url: str, username: str) -> PageUser:
    """A user signed up through the sign-up form (which logs them in), with an async client
    that holds the session, as a browser would. Raises RuntimeError when sign-up fails."""
    import httpx  # noqa: PLC0415

    client = httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(600, connect=30),
        follow_redirects=False,
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
    )
    r = await client.get("/accounts/signup/")
    r.raise_for_status()
    r = await client.post(
        "/accounts/signup/",
        data={
            "username": username,
            "password1": PASSWORD,
            "password2": PASSWORD,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    if r.status_code != 302:
        await client.aclose()
        raise RuntimeError(f"sign-up of {username} failed: {r.status_code} {r.text[:500]}")
    # Login rotated the CSRF token; the new cookie came with the redirect.
    return PageUser(client=client, csrf=client.cookies["csrftoken"])
