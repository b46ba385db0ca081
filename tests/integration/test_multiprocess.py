"""Two server processes sharing PostgreSQL and Redis: a turn's stream resumes on the other one."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from django.conf import settings as django_settings

from accounts.services import api_key_create, service_api_key
from tests.processes import server_process

pytestmark = pytest.mark.real_engine  # uses the shared uvicorn server (process 1)


@pytest.fixture(scope="module")
def second_gateway(chat_server):
    """Another uvicorn process on the same database and Redis. It has no real engine (the
    scripted double's class, never asked to generate here): it only resumes streams."""
    with server_process(
        {"CHAT_ENGINE_CLASS": "tests.fakes.ScriptedEngine", "CHAT_SSE_KEEPALIVE_S": "1"},
        "/v1/openapi.json",
    ) as url:
        yield url


def _events(lines):
    """Parse SSE lines into [(id, event, data)] up to done/error."""
    out, current = [], {}
    for line in lines:
        if line.startswith("id: "):
            current["id"] = int(line[4:])
        elif line.startswith("event: "):
            current["event"] = line[7:]
        elif line.startswith("data: "):
            current["data"] = json.loads(line[6:])
            out.append((current.get("id"), current["event"], current["data"]))
            if current["event"] in ("done", "error"):
                return out
            current = {}
    return out


def test_pf_s4_resume_on_another_process_gets_exactly_the_rest(live, engine_double, make_user, settings, second_gateway):
    """PF-S4: drop the connection after event k while generation goes on; reconnect *to the
    other server process* with Last-Event-ID: k: events k+1.. arrive exactly once, in order,
    each with an id."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 10
    engine_double.scripts = [["a", "b", "c", 0.6, "d", "e"]]
    key = api_key_create(user=make_user("mp"), name="mp").raw
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = httpx.post(f"{live.url}/v1/conversations", json={}, headers=headers).json()["conversation_id"]

    seen = []
    with httpx.stream(
        "POST", f"{live.url}/v1/conversations/{conversation_id}/turns",
        json={"role": "user", "content": "go"}, headers=headers, timeout=30,
    ) as response:  # fmt: skip
        turn_id = response.headers["X-Turn-Id"]
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("id: "):
                seen.append(int(line[4:]))
            if len(seen) == 3 and line.startswith("data: "):
                break  # drop the connection after event 3

    with httpx.stream(
        "GET", f"{second_gateway}/v1/conversations/{conversation_id}/turns/{turn_id}/events",
        headers={**headers, "Last-Event-ID": "3"}, timeout=30,
    ) as resumed:  # fmt: skip
        assert resumed.status_code == 200
        rest = _events(resumed.iter_lines())

    assert [eid for eid, _, _ in rest] == [4, 5, 6]
    assert [(e, d.get("text")) for _, e, d in rest[:2]] == [("token", "d"), ("token", "e")]
    assert rest[-1][1] == "done" and rest[-1][2]["status"] == "complete"
    assert engine_double.aborted == {}


def test_resume_elsewhere_is_refused_for_another_users_turn(live, engine_double, make_user, second_gateway):
    engine_double.scripts = [["x", 0.3, "y"]]
    owner = api_key_create(user=make_user("owner-mp"), name="k").raw
    intruder = api_key_create(user=make_user("intruder-mp"), name="k").raw
    own = {"Authorization": f"Bearer {owner}"}
    conversation_id = httpx.post(f"{live.url}/v1/conversations", json={}, headers=own).json()["conversation_id"]
    with httpx.stream("POST", f"{live.url}/v1/conversations/{conversation_id}/turns",
                      json={"role": "user", "content": "go"}, headers=own, timeout=30) as response:
        turn_id = response.headers["X-Turn-Id"]
        list(response.iter_lines())
    other = httpx.get(
        f"{second_gateway}/v1/conversations/{conversation_id}/turns/{turn_id}/events",
        headers={"Authorization": f"Bearer {intruder}"},
    )
    assert other.status_code == 404


def test_one_generating_turn_per_conversation_across_processes_and_cancel_from_the_other(
    live, engine_double, make_user, second_gateway
):
    """PF-P1 across processes: while process 1 writes an answer, a turn posted to process 2
    gets a 409; a cancel posted to process 2 stops the generation in process 1 at once and the
    partial answer is stored as cancelled."""
    from conversations.models import Turn

    engine_double.scripts = [["partial", 30.0, "never"]]
    key = api_key_create(user=make_user("mp2"), name="k").raw
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = httpx.post(f"{live.url}/v1/conversations", json={}, headers=headers).json()["conversation_id"]
    with httpx.stream("POST", f"{live.url}/v1/conversations/{conversation_id}/turns",
                      json={"role": "user", "content": "one"}, headers=headers, timeout=30) as response:
        lines = response.iter_lines()
        for line in lines:
            if '"text":"partial"' in line:
                break
        busy = httpx.post(f"{second_gateway}/v1/conversations/{conversation_id}/turns",
                          json={"role": "user", "content": "two"}, headers=headers)
        assert busy.status_code == 409
        assert busy.json()["error"]["type"] == "conflict"

        started = time.monotonic()
        cancelled = httpx.post(f"{second_gateway}/v1/conversations/{conversation_id}/cancel", headers=headers)
        assert cancelled.status_code == 204
        assert time.monotonic() - started < 3
        assert engine_double.aborted
        rest = "\n".join(lines)
    assert '"status":"cancelled"' in rest
    live.drain()
    answer = Turn.objects.get(conversation_id=conversation_id, role="assistant")
    assert (answer.status, answer.content) == ("cancelled", "partial")
    assert Turn.objects.filter(conversation_id=conversation_id, role="user").count() == 1


def test_a_resumed_stream_survives_silence_with_keep_alives(live, engine_double, make_user, settings, second_gateway):
    """A stream resumed on another process outlives a 3.5 s pause between tokens (Redis reads
    must not time out), with `: keep-alive` comments meanwhile, and ends with done."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 10
    engine_double.scripts = [["a", 3.5, "b"]]
    key = api_key_create(user=make_user("quiet"), name="k").raw
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = httpx.post(f"{live.url}/v1/conversations", json={}, headers=headers).json()["conversation_id"]
    with httpx.stream("POST", f"{live.url}/v1/conversations/{conversation_id}/turns",
                      json={"role": "user", "content": "go"}, headers=headers, timeout=30) as response:
        turn_id = response.headers["X-Turn-Id"]
        for line in response.iter_lines():
            if '"text":"a"' in line:
                break
    with httpx.stream("GET", f"{second_gateway}/v1/conversations/{conversation_id}/turns/{turn_id}/events",
                      headers={**headers, "Last-Event-ID": "1"}, timeout=30) as resumed:
        lines = list(resumed.iter_lines())
    assert sum(1 for line in lines if line.startswith(": keep-alive")) >= 2
    assert any('"text":"b"' in line for line in lines)
    assert any(line == "event: done" for line in lines)


@pytest.fixture
def engineless_gateway(live, make_user):
    """A uvicorn process with no engine of its own: its model is process 1's, reached through
    process 1's OpenAI-compatible /v1/completions with the service credential (as
    ``make run-prod`` does; only it may forward a turn's tier and priority, issue 17)."""
    service_key = service_api_key()
    with server_process(
        {
            "CHAT_ENGINE_CLASS": "inference.remote.OpenAIRemoteEngine",
            "CHAT_ENGINE_URL": live.url,
            "CHAT_ENGINE_API_KEY": service_key,
            "CHAT_MODEL_PATH": str(django_settings.CHAT_MODEL_PATH),
        },
        "/readyz",
    ) as url:
        yield url


def test_gateway_without_an_engine_streams_from_another_process_and_cancel_reaches_it(
    live, make_user, settings, engineless_gateway
):
    """A second gateway with no engine answers a turn with process 1's real engine (through the
    OpenAI-compatible endpoint); its stored answer equals what it streamed; a cancel on the
    gateway frees process 1's engine within 1 s."""
    from conversations.models import Turn

    settings.CHAT_MAX_TOKENS = 400
    baseline = live.unfinished()
    key = api_key_create(user=make_user("remote-user"), name="k").raw
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = httpx.post(f"{engineless_gateway}/v1/conversations", json={}, headers=headers).json()["conversation_id"]

    with httpx.stream("POST", f"{engineless_gateway}/v1/conversations/{conversation_id}/turns",
                      json={"role": "user", "content": "Name three colors."}, headers=headers, timeout=120) as response:
        events = _events(response.iter_lines())
    tokens = [d["text"] for _, e, d in events if e == "token"]
    assert len(tokens) >= 3 and events[-1][1] == "done", events[-3:]
    answer = Turn.objects.get(conversation_id=conversation_id, role="assistant")
    assert answer.content == "".join(tokens)
    assert answer.token_count == events[-1][2]["usage"]["completion_tokens"] > 0

    with httpx.stream("POST", f"{engineless_gateway}/v1/conversations/{conversation_id}/turns",
                      json={"role": "user", "content": "Now write a very long story about a dragon.", "max_tokens": 400},
                      headers=headers, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("event: token"):
                break
        assert live.unfinished() == baseline + 1  # process 1's engine is doing the work
        cancelled = httpx.post(f"{engineless_gateway}/v1/conversations/{conversation_id}/cancel", headers=headers)
        assert cancelled.status_code == 204
    started = time.monotonic()
    while live.unfinished() > baseline and time.monotonic() - started < 1.0:
        time.sleep(0.02)
    assert live.unfinished() == baseline


def test_a_withdrawn_answer_ends_its_reader_in_the_other_process_at_once(live, engine_double, make_user, settings, second_gateway):
    """Given an answer written by process 1 and read from process 2 (its Redis log); when
    process 1's output gate withdraws it (an organisation's blocked term); then process 2's
    reader gets the moderation event and its stream ends within 1 s of it, and a cancel posted
    to process 2 afterwards returns within 1 s."""
    from accounts.models import Membership, Organisation

    settings.CHAT_MODERATION_STEP_CHARS = 8
    engine_double.scripts = [["one", " two", 0.8, " bananarama", 30.0, " never"]]
    user = make_user("mp-withdrawn")
    org = Organisation.objects.create(name="Acme", slug="acme-withdrawn", blocked_terms=["bananarama"])
    Membership.objects.create(organisation=org, user=user)
    key = api_key_create(user=user, name="k").raw
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = httpx.post(f"{live.url}/v1/conversations", json={}, headers=headers).json()["conversation_id"]
    with httpx.stream("POST", f"{live.url}/v1/conversations/{conversation_id}/turns",
                      json={"role": "user", "content": "count"}, headers=headers, timeout=30) as response:  # fmt: skip
        turn_id = response.headers["X-Turn-Id"]
        seen, ended_after = [], None
        with httpx.stream(
            "GET", f"{second_gateway}/v1/conversations/{conversation_id}/turns/{turn_id}/events",
            headers=headers, timeout=30,
        ) as remote:  # fmt: skip
            assert remote.status_code == 200
            withdrawn_at = None
            for line in remote.iter_lines():
                if line.startswith("event: "):
                    seen.append(line[7:])
                    if line == "event: moderation":
                        withdrawn_at = time.monotonic()
            ended_after = time.monotonic() - withdrawn_at if withdrawn_at else None
        for _ in response.iter_lines():  # the answer's own stream ends too
            pass
    assert seen[-1] == "moderation" and "done" not in seen, seen
    assert ended_after is not None and ended_after < 1.0, ended_after

    started = time.monotonic()
    cancelled = httpx.post(f"{second_gateway}/v1/conversations/{conversation_id}/cancel", headers=headers)
    assert cancelled.status_code == 204
    assert time.monotonic() - started < 1.0
