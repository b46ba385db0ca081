"""The production run mode with the real model: ``python -m chatsite.prodstack run
--engine-url`` (gateways without an engine, using a remote engine server: here the session's
shared daphne with the real vLLM engine) behind nginx with TLS, production settings.

A turn goes browser-side -> nginx (HTTPS) -> a gateway -> the engine server's OpenAI-compatible
/v1/completions (service key) -> vLLM, and its tokens stream back the same way; the Celery worker
writes the answer to PostgreSQL. tests/integration/test_production.py checks the rest of the
mode with the scripted engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from accounts.services import service_api_key
from inference.admission import admission_for
from tests.integration.test_production import _create_user, _stream_turn, run_prodstack

pytestmark = pytest.mark.real_engine


@pytest.fixture(scope="module")
def real_stack(chat_server, django_db_blocker, tmp_path_factory):
    """Two engine-less gateways, Celery and nginx, with the session's real engine as their
    engine server, shared by this module's tests (each test's data is flushed after it: its
    ``live`` fixture; :func:`service_key` puts the gateways' credential back). Free turns are
    shed beyond 2 waiting at the engine; the gateways read the engine's queue every 0.1 s at
    most. The in-process engine server answers the gateways between tests too, so database
    access stays unblocked for the module."""
    with django_db_blocker.unblock():
        with run_prodstack(
            tmp_path_factory.mktemp("prod-real"),
            gateways=2,
            extra_args=["--engine-url", chat_server.url],
            extra_env={
                "CHAT_SERVICE_API_KEY": service_api_key(),
                "CHAT_MAX_TOKENS": "48",
                "CHAT_SHED_FREE_WAITING": "2",
                "CHAT_ENGINE_LOAD_TTL_S": "0.1",
            },
        ) as running:
            yield running


@pytest.fixture
def service_key(live) -> str:
    """The gateways' service credential (this process's own, set as their
    CHAT_SERVICE_API_KEY), its row re-created after the previous test's flush."""
    return service_api_key()


def test_a_real_answer_streams_through_the_production_mode(real_stack, live, service_key):
    """Given the production mode in front of the real engine; when a user sends a message
    through nginx; then the model's tokens stream back as token events, the stream ends with
    done, and the stored answer (written back by the Celery worker) is exactly the streamed
    text, with the engine's token count."""
    from conversations.models import Turn  # noqa: PLC0415

    _create_user("prod-real")
    client, _ = real_stack.login("prod-real")
    with contextlib.closing(client):
        _, tokens, done = _stream_turn(client, "Write a short story about a lighthouse keeper.")
    assert done["event"] == "done" and done["status"] == "complete", done
    assert len(tokens) >= 10, tokens
    deadline = time.monotonic() + 60
    while not Turn.objects.filter(turn_id=done["turn_id"]).exists():
        assert time.monotonic() < deadline, real_stack.log("celery-worker")
        time.sleep(0.3)
    stored = Turn.objects.get(turn_id=done["turn_id"])
    assert stored.content == "".join(tokens)
    assert stored.token_count == done["usage"]["completion_tokens"] > 0


# --- tier and priority across the gateway -> engine hop (issue 17) -------------------------------


class Streams:
    """Answer streams read in threads; ``first_tokens`` lists stream names in the order their
    first token arrived, ``ends`` each stream's last event (done / error / moderation)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first_tokens: list[str] = []
        self.ends: dict[str, dict] = {}
        self.threads: list[threading.Thread] = []

    def read(self, name: str, client: httpx.Client, url: str) -> None:
        def run():
            try:
                read()
            except httpx.HTTPError as exc:  # noted, so the assertion below shows it
                self.ends[name] = {"event": "exception", "error": repr(exc)}

        def read():
            event, first = "", True
            with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "token" and first:
                        first = False
                        with self.lock:
                            self.first_tokens.append(name)
                    elif line.startswith("data: ") and event in ("done", "error", "moderation"):
                        self.ends[name] = {"event": event, **json.loads(line[6:])}
                        return

        thread = threading.Thread(target=run, name=f"stream-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.1, deadline - time.monotonic()))


def _in_loop(live, fn):
    """Run ``fn()`` in the live server's event loop (the admission queue lives there)."""

    async def call():
        return fn()

    return live.call(call())


def _wait_for(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _shed_count(gateway_url: str) -> float:
    """chat_shed_total{tier="free", action="shed"} on one gateway's /metrics."""
    text = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "chat_shed_total" and sample.labels == {"tier": "free", "action": "shed"}
    )


