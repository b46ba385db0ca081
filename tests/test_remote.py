"""The remote engine client (inference/remote.py) against a scripted OpenAI-compatible server
(httpx's MockTransport): how a streamed ``/v1/completions`` answer becomes Deltas. The real
server is in tests/integration/test_remote_pool.py (real_engine)."""

from __future__ import annotations

import json

import httpx
import pytest

from inference.engine import Delta, EngineUnavailable, GenerationOptions
from inference.remote import NodeFailure, OpenAIRemoteEngine


def sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class Server:
    """What the scripted server answers (``status``, ``reply``: an SSE body) and the bodies it
    got."""

    def __init__(self):
        self.reply = b""
        self.status = 200
        self.bodies: list[dict] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(self.status, content=self.reply, headers=headers)


@pytest.fixture
def server(monkeypatch) -> Server:
    """The client's HTTP goes to a :class:`Server` for one test."""
    scripted, real = Server(), httpx.AsyncClient
    transport = httpx.MockTransport(scripted.handle)
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=transport, **kw))
    return scripted


def engine() -> OpenAIRemoteEngine:
    return OpenAIRemoteEngine(base_url="http://engine", api_key="k", model="mini", model_path="")


async def deltas(prompt: list[int]) -> list[Delta]:
    return [d async for d in engine().generate(prompt, GenerationOptions(max_tokens=8), "req-1")]


async def test_the_usage_chunk_ends_the_answer_with_the_servers_counts_and_cached_tokens(server):
    server.reply = sse(
        {"choices": [{"text": "Hel", "finish_reason": None}]},
        {"choices": [{"text": "lo", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 4}}},
    )  # fmt: skip

    got = await deltas([1, 2, 3, 4, 5])

    assert got == [
        Delta("Hel", 5, 1, None, 0),
        Delta("lo", 5, 2, None, 0),
        Delta("", 5, 2, "length", 4),
    ]
    assert server.bodies[0]["prompt"] == [1, 2, 3, 4, 5] and server.bodies[0]["stream"] is True


async def test_a_server_without_a_usage_chunk_ends_with_the_clients_own_count(server):
    server.reply = sse({"choices": [{"text": "Hi", "finish_reason": "stop"}]})

    got = await deltas([1, 2, 3])

    assert got == [Delta("Hi", 3, 1, None, 0), Delta("", 3, 1, "stop", 0)]


async def test_a_stream_that_ends_without_a_finish_is_a_node_failure(server):
    """The node died mid-answer but the connection closed cleanly (no finish reason, no
    [DONE]): a NodeFailure, so a pool of several nodes continues the answer elsewhere
    (inference/nodes.py), never an answer silently cut short."""
    server.reply = b"".join(
        f"data: {json.dumps(c)}\n\n".encode() for c in ({"choices": [{"text": "Hel", "finish_reason": None}]},)
    )

    with pytest.raises(NodeFailure, match="ended without a finish"):
        await deltas([1, 2, 3])


@pytest.mark.parametrize(("status", "failure"), [(503, NodeFailure), (400, EngineUnavailable)])
async def test_a_node_that_cannot_serve_now_is_a_node_failure_and_a_refusal_is_not(server, status, failure):
    server.status, server.reply = status, b'{"error": {"message": "no"}}'

    with pytest.raises(EngineUnavailable) as caught:
        await deltas([1, 2, 3])

    assert type(caught.value) is failure
