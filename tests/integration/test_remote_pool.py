"""A ``remote`` model pool served by a real ``vllm serve`` (vLLM's OpenAI-compatible server) on
loopback: streaming, cancel and usage behave as with the local backend (issue 5, "Remote
backend").

The server is the session's ``vllm serve`` (tests/processes.py ``vllm_server``, started once,
about 50 s on the CPU, with priority scheduling and prompt-token details; the node-failover test
uses it as its second node afterwards). The ``vllm`` console script does not work in this
environment, so it runs as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.conf import settings

from accounts.services import api_key_create
from conversations.models import Turn
from inference.engine import GenerationOptions
from inference.pools import Pool, pool_engine, pool_set, pool_set_reset, pools_load
from inference.remote import OpenAIRemoteEngine
from tests.processes import SERVED_NAME, RemoteServer

# Transactional like the node-failover test that kills the shared server after this module:
# pytest-django runs database tests before the others, and in file order, so this keeps all of
# this module's tests before it (and one vllm serve start for both).
pytestmark = [pytest.mark.real_engine, pytest.mark.django_db(transaction=True)]

LONG_PROMPT = "Write a very long story about a lighthouse keeper and a storm, in many chapters."


@pytest.fixture
def remote_server(vllm_serve) -> RemoteServer:
    """The session's ``vllm serve`` (tests/conftest.py ``vllm_serve``: started once, shared
    with tests/integration/test_zy_node_failover.py, which kills it last)."""
    return vllm_serve


def remote_pool_entries(url: str) -> list[dict]:
    """The default pools plus ``remote-smol``, served by the vLLM server at ``url``."""
    return [
        *settings.CHAT_POOLS,
        {
            "name": "remote-smol",
            "label": "SmolLM2 on a remote vLLM server",
            "version": "1",
            "backend": "remote",
            "url": url,
            "model": SERVED_NAME,
            "priority": 0,
            "max_context": 2048,
            "max_tokens": 512,
            "price_input_per_m": "1.00",
            "price_cached_input_per_m": "0.10",
            "price_output_per_m": "2.00",
            "tiers": ["paid", "enterprise"],
        },
    ]


@pytest.fixture
def remote_pool(remote_server) -> Iterator[Pool]:
    pool_set_reset()
    yield pools_load(remote_pool_entries(remote_server.url)).get("remote-smol")
    pool_set_reset()


async def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return True
        await asyncio.sleep(0.05)
    return await asyncio.to_thread(predicate)


# --- engine level ---


async def test_remote_pool_streams_with_exact_usage(remote_pool):
    """The pool's engine is a remote client; text arrives in many deltas, and the final delta
    carries the server's usage: the prompt we sent, and max_tokens completion tokens."""
    engine = pool_engine(remote_pool)
    assert isinstance(engine, OpenAIRemoteEngine) and engine.model == SERVED_NAME
    await engine.ensure_started()
    prompt = engine.encode_chat([{"role": "user", "content": LONG_PROMPT}])

    deltas = [
        d async for d in engine.generate(
            prompt, GenerationOptions(max_tokens=40, temperature=0.0, priority=3), "remote-usage"
        )
    ]  # fmt: skip

    texts = [d.text for d in deltas if d.text]
    assert len(texts) >= 10
    final = deltas[-1]
    assert final.finish_reason == "length"
    assert final.prompt_tokens == len(prompt)
    assert final.completion_tokens == 40
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert engine.num_unfinished_requests() == 0


