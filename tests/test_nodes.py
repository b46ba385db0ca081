"""Pools of several nodes (inference/nodes.py): rendezvous hashing and the spill rule (pure),
the pool file's ``urls``, and a node set against scripted node servers (httpx's MockTransport):
readiness, choice by queue depth, and an answer that moves to another node when its node dies.
The real two-engine test is tests/integration/test_zy_node_failover.py (real_engine)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from django.test import AsyncClient
from django.urls import path

from chatsite import health
from core import metrics
from gateway import run
from gateway.gate import Caller
from inference import serving
from inference.engine import EngineUnavailable, GenerationOptions
from inference.nodes import NodeSet, hrw_order, node_choose
from inference.pools import pool_engine, pool_set_reset, pools_load
from inference.remote import OpenAIRemoteEngine
from inference.router import Route
from tests.pools_support import entry, frontier, load_error, remote

urlpatterns = [
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
]

URLS = ["http://node-a:8000", "http://node-b:8000", "http://node-c:8000"]
MODEL = "big-model"
BREAK = object()  # in a node's script: the connection breaks here (the node died)


# --- the pure part -----------------------------------------------------------------------------


def test_hrw_order_is_a_stable_function_of_key_and_nodes():
    order = hrw_order("conv-1", URLS)
    assert sorted(order) == sorted(URLS)
    assert hrw_order("conv-1", list(reversed(URLS))) == order  # not the listed order
    keys = [f"conv-{i}" for i in range(300)]
    homes = [hrw_order(k, URLS)[0] for k in keys]
    # Spread over every node, none with more than half (300 keys, 3 nodes: ~100 each).
    assert {url: homes.count(url) for url in URLS} == {
        url: pytest.approx(100, abs=50) for url in URLS
    }


def test_removing_a_node_moves_only_the_conversations_it_held():
    keys = [f"conv-{i}" for i in range(300)]
    before = {k: hrw_order(k, URLS)[0] for k in keys}
    after = {k: hrw_order(k, URLS[:2])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == URLS[2] for k in moved)
    assert all(after[k] == before[k] for k in keys if before[k] != URLS[2])


def test_the_home_node_serves_while_its_queue_is_at_most_k_longer():
    home, other = hrw_order("conv-7", URLS[:2])
    assert node_choose("conv-7", {home: 2, other: 0}, spill=2) == home
    assert node_choose("conv-7", {home: 0, other: 9}, spill=2) == home


def test_a_home_node_more_than_k_longer_spills_to_the_least_loaded():
    home, second, third = hrw_order("conv-7", URLS)
    assert node_choose("conv-7", {home: 3, second: 1, third: 0}, spill=2) == third
    # Ties among the least loaded go to the better score.
    assert node_choose("conv-7", {home: 5, second: 0, third: 0}, spill=2) == second


def test_choosing_among_no_nodes_raises():
    with pytest.raises(ValueError):
        node_choose("conv-1", {}, spill=2)


# --- the pool file -----------------------------------------------------------------------------


def multi(**fields) -> dict:
    return remote(url="", urls=URLS[:2], model=MODEL, **fields)


def test_a_remote_pool_may_list_several_nodes():
    pool = pools_load([entry(), frontier(), multi()]).get("remote-big")
    assert pool.urls == tuple(URLS[:2]) and pool.url == URLS[0]


def test_url_still_means_one_node():
    pool = pools_load([entry(), frontier(), remote()]).get("remote-big")
    assert pool.urls == ("http://127.0.0.1:9",) and pool.url == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"url": "http://x:1", "urls": URLS[:2]}, "field 'urls': give url (one node) or urls"),
        ({"urls": []}, "field 'urls': lists no node"),
        (
            {"urls": [URLS[0], "ftp://node-b"]},
            "field 'urls[1]': 'ftp://node-b' is not an http(s) URL",
        ),
        ({"urls": [URLS[0], URLS[0] + "/"]}, "field 'urls[1]'"),
    ],
)
def test_bad_node_lists_are_refused_naming_pool_and_field(fields, named):
    message = load_error([entry(), frontier(), remote(**{"url": "", **fields})])
    assert "'remote-big'" in message and named in message


def test_a_local_pool_with_urls_is_refused():
    message = load_error([entry(urls=URLS[:2]), frontier()])
    assert "'mini'" in message and "field 'urls'" in message


def test_a_pool_of_several_nodes_gets_a_node_set_and_one_node_a_plain_client():
    pool_set_reset()
    pools = pools_load([entry(), frontier(), multi(), remote(name="one", url="http://node-c:1")])
    node_set = pool_engine(pools.get("remote-big"))
    assert isinstance(node_set, NodeSet) and [n.url for n in node_set.nodes] == URLS[:2]
    assert pool_engine(pools.get("remote-big")) is node_set
    assert isinstance(pool_engine(pools.get("one")), OpenAIRemoteEngine)
    pool_set_reset()


# --- scripted node servers ---------------------------------------------------------------------


class FakeNode:
    """One scripted node: whether it is ``alive`` (else every connection is refused), its
    queue depth ``waiting`` (its /metrics), the ``script`` of its next answers (text deltas,
    then BREAK to die mid-stream or the end for a normal finish) and the bodies it got."""

    def __init__(self, url: str):
        self.url = url
        self.alive = True
        self.waiting = 0
        self.status = 200
        self.scripts: list[list] = []
        self.bodies: list[dict] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if not self.alive:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL, "owned_by": "vllm"}]})
        if request.url.path == "/metrics":
            return httpx.Response(
                200, text=f'vllm:num_requests_waiting{{model_name="{MODEL}"}} {self.waiting}\n'
            )
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "refused"}})
        script = self.scripts.pop(0) if self.scripts else ["ok"]
        return httpx.Response(
            200, content=self._stream(body, script), headers={"content-type": "text/event-stream"}
        )

    async def _stream(self, body: dict, script: list) -> AsyncIterator[bytes]:
        texts = 0
        for step in script:
            if step is BREAK:
                self.alive = False
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            texts += 1
            finish = "length" if texts >= body["max_tokens"] else None
            yield f"data: {json.dumps({'choices': [{'text': step, 'finish_reason': finish}]})}\n\n".encode()
            if finish:
                break
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": texts}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()


@pytest.fixture
def nodes(monkeypatch, settings) -> Iterator[dict[str, FakeNode]]:
    """Node URL -> FakeNode for the three URLS; every httpx client of the product reaches them.
    Queue depths are read afresh on each choice."""
    fakes = {url: FakeNode(url) for url in URLS}
    by_host = {urlsplit(url).netloc: fake for url, fake in fakes.items()}
    real_client = httpx.AsyncClient
    transport = httpx.MockTransport(
        lambda request: by_host[request.url.netloc.decode()].handle(request)
    )
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real_client(transport=transport, **kw))
    settings.CHAT_ENGINE_LOAD_TTL_S = 0
    settings.CHAT_NODE_SPILL_WAITING = 2
    yield fakes


@pytest.fixture
async def node_set(nodes) -> AsyncIterator[NodeSet]:
    """The node set of a pool on node-a and node-b (checked once); its background check is
    stopped afterwards."""
    pool = pools_load([entry(), frontier(), multi()]).get("remote-big")
    made = NodeSet.for_pool(pool)
    await made.ensure_started()
    yield made
    made.stop_watching()


def home_and_other(key: str) -> tuple[str, str]:
    home, other = hrw_order(key, URLS[:2])
    return home, other


async def collect(node_set: NodeSet, prompt: list[int], key: str, max_tokens: int = 10):
    options = GenerationOptions(max_tokens=max_tokens, temperature=0.0, affinity=key)
    return [d async for d in node_set.generate(prompt, options, "turn-1")]


async def test_an_answer_goes_to_its_conversations_home_node(nodes, node_set):
    home, other = home_and_other("conv-1")
    for _ in range(3):
        await collect(node_set, [1, 2, 3], "conv-1")
    assert len(nodes[home].bodies) == 3 and nodes[other].bodies == []


async def test_a_home_node_with_k_more_waiting_spills_to_the_other(nodes, node_set):
    home, other = home_and_other("conv-1")
    nodes[home].waiting = 3
    await collect(node_set, [1, 2, 3], "conv-1")
    nodes[home].waiting = 2
    await collect(node_set, [1, 2, 3], "conv-1")
    assert len(nodes[other].bodies) == 1 and len(nodes[home].bodies) == 1


async def test_a_node_dying_mid_answer_continues_on_another_with_the_text_re_prefilled(
    nodes, node_set
):
    """The home node streams two tokens and dies; the other node gets the prompt plus the tokens
    of the text already streamed and the rest of the budget; the caller's text is one seamless
    stream and the counts add up (completion = every streamed token)."""
    home, other = home_and_other("conv-1")
    nodes[home].scripts = [["The", " sea", BREAK]]
    nodes[other].scripts = [[" is", " calm", "."]]
    retries = metrics.value("chat_node_retries_total", pool="remote-big", phase="mid_answer")
    prompt = node_set.encode_chat([{"role": "user", "content": "Describe the sea."}])

    deltas = await collect(node_set, prompt, "conv-1", max_tokens=10)

    assert "".join(d.text for d in deltas) == "The sea is calm."
    sent = nodes[other].bodies[0]
    assert sent["prompt"] == prompt + node_set.encode_text("The sea")
    assert sent["max_tokens"] == 8
    final = deltas[-1]
    assert (final.prompt_tokens, final.completion_tokens, final.finish_reason) == (
        len(prompt),
        5,
        "stop",
    )
    assert [d.completion_tokens for d in deltas if d.text] == [1, 2, 3, 4, 5]
    assert (
        metrics.value("chat_node_retries_total", pool="remote-big", phase="mid_answer")
        == retries + 1
    )
    assert node_set.states()[home].startswith("down:") and node_set.states()[other] == "up"
    assert metrics.value("chat_node_up", pool="remote-big", node=home) == 0


async def test_a_node_refusing_connections_before_the_first_token_sends_the_request_elsewhere_whole(
    nodes, node_set
):
    home, other = home_and_other("conv-1")
    nodes[home].alive = False  # died since the last check; still marked up
    retries = metrics.value(
        "chat_node_retries_total", pool="remote-big", phase="before_first_token"
    )

    deltas = await collect(node_set, [1, 2, 3], "conv-1")

    assert "".join(d.text for d in deltas) == "ok"
    assert (
        nodes[other].bodies[0]["prompt"] == [1, 2, 3] and nodes[other].bodies[0]["max_tokens"] == 10
    )
    assert (
        metrics.value("chat_node_retries_total", pool="remote-big", phase="before_first_token")
        == retries + 1
    )


async def test_with_no_other_node_up_the_answer_fails_as_a_one_node_pool_does(nodes, node_set):
    home, other = home_and_other("conv-1")
    nodes[other].alive = False
    await node_set.check()
    nodes[home].scripts = [["The", BREAK]]

    with pytest.raises(EngineUnavailable, match="no other node"):
        await collect(node_set, [1, 2, 3], "conv-1")
    assert not node_set.ready


async def test_a_request_the_node_refuses_is_not_retried_and_the_node_stays_up(nodes, node_set):
    home, other = home_and_other("conv-1")
    nodes[home].status = 400

    with pytest.raises(EngineUnavailable) as caught:
        await collect(node_set, [1, 2, 3], "conv-1")

    assert "400" in str(caught.value)
    assert nodes[other].bodies == [] and node_set.states()[home] == "up"


async def test_the_check_marks_a_dead_node_down_and_a_returning_one_up(nodes, node_set):
    home, _ = home_and_other("conv-1")
    nodes[home].alive = False
    await node_set.check()
    assert node_set.states()[home].startswith("down: ConnectError")
    nodes[home].alive = True
    await node_set.check()
    assert node_set.states()[home] == "up"
    assert metrics.value("chat_node_up", pool="remote-big", node=home) == 1


async def test_shedding_reads_the_least_loaded_up_node(nodes, node_set):
    nodes[URLS[0]].waiting, nodes[URLS[1]].waiting = 7, 3
    assert (await node_set.load()).waiting == 3
    nodes[URLS[1]].alive = False
    await node_set.check()
    assert (await node_set.load()).waiting == 7


async def test_through_the_pipeline_the_streamed_text_and_the_tally_match_after_a_node_died(
    nodes, node_set, monkeypatch
):
    """gateway/run.py's generate over the node set (what a turn runs): the text it yields is the
    answer's text, and the tally counts every streamed token once."""
    pool = pools_load([entry(), frontier(), multi()]).get("remote-big")
    monkeypatch.setattr(run, "pool_engine", lambda p: node_set)
    monkeypatch.setattr(serving, "pool_engine", lambda p: node_set)
    home, other = home_and_other("conv-9")
    nodes[home].scripts = [["Calm", " water", BREAK]]
    nodes[other].scripts = [[" and", " wind", "."]]
    admitted = run.Admitted(
        caller=Caller(user_id=1, tier="paid", service=True),
        route=Route(pool=pool, reason="tier default", priority=0),
    )
    answer = run.Answer(run.Tally(prompt_tokens=3))
    options = GenerationOptions(max_tokens=20, temperature=0.0, affinity="conv-9")

    texts = [t async for t in run.generate(admitted, [1, 2, 3], options, "turn-9", answer)]

    assert "".join(texts) == answer.text == "Calm water and wind."
    assert answer.tally.completion_tokens == 5 and answer.finish_reason == run.STOP


@pytest.mark.urls(__name__)
@pytest.mark.django_db
async def test_readyz_and_metrics_show_each_nodes_state(nodes, settings, engine_double):
    settings.CHAT_POOLS = [*settings.CHAT_POOLS, multi(tiers=["paid"])]
    pool_set_reset()
    nodes[URLS[1]].alive = False
    try:
        response = await AsyncClient().get("/readyz")
        scraped = (await AsyncClient().get("/metrics")).content.decode()
    finally:
        pool_set_reset()  # stops the node sets' checks

    assert response.status_code == 200, response.content  # one node down leaves the gateway ready
    states = response.json()["nodes"]["remote-big@1"]
    assert states[URLS[0]] == "up" and states[URLS[1]].startswith("down: ConnectError")
    assert f'chat_node_up{{node="{URLS[0]}",pool="remote-big"}} 1.0' in scraped
    assert f'chat_node_up{{node="{URLS[1]}",pool="remote-big"}} 0.0' in scraped
