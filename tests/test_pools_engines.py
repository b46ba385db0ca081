"""The engine each model pool gets (inference/pools.py ``pool_engine``): the process engine, one
engine per other local folder, one remote client per URL and model; and the remote client's
wire format (inference/remote.py), against a mock transport."""

from __future__ import annotations

import json

import httpx
import pytest
from django.conf import settings
from django.test import override_settings

import inference.engine as engine_module
import inference.remote as remote_module
from inference.engine import GenerationOptions, VllmEngine
from inference.pools import pool_engine, pools_load
from inference.remote import OpenAIRemoteEngine
from tests.fakes import ScriptedEngine
from tests.pools_support import (
    _fresh_pools,  # noqa: F401 - autouse
    entry,
    frontier,
    remote,
)

# --- engines ---


def test_local_pools_on_the_main_model_use_the_process_engine(engine_double):
    pools = pools_load(list(settings.CHAT_POOLS))
    assert {id(pool_engine(p)) for p in pools} == {id(engine_double)}


@override_settings(CHAT_ENGINE_CLASS="tests.fakes.ScriptedEngine")
def test_a_local_pool_on_another_folder_gets_its_own_engine(engine_double, tmp_path):
    (tmp_path / "a").mkdir()
    pools = pools_load(
        [entry(), frontier(model_path=str(tmp_path / "a")), frontier(version="2", model_path=str(tmp_path / "a"))]
    )
    own = pool_engine(pools.get("frontier"))
    assert isinstance(own, ScriptedEngine) and own is not engine_double
    assert pool_engine(pools.get("frontier", "2")) is own  # one engine per folder
    assert pool_engine(pools.get("mini")) is engine_double


@override_settings(CHAT_ENGINE_CLASS="inference.engine.VllmEngine")
def test_a_vllm_engine_for_another_folder_loads_that_folder(tmp_path):
    pools = pools_load([entry(), frontier(model_path=str(tmp_path))])
    engine = pool_engine(pools.get("frontier"))
    assert isinstance(engine, VllmEngine) and engine.model_path == str(tmp_path)
    assert engine is not engine_module._engine and not engine.ready  # built, not started
    assert engine.max_model_len == settings.CHAT_MAX_MODEL_LEN


def test_remote_pools_get_one_client_per_url_and_model():
    pools = pools_load(
        [entry(), frontier(), remote(), remote(version="2"), remote(name="other", model="small-model")]
    )
    first = pool_engine(pools.get("remote-big"))
    assert isinstance(first, OpenAIRemoteEngine)
    assert (first.base_url, first.model, first.model_path) == (
        "http://127.0.0.1:9", "big-model", str(settings.CHAT_MODEL_PATH)
    )
    assert pool_engine(pools.get("remote-big", "2")) is first
    other = pool_engine(pools.get("other"))
    assert other is not first and other.model == "small-model"


def test_remote_client_from_settings_still_works():
    with override_settings(CHAT_ENGINE_URL="http://127.0.0.1:8000/", CHAT_ENGINE_API_KEY="k"):
        client = OpenAIRemoteEngine.from_settings()
    assert (client.base_url, client.api_key, client.model) == (
        "http://127.0.0.1:8000", "k", settings.CHAT_MODEL_NAME
    )


# --- the remote client's wire format (inference/remote.py), against a mock transport ---


def sse(*chunks: dict | str) -> bytes:
    return b"".join(
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks
    )


@pytest.fixture
def remote_wire(monkeypatch):
    """Route the remote client's HTTP through ``httpx.MockTransport``; yields
    (sent request bodies, a setter for the next response's SSE bytes)."""
    sent: list[dict] = []
    reply = {"body": b""}

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, content=reply["body"], headers={"content-type": "text/event-stream"})

    real_client = httpx.AsyncClient

    def client(**kwargs):
        return real_client(transport=httpx.MockTransport(handler), **kwargs)

    monkeypatch.setattr(remote_module.httpx, "AsyncClient", client)
    yield sent, lambda body: reply.update(body=body)


def remote_client() -> OpenAIRemoteEngine:
    pools = pools_load([entry(), frontier(), remote(api_key="k")])
    return OpenAIRemoteEngine.for_pool(pools.get("remote-big"))


async def test_remote_request_carries_model_priority_and_asks_for_usage(remote_wire):
    sent, reply = remote_wire
    reply(sse({"choices": [{"text": "Hi", "finish_reason": "stop"}]}, "[DONE]"))
    options = GenerationOptions(max_tokens=7, temperature=0.0, priority=3)

    [d async for d in remote_client().generate([5, 6, 7], options, "r1")]

    body = sent[0]
    assert body["model"] == "big-model" and body["prompt"] == [5, 6, 7]
    assert body["priority"] == 3 and body["max_tokens"] == 7
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_remote_request_omits_priority_zero(remote_wire):
    # A server without --scheduling-policy priority refuses any priority field but 0.
    sent, reply = remote_wire
    reply(sse({"choices": [{"text": "Hi", "finish_reason": "stop"}]}, "[DONE]"))
    [d async for d in remote_client().generate([1], GenerationOptions(), "r2")]
    assert "priority" not in sent[0]


async def test_remote_final_delta_carries_the_servers_usage_and_cached_tokens(remote_wire):
    _, reply = remote_wire
    reply(sse(
        {"choices": [{"text": "Hel", "finish_reason": None}]},
        {"choices": [{"text": "lo there", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35,
                                  "prompt_tokens_details": {"cached_tokens": 16}}},
        "[DONE]",
    ))  # fmt: skip
    deltas = [d async for d in remote_client().generate([1] * 30, GenerationOptions(), "r3")]
    assert "".join(d.text for d in deltas) == "Hello there"
    final = deltas[-1]
    assert (final.prompt_tokens, final.completion_tokens, final.finish_reason) == (30, 5, "length")
    assert final.cached_tokens == 16


async def test_remote_stream_without_usage_still_ends_with_a_finish_reason(remote_wire):
    _, reply = remote_wire
    reply(sse({"choices": [{"text": "a", "finish_reason": None}]},
              {"choices": [{"text": "b", "finish_reason": "stop"}]}, "[DONE]"))  # fmt: skip
    deltas = [d async for d in remote_client().generate([1, 2], GenerationOptions(), "r4")]
    assert deltas[-1].finish_reason == "stop"
    assert (deltas[-1].prompt_tokens, deltas[-1].completion_tokens, deltas[-1].cached_tokens) == (2, 2, 0)


async def test_remote_pool_without_api_key_sends_no_authorization(remote_wire):
    sent, reply = remote_wire
    reply(sse({"choices": [{"text": "a", "finish_reason": "stop"}]}, "[DONE]"))
    client = OpenAIRemoteEngine.for_pool(pools_load([entry(), frontier(), remote()]).get("remote-big"))
    assert client._headers() == {}  # "Bearer " alone is an illegal header value
    [d async for d in client.generate([1], GenerationOptions(), "r5")]
    assert sent
