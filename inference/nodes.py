"""Pools of several nodes: which node answers a conversation, which nodes are up, and how an
answer whose node dies continues on another (DESIGN.md, "Failure modes": a node crash
mid-generation -> retry on another node of the same pool, which re-runs prefill; a brief TTFT
spike, no data loss).

A remote pool may list several OpenAI-compatible nodes (``urls:``, inference/pools.py), each a
separate process: an engine process of this project or ``vllm serve``. :class:`NodeSet` is that
pool's engine (``pool_engine(pool)``); to the gateway it looks like one remote engine.

**Node choice.** Rendezvous (highest-random-weight) hashing, Thaler & Ravishankar, "Using
name-based mappings to increase hit rates" (1998): a node's score for a key is the first 8 bytes
of BLAKE2b(key, NUL, node URL); the key goes to the up node with the highest score. The key is
the conversation id (``GenerationOptions.affinity``; the request id when there is none), so a
conversation's turns land on one node whose prefix cache holds its history's KV blocks; a node
going down moves only its own conversations, and coming back takes them back. The home node is
skipped when its waiting count (``vllm:num_requests_waiting`` from its ``/metrics``,
inference/remote.py ``load``) exceeds the least-loaded up node's by more than
K = ``settings.CHAT_NODE_SPILL_WAITING`` (default 2, the reason is in chatsite/settings/engine.py);
the request then goes to the least-loaded node (ties: the best score).

**Readiness.** A background task checks every node (``GET /v1/models``, the model listed) every
``CHAT_NODE_CHECK_INTERVAL_S`` seconds, each check bounded by ``CHAT_NODE_CHECK_TIMEOUT_S``. A
request that cannot connect to a node, gets 502/503/504 or whose stream breaks marks the node
down at once (``inference.remote.NodeFailure``); only a passing check marks it up again. The
state is in ``/readyz`` (``nodes``, chatsite/health.py) and ``chat_node_up{pool,node}``.

**Retry on another node.** When a node fails a request (NodeFailure), the request goes on at once
on the best other up node: before its first token it is simply sent again; after it, the new
node gets the original prompt token ids plus the tokens of the text already streamed (a
re-prefill) and ``max_tokens`` less the completion tokens already generated, and its text
continues the stream. The caller sees one stream: no text repeated or lost, completion tokens
counting every streamed token, prompt tokens the prompt as first sent (the re-prefill is the
service's cost). Each node is tried at most once per request; with no other node up the request
fails with EngineUnavailable, as a one-node pool's does (gateway/run.py may then wait for one).
Metrics: ``chat_node_requests_total{pool,node}``, ``chat_node_retries_total{pool,phase}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import httpx
from django.conf import settings

from core import metrics
from inference.engine import Delta, EngineUnavailable, GenerationOptions
from inference.remote import EngineLoad, NodeFailure, OpenAIRemoteEngine, PoolEndpoint

logger = logging.getLogger(__name__)


# --- the pure part: rendezvous hashing and the spill rule ----------------------------------------


def hrw_score(key: str, node: str) -> int:
    """The rendezvous-hash score of ``node`` (its base URL) for ``key``: the first 8 bytes of
    BLAKE2b(key, NUL, node) as an unsigned integer. Stable across processes and restarts (no
    PYTHONHASHSEED), so every gateway sends a conversation to the same node."""
    digest = hashlib.blake2b(f"{key}\0{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def hrw_order(key: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` from the best score for ``key`` to the worst (ties, practically never: by name)."""
    return sorted(nodes, key=lambda node: (-hrw_score(key, node), node))


def node_choose(key: str, waiting: Mapping[str, int], *, spill: int) -> str:
    """The node that serves ``key``, from the up nodes' waiting counts (``waiting``: node URL ->
    requests waiting there).

    The key's rendezvous-hash node, unless its waiting count exceeds the least-loaded node's by
    more than ``spill`` (K); then the least-loaded node, ties going to the better score. Raises
    ValueError when ``waiting`` is empty (no node is up)."""
    if not waiting:
        raise ValueError("no node to choose from")
    order = hrw_order(key, waiting)
    home = order[0]
    least = min(waiting.values())
    if waiting[home] - least <= spill:
        return home
    return next(node for node in order if waiting[node] == least)


# --- the node set: one pool's nodes ---------------------------------------------------------------


@dataclass
class Node:
    """One node of a pool: its base ``url``, the client that talks to it, and its readiness:
    ``up`` (None until first checked), ``reason`` it is down, ``checked_at`` (time.monotonic())."""

    url: str
    engine: OpenAIRemoteEngine
    up: bool | None = None
    reason: str = "not checked yet"
    checked_at: float = 0.0

    def state(self) -> str:
        """``"up"``, or ``"down: <reason>"`` (also before the first check)."""
        return "up" if self.up else f"down: {self.reason}"


