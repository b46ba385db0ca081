"""Tier and priority across the gateway -> engine hop (issue 17; DESIGN.md, "Production
topology"): the engine process honours a forwarded turn's ``admission`` field (service
credential only), keeps its reserved slots for paid turns, publishes its queue under vLLM's
names, and a gateway sheds on the engine's queue, not a queue of its own."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async

from accounts.services import service_api_key
from core import metrics
from inference import serving
from inference.admission import admission_for
from inference.engine import GenerationOptions
from inference.remote import EngineLoad, OpenAIRemoteEngine, load_parse
from tests.api_support import BearerClient, api_client, assert_error, post_json
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = [1, 2, 3, 4]


def forwarded(tier: str, priority: int, **extra) -> dict:
    return {
        "model": "SmolLM2-135M-Instruct", "prompt": PROMPT, "max_tokens": 8, "stream": False,
        "admission": {"tier": tier, "priority": priority}, **extra,
    }  # fmt: skip


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


# --- the metrics a gateway reads ---------------------------------------------------------------


def test_load_parse_reads_vllm_queue_metrics_for_the_model():
    text = (
        "# HELP vllm:num_requests_waiting Requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="other"} 9.0\n'
        'vllm:num_requests_waiting{model_name="chat"} 3.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="chat"} 7.0\n'
        "# TYPE chat_admission_waiting gauge\n"
        'chat_admission_waiting{engine="x"} 100.0\n'
    )
    load = load_parse(text, "chat")
    assert (load.waiting, load.running) == (3, 7)


def test_load_parse_sums_every_sample_when_none_names_the_model():
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a",engine="0"} 2.0\n'
        'vllm:num_requests_waiting{model_name="a",engine="1"} 5.0\n'
    )
    assert load_parse(text, "served-name").waiting == 7


def test_the_engine_process_publishes_its_queue_under_vllm_names(engine_double):
    """The local admission queue's depths appear as vllm:num_requests_waiting / _running, so
    a gateway reads this project's engine process and vllm serve alike."""
    admission = admission_for(engine_double)
    admission._waiting, admission._running = 5, 2
    admission._publish()
    try:
        name = admission.model_name
        assert metrics.value("vllm:num_requests_waiting", model_name=name) == 5
        assert metrics.value("vllm:num_requests_running", model_name=name) == 2
    finally:
        admission._waiting = admission._running = 0
        admission._publish()


async def test_a_gateway_sheds_on_the_remote_engines_queue(monkeypatch, settings):
    """pool_waiting for a remote engine is the node's own waiting count (read from /metrics,
    cached for CHAT_ENGINE_LOAD_TTL_S), not a queue in this process."""
    settings.CHAT_ENGINE_LOAD_TTL_S = 60
    remote = OpenAIRemoteEngine(base_url="http://engine.invalid", api_key="k", model="m", model_path="")
    reads = []

    async def read():
        reads.append(1)
        remote._load = EngineLoad(waiting=11, running=4, read_at=time.monotonic())
        return remote._load

    monkeypatch.setattr(remote, "_read_load", read)
    monkeypatch.setattr(serving, "pool_engine", lambda pool: remote)
    assert await serving.pool_waiting(object()) == 11
    assert await serving.pool_waiting(object()) == 11
    assert reads == [1]  # the second decision used the cached reading


async def test_a_request_to_a_remote_engine_waits_in_no_local_queue(monkeypatch):
    """No capped queue in front of a remote engine: with every local slot notionally taken, a
    request still goes out at once, carrying its tier."""
    sent = []

    class Remote:
        ready = True
        queues_remotely = True

        async def generate(self, ids, options, request_id):
            sent.append((request_id, options.tier, options.priority))
            from inference.engine import Delta  # noqa: PLC0415

            yield Delta("hi", len(ids), 1, "stop")

    remote = Remote()
    monkeypatch.setattr(serving, "pool_engine", lambda pool: remote)
    from inference.pools import pool_set  # noqa: PLC0415
    from inference.router import Route  # noqa: PLC0415

    route = Route(pool=pool_set().resolve("frontier"), reason="tier", priority=0)
    async for _ in serving.pool_generate(route, PROMPT, GenerationOptions(max_tokens=4), "r1", tier="paid"):
        pass
    assert sent == [("r1", "paid", 0)]


# --- the engine process's side -------------------------------------------------------------------


async def test_only_the_service_credential_may_set_admission(make_user, engine_double):
    client, _ = await api_client(make_user, tier="free")
    response = await post_json(client, "/v1/completions", forwarded("paid", 0))
    assert_error(response, 403, "permission_denied")
    assert "admission" in response.json()["error"]["message"]
    assert engine_double.requests == []


async def test_a_forwarded_turn_runs_at_its_tier_and_priority_and_writes_no_ledger_row(engine_double):
    job = BearerClient(await sync_to_async(service_api_key)())
    before = await UsageRecord.objects.acount()
    response = await post_json(job, "/v1/completions", forwarded("paid", 0))
    assert response.status_code == 200, response.content
    options = engine_double.requests[-1][1]
    assert (options.priority, options.tier) == (0, "paid")
    assert await UsageRecord.objects.acount() == before  # the gateway settles the turn


async def test_a_service_request_without_admission_is_a_background_job(engine_double, settings):
    job = BearerClient(await sync_to_async(service_api_key)())
    body = forwarded("paid", 0)
    del body["admission"]
    response = await post_json(job, "/v1/completions", body)
    assert response.status_code == 200
    options = engine_double.requests[-1][1]
    assert options.priority == settings.CHAT_BACKGROUND_PRIORITY
    assert options.tier == "background"


@pytest.mark.parametrize("bad", [{"tier": "gold", "priority": 0}, {"tier": "paid", "priority": -1}, {"tier": "paid"}])
async def test_a_malformed_admission_field_is_a_400(engine_double, bad):
    job = BearerClient(await sync_to_async(service_api_key)())
    body = {**forwarded("paid", 0), "admission": bad}
    assert_error(await post_json(job, "/v1/completions", body), 400, "invalid_request")


def test_the_pipelines_settled_statuses_are_the_turns_statuses():
    """gateway/run.py settles with its own Status (the gateway imports neither conversations nor
    usage); a turn stores Turn.Status and the ledger UsageRecord.Status: all name the same
    values."""
    from conversations.models import Turn  # noqa: PLC0415
    from gateway import run  # noqa: PLC0415

    assert set(run.Status.values) == set(Turn.Status.values) == set(UsageRecord.Status.values)
    answer = run.Answer(run.Tally(prompt_tokens=1))
    for reason, status in [("stop", "complete"), ("length", "complete"), ("cancelled", "cancelled"),
                           ("moderation", "blocked"), ("error", "failed")]:
        answer.finish_reason = reason
        assert answer.status == status