async def test_remote_pool_reports_cached_prompt_tokens(remote_pool):
    """A repeated prompt is served from the server's prefix cache; the final delta says how many
    prompt tokens were cached (usage.prompt_tokens_details.cached_tokens)."""
    engine = pool_engine(remote_pool)
    # Several KV blocks long (the CPU backend's blocks hold 128 tokens; only full blocks are cached).
    context = "The keeper climbs the tower, trims the wick and watches the sea. " * 40
    prompt = engine.encode_chat([{"role": "user", "content": context + LONG_PROMPT}])
    options = GenerationOptions(max_tokens=4, temperature=0.0)

    first = [d async for d in engine.generate(prompt, options, "remote-cache-1")][-1]
    second = [d async for d in engine.generate(prompt, options, "remote-cache-2")][-1]

    assert first.prompt_tokens == second.prompt_tokens == len(prompt) > 512
    assert second.cached_tokens >= len(prompt) // 2  # the full blocks of the prompt reused
    assert second.cached_tokens <= len(prompt)
    assert remote_pool.cost(
        prompt_tokens=second.prompt_tokens, cached_tokens=second.cached_tokens,
        completion_tokens=second.completion_tokens,
    ) < remote_pool.cost(
        prompt_tokens=second.prompt_tokens, cached_tokens=0, completion_tokens=second.completion_tokens
    )  # fmt: skip


async def test_cancelling_the_reader_stops_the_remote_request(remote_pool, remote_server):
    """PF-C1 for a remote pool: cancel the task reading a long generation; the vLLM server's
    running count returns to 0 within 1 s and it generates no further tokens."""
    engine = pool_engine(remote_pool)
    prompt = engine.encode_chat([{"role": "user", "content": LONG_PROMPT}])
    first_text = asyncio.Event()
    received: list = []

    async def read():
        async for delta in engine.generate(prompt, GenerationOptions(max_tokens=1500), "remote-cancel"):
            received.append(delta)
            first_text.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(first_text.wait(), 60)
    await asyncio.sleep(0.5)
    assert remote_server.metric("vllm:num_requests_running") == 1

    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader

    assert await wait_until(lambda: remote_server.metric("vllm:num_requests_running") == 0, 1.0)
    generated = remote_server.metric("vllm:generation_tokens_total")
    await asyncio.sleep(1.0)
    assert remote_server.metric("vllm:generation_tokens_total") == generated
    assert engine.num_unfinished_requests() == 0
    assert 0 < len(received) < 1500


async def test_engine_abort_from_another_task_stops_the_remote_request(remote_pool, remote_server):
    """The Stop button's path: ``engine.abort(request_id)`` from another task ends the
    generation and the remote request, within 1 s."""
    engine = pool_engine(remote_pool)
    prompt = engine.encode_chat([{"role": "user", "content": LONG_PROMPT}])
    started = asyncio.Event()

    async def read():
        async for _ in engine.generate(prompt, GenerationOptions(max_tokens=1500), "remote-abort"):
            started.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(started.wait(), 60)
    assert engine.num_unfinished_requests() == 1

    await engine.abort("remote-abort")
    done, _ = await asyncio.wait({reader}, timeout=1.0)

    assert reader in done
    assert await wait_until(lambda: remote_server.metric("vllm:num_requests_running") == 0, 1.0)
    assert engine.num_unfinished_requests() == 0


# --- through the API: a conversation turn answered by the remote pool ---


@pytest.fixture
def remote_api(live, remote_server, make_user, settings):
    """The shared server with ``remote-smol`` configured (settings.CHAT_POOLS; the pools are
    loaded again), and a paid user's API client. Yields (live server, httpx client)."""
    settings.CHAT_POOLS = remote_pool_entries(remote_server.url)
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 0
    pool_set_reset()
    issued = api_key_create(user=make_user("remote-api", tier="paid"), name="remote pool")
    client = live.client(headers={"Authorization": f"Bearer {issued.raw}"})
    try:
        yield live, client
    finally:
        client.close()
        live.drain()
        pool_set_reset()


def remote_conversation(client) -> str:
    response = client.post("/v1/conversations", json={"model": "remote-smol"})
    assert response.status_code == 201, response.text
    return response.json()["conversation_id"]


def sse_events(response) -> Iterator[tuple[str, dict]]:
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, json.loads(line[6:])