@dataclass
class NodeSet:
    """The engine of a pool of several nodes (module docstring); the surface of
    ``inference.engine.EngineProtocol`` plus ``load`` (shedding) and ``states`` (``/readyz``).
    Prompts are templated here with the pool's tokenizer folder, as for one remote node."""

    pool: str
    nodes: tuple[Node, ...]
    # Every node queues requests itself (inference/serving.py: no admission queue here).
    queues_remotely: bool = True
    _watcher: asyncio.Task | None = None
    _requests: dict[str, tuple[Node, str]] = field(
        default_factory=dict
    )  # id -> (node, its id there)

    @classmethod
    def for_pool(cls, pool: PoolEndpoint) -> NodeSet:
        """The node set of a ``remote`` pool with ``urls``: one client per node, each with the
        pool's served ``model``, ``api_key`` and tokenizer folder."""
        nodes = tuple(
            Node(
                url,
                OpenAIRemoteEngine(
                    base_url=url, api_key=pool.api_key, model=pool.model, model_path=pool.model_path
                ),
            )
            for url in pool.urls
        )
        for node in nodes:
            metrics.NODE_UP.labels(pool=pool.name, node=node.url).set(0)
        return cls(pool=pool.name, nodes=nodes)

    # -- readiness --

    @property
    def ready(self) -> bool:
        """Whether at least one node is up."""
        return any(node.up for node in self.nodes)

    def states(self) -> dict[str, str]:
        """Node URL -> ``"up"`` or ``"down: <reason>"`` (``/readyz``)."""
        return {node.url: node.state() for node in self.nodes}

    def _set(self, node: Node, up: bool, reason: str = "") -> None:
        if node.up is not False and not up:
            logger.warning("pool %s: node %s is down (%s)", self.pool, node.url, reason)
        elif node.up is False and up:
            logger.info("pool %s: node %s is up again", self.pool, node.url)
        node.up, node.reason, node.checked_at = up, reason, time.monotonic()
        metrics.NODE_UP.labels(pool=self.pool, node=node.url).set(1 if up else 0)

    async def _probe(self, node: Node) -> None:
        """Check one node: ``GET /v1/models`` answers 200 within CHAT_NODE_CHECK_TIMEOUT_S and
        lists the pool's model. Also learns whether it is an engine process of this project
        (it then gets the ``admission`` field, inference/remote.py)."""
        engine = node.engine
        try:
            async with httpx.AsyncClient(timeout=settings.CHAT_NODE_CHECK_TIMEOUT_S) as client:
                response = await client.get(f"{node.url}/v1/models", headers=engine._headers())
            if response.status_code != 200:
                return self._set(node, False, f"/v1/models answered {response.status_code}")
            listed = response.json().get("data", [])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return self._set(node, False, f"{type(exc).__name__}: {exc}"[:200])
        if engine.model not in [m.get("id") for m in listed]:
            return self._set(node, False, f"does not serve {engine.model!r}")
        engine.chatsite = any(m.get("owned_by") == "chatsite" for m in listed)
        engine.ready = True
        self._set(node, True)

    async def check(self) -> None:
        """Check every node now, concurrently (each bounded by CHAT_NODE_CHECK_TIMEOUT_S)."""
        await asyncio.gather(*(self._probe(node) for node in self.nodes))

    def watch(self) -> None:
        """Start the background check (every CHAT_NODE_CHECK_INTERVAL_S seconds) in the running
        event loop, unless it runs there already. Called on every use, so the first request or
        probe starts it; a task left in another (closed) loop is replaced."""
        loop = asyncio.get_running_loop()
        task = self._watcher
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._watcher = loop.create_task(self._watch(), name=f"nodes-{self.pool}")

    def stop_watching(self) -> None:
        """Stop the background check (from any thread: the pools are reloaded, the loop ends)."""
        task = self._watcher
        if task is not None and not task.done() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)
        self._watcher = None

    async def _watch(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive one bad check
                logger.exception("pool %s: the node check failed", self.pool)
            await asyncio.sleep(max(0.1, settings.CHAT_NODE_CHECK_INTERVAL_S))

    async def ensure_started(self) -> None:
        """Start the background check; check the nodes now unless one is known up. Raises
        EngineUnavailable when no node is up."""
        self.watch()
        if not self.ready:
            await self.check()
        if not self.ready:
            raise EngineUnavailable(f"no node of pool {self.pool} is up ({self._reasons()})")

    async def wait_ready(self, timeout_s: float) -> None:
        """Check the nodes every second until one is up, up to ``timeout_s`` seconds. Raises
        EngineUnavailable after that."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await self.ensure_started()
            except EngineUnavailable:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(1)

    def check_health(self) -> None:
        """Nothing to watch locally; the background check keeps each node's state."""

    def _reasons(self) -> str:
        return "; ".join(f"{node.url}: {node.state()}" for node in self.nodes)

    # -- the tokenizer (the pool's folder; the same for every node) --

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The chat template applied locally -> prompt token ids."""
        return self.nodes[0].engine.encode_chat(messages)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens)."""
        return self.nodes[0].engine.encode_text(text)

    def count_tokens(self, text: str) -> int:
        """Number of tokens ``text`` encodes to (no special tokens)."""
        return self.nodes[0].engine.count_tokens(text)

    def vocab_size(self) -> int:
        """How many token ids the tokenizer knows."""
        return self.nodes[0].engine.vocab_size()

    # -- load and choice --

    async def load(self) -> EngineLoad:
        """The queue that shedding reads: the least-loaded up node's (its waiting and running
        counts), since a request goes there when its home node's queue is K longer; zeros when no
        node is up (the request then fails on its own, shedding has nothing to protect)."""
        up = [node for node in self.nodes if node.up]
        if not up:
            return EngineLoad(0, 0, time.monotonic())
        loads = await asyncio.gather(*(node.engine.load() for node in up))
        return min(loads, key=lambda load: load.waiting)

    async def choose(self, key: str, exclude: Iterable[str] = ()) -> Node:
        """The up node (not in ``exclude``, node URLs) that serves ``key``: :func:`node_choose`
        over their waiting counts (each read at most every CHAT_ENGINE_LOAD_TTL_S; not read when
        one node is left). Raises
        EngineUnavailable when no such node is up."""
        skip = set(exclude)
        up = [node for node in self.nodes if node.up and node.url not in skip]
        if not up:
            raise EngineUnavailable(f"no other node of pool {self.pool} is up ({self._reasons()})")
        if len(up) == 1:
            return up[0]  # no choice to make: no queue to read (a failover goes out at once)
        loads = await asyncio.gather(*(node.engine.load() for node in up))
        waiting = {node.url: load.waiting for node, load in zip(up, loads, strict=True)}
        url = node_choose(key, waiting, spill=settings.CHAT_NODE_SPILL_WAITING)
        return next(node for node in up if node.url == url)

    # -- generation --

    async def generate(
        self, prompt_token_ids: list[int], options: GenerationOptions, request_id: str
    ) -> AsyncIterator[Delta]:
        """Stream the answer from the chosen node, moving to another when it fails (module
        docstring). Deltas carry running totals over every node it ran on: ``prompt_tokens`` the
        prompt as given, ``completion_tokens`` all tokens streamed, ``cached_tokens`` the part of
        the prompt the answering node had in its prefix cache. Attempts after the first run as
        ``{request_id}-n{k}`` on their node. Raises EngineUnavailable when no node is left, or
        when a node refuses the request itself (a 4xx: another node would too)."""
        self.watch()
        if not self.ready:
            await self.ensure_started()
        prompt = list(prompt_token_ids)
        key = options.affinity or request_id
        streamed: list[str] = []
        earlier = 0  # completion tokens generated on nodes that failed
        tried: list[str] = []
        while True:
            node = await self.choose(key, exclude=tried)
            remaining = options.max_tokens - earlier
            if remaining <= 0:  # the node died after the last token, before saying so
                yield Delta("", len(prompt), earlier, "length")
                return
            ids = prompt + self.encode_text("".join(streamed)) if streamed else prompt
            node_id = f"{request_id}-n{len(tried)}" if tried else request_id
            self._requests[request_id] = (node, node_id)
            metrics.NODE_REQUESTS.labels(pool=self.pool, node=node.url).inc()
            completion = 0
            try:
                async for delta in node.engine.generate(
                    ids, replace(options, max_tokens=remaining), node_id
                ):
                    completion = delta.completion_tokens
                    if delta.text:
                        streamed.append(delta.text)
                    yield Delta(
                        delta.text, len(prompt), earlier + delta.completion_tokens,
                        delta.finish_reason, min(delta.cached_tokens, len(prompt)),
                    )  # fmt: skip
                return
            except NodeFailure as exc:
                self._set(node, False, str(exc)[:200])
                tried.append(node.url)
                earlier += completion
                phase = "mid_answer" if streamed else "before_first_token"
                metrics.NODE_RETRIES.labels(pool=self.pool, phase=phase).inc()
                logger.warning(
                    "pool %s: node %s failed %s %s (%s); moving it to another node",
                    self.pool, node.url, request_id, phase, exc,
                )  # fmt: skip
            finally:
                self._requests.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` on the node that serves it now (its reader is cancelled, the
        HTTP stream closes, the node aborts)."""
        found = self._requests.get(request_id)
        if found is not None:
            node, node_id = found
            await node.engine.abort(node_id)

    def num_unfinished_requests(self) -> int:
        """Requests this process is streaming from the pool's nodes."""
        return sum(node.engine.num_unfinished_requests() for node in self.nodes)
