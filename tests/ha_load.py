"""The write load of the failover test and benchmark, run inside an app process.

``python -m tests.ha_load`` is a :class:`tests.pgcluster.AppProcess` app with one more op,
``append_loop``: user turns appended through the real service (``turn_append_user``) at a fixed
rate, each attempt its own "request" (connections closed or returned at its end, as Django's
``request_finished`` does), while the conversation's turns are counted through the router's read
path (a replica when one is up). A turn is *acknowledged* when the service returned it; a failed
attempt is never retried (a retry of a commit whose answer was lost could store it twice), so
the test can demand: every acknowledged turn stored exactly once, nothing else stored twice.
"""

from __future__ import annotations

import threading
import time

from tests import pgcluster_ops


def op_append_loop(
    username: str,
    conversation_id: str,
    rate: float = 20.0,
    max_s: float = 60.0,
    settle_s: float = 3.0,
    read_interval_s: float = 0.2,
) -> dict:
    """Append user turns ``seq <n>`` at ``rate`` per second for at most ``max_s`` seconds,
    stopping early once writes have failed and then succeeded again for ``settle_s`` seconds.
    Meanwhile a second thread counts the conversation's turns on the read path every
    ``read_interval_s`` seconds (reads do not wait behind refused writes).

    Returns ``{"acked": [[n, turn_id, t_start, t_end]], "failed": [[n, t_start, t_end, error]],
    "reads": [[t, ok, port, in_recovery]]}``, times in Unix seconds (``time.time()``, so the
    test can line them up with when it killed a server).
    """
    from django.db import DatabaseError, close_old_connections, connections  # noqa: PLC0415

    from conversations import selectors, services  # noqa: PLC0415
    from core import regions  # noqa: PLC0415
    from conversations.models import Turn  # noqa: PLC0415

    user = pgcluster_ops._user(username)
    conversation = selectors.conversation_get_for_user(conversation_id=conversation_id, user=user)
    db = regions.conversation_db(conversation)
    close_old_connections()
    acked, failed, reads = [], [], []
    done = threading.Event()

    def reader() -> None:
        objects = regions.manager(Turn, db)
        while not done.wait(read_interval_s):
            reads.append(_read(objects, conversation_id, connections))
            close_old_connections()
        connections.close_all()

    reading = threading.Thread(target=reader, daemon=True)
    reading.start()
    started = time.monotonic()
    failed_once_at = None
    for n in range(int(rate * max_s)):
        delay = started + n / rate - time.monotonic()
        if time.monotonic() - started >= max_s:
            break
        if delay > 0:
            time.sleep(delay)
        t0 = time.time()
        try:
            # The owner's row goes with the write, as tests/pgcluster_ops.py's op does: the training
            # flag is then read from it, not from the global database's replica alias.
            turn = services.turn_append_user(conversation=conversation, content=f"seq {n}", owner=user)
            acked.append([n, str(turn.turn_id), t0, time.time()])
        except DatabaseError as exc:
            failed.append([n, t0, time.time(), f"{type(exc).__name__}: {str(exc)[:200]}"])
            failed_once_at = time.monotonic()
        finally:
            close_old_connections()
        recovered = failed_once_at is not None and acked and acked[-1][2] > failed[-1][1]
        if recovered and time.monotonic() - failed_once_at >= settle_s:
            break
    done.set()
    reading.join()
    return {"acked": acked, "failed": failed, "reads": reads}


def _read(objects, conversation_id: str, connections) -> list:
    """[t, ok, port, in_recovery] of one count of the conversation's turns on the read path."""
    from django.db import DatabaseError  # noqa: PLC0415

    t = time.time()
    query = objects.filter(conversation_id=conversation_id)
    try:
        query.count()
        with connections[query.db].cursor() as cursor:
            cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
            port, in_recovery = cursor.fetchone()
        return [t, True, port, in_recovery]
    except DatabaseError:
        return [t, False, None, None]


def write_unavailable_window(result: dict) -> float | None:
    """Seconds from the last acknowledged write before the first failure to the first
    acknowledged write after it (None: no write failed)."""
    if not result["failed"]:
        return None
    first_failure = result["failed"][0][1]
    before = [a[3] for a in result["acked"] if a[3] <= first_failure]
    after = [a[3] for a in result["acked"] if a[2] > first_failure]
    if not after:
        return float("inf")
    return after[0] - (before[-1] if before else first_failure)