def test_across_two_gateways_a_paid_turn_overtakes_queued_free_turns_and_shedding_is_one(
    real_stack, live, service_key, settings
):
    """Given the production topology (2 engine-less gateways behind nginx, the real engine in the
    engine process) with both engine slots held, as two long free answers hold them; when three
    free turns queue at the engine, then a paid turn, then a background job (service key, no
    admission field), and then four more free turns arrive through the gateways; then

    - the four late free turns are shed (503 busy) on the engine's queue depth, and the gateways'
      shed counts add up to exactly those four (N gateways shed as one queue);
    - when a slot frees, the paid turn is granted it before every free turn queued ahead of it
      (from the engine's grant log: arrival and grant positions, no clocks), and its first token
      reaches its reader before any free turn's;
    - the free turns reach the engine at free priority without the reserved slots, the paid one
      at paid priority with them: the tier crossed the hop;
    - the background job is granted last, and every answer completes."""
    settings.CHAT_RESERVED_SLOTS = 0  # the order alone must put paid first, not a held-back slot
    admission = admission_for(live.engine)
    start = max((g.granted for g in _in_loop(live, lambda: list(admission.grants))), default=-1)
    _in_loop(live, lambda: admission.set_limit(2))
    holders: list[asyncio.Event] = []

    async def hold(release: asyncio.Event):
        async with admission.slot(priority=1, reserved_ok=False, tag="holder"):
            await release.wait()

    def start_holders():
        for _ in range(2):
            holders.append(asyncio.Event())
            asyncio.get_running_loop().create_task(hold(holders[-1]))

    def release_holder():
        holders.pop().set()

    streams = Streams()
    clients: list[httpx.Client] = []
    background: dict = {}
    try:
        _in_loop(live, start_holders)
        _wait_for(lambda: _in_loop(live, admission.running) == 2, "the holders' slots")

        def send(name: str, **fields) -> httpx.Response:
            _create_user(name, **fields)
            client, _ = real_stack.login(name)
            clients.append(client)
            return client.post(
                "/chat/turns", data={"content": "Tell me about the sea."}, headers={"HX-Request": "true"}
            )

        for i, name in enumerate(["free-a", "free-b", "free-c", "paid-p"], 1):
            response = send(name, tier="paid" if name.startswith("paid") else "free")
            assert response.status_code == 200, (name, response.text[:300])
            streams.read(name, clients[-1], re.search(r'sse-connect="([^"]+)"', response.text).group(1))
            _wait_for(lambda i=i: _in_loop(live, admission.waiting) == i, f"{name} queued at the engine")

        def background_job():
            with httpx.Client(base_url=live.url, timeout=120) as job:
                response = job.post(
                    "/v1/completions",
                    headers={"Authorization": f"Bearer {service_key}"},
                    json={"model": "SmolLM2-135M-Instruct", "prompt": "The sea is", "max_tokens": 8},
                )
                background["status"] = response.status_code

        job_thread = threading.Thread(target=background_job, name="background-job", daemon=True)
        job_thread.start()
        _wait_for(lambda: _in_loop(live, admission.waiting) == 5, "the background job queued")

        shed_before = [_shed_count(url) for url in real_stack.gateways]
        time.sleep(0.25)  # past the gateways' 0.1 s cache of the engine's queue depth
        late = [send(f"free-late-{i}", tier="free") for i in range(4)]
        assert [r.status_code for r in late] == [503] * 4, [r.text[:300] for r in late]
        assert all("busy" in r.text for r in late)
        shed_after = [_shed_count(url) for url in real_stack.gateways]
        assert sum(shed_after) - sum(shed_before) == 4, (shed_before, shed_after)
        assert _in_loop(live, admission.waiting) == 5  # nothing shed reached the engine

        _in_loop(live, release_holder)
        _wait_for(lambda: streams.first_tokens, "a first token after a slot freed", 60)
        _in_loop(live, release_holder)
        streams.join(120)
        job_thread.join(60)
    finally:
        for release in holders:
            live.loop.call_soon_threadsafe(release.set)
        _in_loop(live, lambda: admission.set_limit(None))
        for client in clients:
            client.close()

    assert streams.first_tokens[0] == "paid-p", streams.first_tokens
    assert sorted(streams.first_tokens) == ["free-a", "free-b", "free-c", "paid-p"], streams.ends
    assert {name: end["event"] for name, end in streams.ends.items()} == dict.fromkeys(
        ["free-a", "free-b", "free-c", "paid-p"], "done"
    ), streams.ends
    assert background.get("status") == 200, background

    grants = [g for g in _in_loop(live, lambda: list(admission.grants)) if g.arrival > start and g.tag != "holder"]
    background_grants = [g for g in grants if g.priority == settings.CHAT_BACKGROUND_PRIORITY]
    turns = [g for g in grants if g.priority != settings.CHAT_BACKGROUND_PRIORITY]
    paid = [g for g in turns if g.reserved_ok]
    free = [g for g in turns if not g.reserved_ok]
    assert len(paid) == 1 and len(free) == 3 and len(background_grants) >= 1, grants
    (paid,) = paid
    assert paid.priority == 0 and {g.priority for g in free} == {1}, grants
    queued_ahead = [g for g in free if g.arrival < paid.arrival < g.granted]
    assert len(queued_ahead) == 3, grants
    assert all(paid.granted < g.granted for g in queued_ahead), grants
    job = min(background_grants, key=lambda g: g.arrival)
    assert all(g.granted < job.granted for g in turns), grants