def test_api_turn_on_a_remote_pool_streams_and_stores_usage_and_cost(remote_api, remote_server):
    """A conversation on ``remote-smol`` is answered by the vLLM server (not the local engine):
    tokens stream, and the stored answer has the pool, version, the server's usage and the
    cost at the pool's prices."""
    live, client = remote_api
    conversation_id = remote_conversation(client)
    served_before = remote_server.metric("vllm:request_success_total")

    with client.stream(
        "POST", f"/v1/conversations/{conversation_id}/turns",
        json={"role": "user", "content": LONG_PROMPT, "max_tokens": 30},
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        assert response.headers["X-Pool"] == "remote-smol@1"
        events = []
        for name, data in sse_events(response):
            events.append((name, data))
            if name == "token":
                assert live.unfinished() == 0  # the local engine is not involved
            if name in ("done", "error"):
                break

    tokens = [data["text"] for name, data in events if name == "token"]
    done = events[-1]
    assert done[0] == "done", events[-3:]
    assert len(tokens) >= 5
    usage = done[1]["usage"]
    assert usage["completion_tokens"] == 30 and usage["prompt_tokens"] > 10
    assert remote_server.metric("vllm:request_success_total") == served_before + 1
    live.drain()
    answer = Turn.objects.get(turn_id=done[1]["turn_id"])
    pool = pool_set().get("remote-smol")
    assert (answer.pool, answer.model_version) == ("remote-smol", "1")
    assert answer.status == Turn.Status.COMPLETE
    assert answer.content == "".join(tokens)
    assert (answer.prompt_tokens, answer.token_count) == (usage["prompt_tokens"], 30)
    exact = pool.cost(
        prompt_tokens=answer.prompt_tokens, cached_tokens=answer.cached_tokens or 0,
        completion_tokens=30,
    )  # fmt: skip
    assert abs(answer.cost_usd - exact) <= Decimal("0.00000001")  # stored to 8 places
    assert answer.cost_usd > 0


def test_api_cancel_stops_the_remote_generation_and_charges_the_partial_answer(remote_api, remote_server):
    """PF-C1 / PF-R5 on a remote pool: cancel a long answer through the API; the vLLM server
    stops generating within 1 s, and the turn is stored cancelled with its partial text, the
    tokens actually generated and their cost."""
    live, client = remote_api
    conversation_id = remote_conversation(client)
    with client.stream(
        "POST", f"/v1/conversations/{conversation_id}/turns",
        json={"role": "user", "content": LONG_PROMPT, "max_tokens": 1500},
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        answer_id = response.headers["X-Turn-Id"]
        events = sse_events(response)
        seen = 0
        for name, _ in events:
            seen += name == "token"
            if seen >= 3:
                break
        assert remote_server.metric("vllm:num_requests_running") == 1

        cancelled = client.post(f"/v1/conversations/{conversation_id}/cancel")
        assert cancelled.status_code == 204
        stopped_at = time.monotonic()
        while remote_server.metric("vllm:num_requests_running") and time.monotonic() - stopped_at < 1.0:
            time.sleep(0.05)
        assert remote_server.metric("vllm:num_requests_running") == 0
        final = next((data for name, data in events if name in ("done", "error")), None)

    generated = remote_server.metric("vllm:generation_tokens_total")
    time.sleep(1.0)
    assert remote_server.metric("vllm:generation_tokens_total") == generated
    assert final is not None and final["status"] == Turn.Status.CANCELLED
    live.drain()
    answer = Turn.objects.get(turn_id=answer_id)
    assert answer.status == Turn.Status.CANCELLED
    assert answer.pool == "remote-smol"
    assert answer.content
    assert 3 <= answer.token_count < 1500
    assert answer.cost_usd is not None and answer.cost_usd > 0


def test_api_refuses_the_remote_pool_to_a_tier_it_is_not_open_to(remote_api, make_user):
    """The free tier may not use ``remote-smol``: 403 naming the tier's models, before any
    engine work."""
    live, _ = remote_api
    issued = api_key_create(user=make_user("remote-free", tier="free"), name="free")
    with live.client(headers={"Authorization": f"Bearer {issued.raw}"}) as client:
        response = client.post("/v1/conversations", json={"model": "remote-smol"})
    assert response.status_code == 403, response.text
    assert "mini" in response.json()["error"]["message"]