_keys: dict[str, str] = {}


def op_api(username: str, method: str, path: str, body: dict | None = None) -> dict:
    """One ``/v1`` request as ``username`` (a bearer key issued on first use) through Django's
    test client, in this process: ``{"status", "retry_after", "json"}``."""
    import json  # noqa: PLC0415

    from django.test import Client  # noqa: PLC0415

    from accounts import services as account_services  # noqa: PLC0415

    if username not in _keys:
        _keys[username] = account_services.api_key_create(
            user=pgcluster_ops._user(username), name="ha"
        ).raw
    response = Client().generic(
        method, path, json.dumps(body) if body is not None else "", content_type="application/json",
        headers={"Authorization": f"Bearer {_keys[username]}"}, HTTP_HOST="localhost",
    )  # fmt: skip
    streaming = getattr(response, "streaming", False)
    payload = None if streaming else json.loads(response.content or b"null")
    return {
        "status": response.status_code,
        "retry_after": response.headers.get("Retry-After"),
        "json": payload,
    }


def probe_loop(
    url: str, *, username: str, password: str, api_key: str, conversation_id: str,
    started: threading.Event | None = None, interval_s: float = 0.5, max_s: float = 60.0,
) -> list[dict]:
    """Run in the test process against a gateway at ``url`` (a real server process): sign in as
    ``username`` (the login form), then every ``interval_s`` seconds send three requests as a
    browser and an API client would: ``page`` a GET of the chat page, ``page_turn`` the chat
    page's message form (htmx; it starts a new chat), ``api_turn`` a ``/v1`` turn of
    ``conversation_id`` (its stream read to the end). ``started`` is set once signed in. Stops
    once all three succeeded in one round after some round failed, or after ``max_s`` seconds.

    Returns ``[{"kind", "t0", "t1", "status", "retry_after", "content_type", "headers",
    "body"}]`` (times ``time.time()``; ``body``: the first 2,000 characters; ``status`` None
    when no answer came within 15 s: a hung request)."""
    import httpx  # noqa: PLC0415

    probes: list[dict] = []
    with httpx.Client(base_url=url, timeout=15) as client:
        login = client.get("/accounts/login/")
        client.post(
            "/accounts/login/", data={"username": username, "password": password},
            headers={"X-CSRFToken": client.cookies["csrftoken"], "Referer": f"{url}/accounts/login/"},
        )  # fmt: skip
        assert "sessionid" in client.cookies, f"could not sign in: {login.status_code}"
        csrf = {"X-CSRFToken": client.cookies["csrftoken"]}
        requests = {
            "page": lambda: client.get("/"),
            "page_turn": lambda: client.post(
                "/chat/turns", data={"content": "still there?"}, headers={**csrf, "HX-Request": "true"}
            ),
            "api_turn": lambda: client.post(
                f"/v1/conversations/{conversation_id}/turns",
                json={"role": "user", "content": "still there?"},
                headers={"Authorization": f"Bearer {api_key}"},
            ),
        }  # fmt: skip
        if started is not None:
            started.set()
        failed_once = False
        began = time.monotonic()
        while time.monotonic() - began < max_s:
            round_ok = True
            for kind, send in requests.items():
                t0 = time.time()
                try:
                    response = send()
                except httpx.TimeoutException:
                    probes.append({"kind": kind, "t0": t0, "t1": time.time(), "status": None})
                    round_ok = False
                    continue
                probes.append({
                    "kind": kind, "t0": t0, "t1": time.time(), "status": response.status_code,
                    "retry_after": response.headers.get("Retry-After"),
                    "content_type": response.headers.get("Content-Type", ""),
                    "headers": dict(response.headers), "body": response.text[:2000],
                })  # fmt: skip
                round_ok = round_ok and response.status_code < 400
            failed_once = failed_once or not round_ok
            if failed_once and round_ok:
                break
            time.sleep(interval_s)
    return probes


if __name__ == "__main__":
    pgcluster_ops._serve({**pgcluster_ops.OPS, "append_loop": op_append_loop, "api": op_api})
