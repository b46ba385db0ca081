"""An engine client for a model served by another process over the OpenAI-compatible API.

A gateway process can run without an engine of its own (DESIGN.md: how background jobs reach
the model; "a gateway can run without its own engine"): it points at another server's
``/v1/completions`` (this project's, or ``vllm serve``'s, which accept token-id prompts) and
behaves like :class:`inference.engine.VllmEngine` to the rest of the code. Prompts are built with
the same model folder's chat template locally, so token counts and context fitting match.

Settings: ``CHAT_ENGINE_URL`` (base URL, e.g. ``http://127.0.0.1:8000``), ``CHAT_ENGINE_API_KEY``
(a service credential), ``CHAT_MODEL_NAME``, ``CHAT_MODEL_PATH`` (for the tokenizer).
A ``remote`` model pool (inference/pools.py) gets its own client, :meth:`OpenAIRemoteEngine.for_pool`.
Aborting a request closes its HTTP stream; the serving side aborts at once on disconnect.

**Tier and priority across the hop** (DESIGN.md, "Production topology"). The remote queues
requests itself (``queues_remotely``: no admission queue in front of it here,
inference/serving.py), so each request tells it where it belongs:

- an engine process of this project (its ``GET /v1/models`` entries are ``owned_by``
  ``chatsite``) gets the service-only ``admission`` field, ``{"tier", "priority"}``; its
  admission queue orders by the priority and keeps the reserved slots for paid tiers
  (api/completions.py);
- any other server (``vllm serve``) gets vLLM's own ``priority`` field when it is not 0 (vLLM
  accepts it when started with ``--scheduling-policy priority`` and refuses a non-zero priority
  otherwise); it has no reserved slots.

Every request also carries the tenant's prefix-cache salt (``GenerationOptions.cache_salt``) in
vLLM's own ``cache_salt`` field, which ``vllm serve`` accepts from anyone and this project's
engine process from the service credential only (DESIGN.md, "Tenants and the engine's caches").

Shedding reads the remote's queue (:meth:`OpenAIRemoteEngine.load`: ``vllm:num_requests_waiting``
and ``_running`` from its ``/metrics``, which both kinds expose), so every gateway in front of
one engine node sheds on the same number. Usage comes from the stream's final chunk
(``stream_options.include_usage``); prefix-cache hits from ``usage.prompt_tokens_details.
cached_tokens`` when the server reports them (vLLM: ``--enable-prompt-tokens-details``), else 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from inference.engine import Delta, EngineUnavailable, GenerationOptions

logger = logging.getLogger(__name__)


class PoolEndpoint(Protocol):
    """What a client needs of a remote pool (inference/pools.py ``Pool`` has these): its
    ``name``, node base URLs ``urls`` (``url``: the first), ``api_key``, served ``model`` and
    tokenizer folder ``model_path``."""

    name: str
    url: str
    urls: tuple[str, ...]
    api_key: str
    model: str
    model_path: str

WAITING_METRIC = "vllm:num_requests_waiting"
RUNNING_METRIC = "vllm:num_requests_running"


class NodeFailure(EngineUnavailable):
    """The engine node itself failed, not the request: it could not be reached, the connection
    broke, it answered 502/503/504, or its stream ended without a finish. A pool of several
    nodes (inference/nodes.py) marks the node down and continues the request on another; for
    everyone else it is an EngineUnavailable like any other."""


# Replies that say the node cannot serve now (a proxy without its upstream, a restarting
# engine), as opposed to a refusal of this request (4xx), which another node would repeat.
NODE_DOWN_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True)
class EngineLoad:
    """An engine node's queue as its ``/metrics`` reported it: requests ``waiting`` for a slot
    and ``running``; ``read_at`` (time.monotonic()) when it was read."""

    waiting: int = 0
    running: int = 0
    read_at: float = 0.0


def load_parse(text: str, model: str) -> EngineLoad:
    """The queue depth of ``model`` from Prometheus text (``vllm:num_requests_waiting`` /
    ``vllm:num_requests_running``, summed over samples whose ``model_name`` is ``model``, or
    over all samples when none names it). Parsed with prometheus_client's own parser; only the
    two metrics' lines are handed to it. Raises ValueError for text it cannot parse."""
    wanted = "\n".join(
        line for line in text.splitlines() if WAITING_METRIC in line or RUNNING_METRIC in line
    )
    totals: dict[str, dict[bool, float]] = {WAITING_METRIC: {}, RUNNING_METRIC: {}}
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            if sample.name not in totals:
                continue
            mine = sample.labels.get("model_name") == model
            totals[sample.name][mine] = totals[sample.name].get(mine, 0.0) + sample.value

    def pick(name: str) -> int:
        by_model = totals[name]
        return int(by_model.get(True, by_model.get(False, 0.0)))

    return EngineLoad(pick(WAITING_METRIC), pick(RUNNING_METRIC), time.monotonic())


@dataclass
class OpenAIRemoteEngine:
    """Talks to ``{base_url}/v1/completions`` with streamed token-id prompts."""

    base_url: str
    api_key: str
    model: str
    model_path: str
    ready: bool = False
    # The remote queues requests itself: no admission queue in front of it (module docstring).
    queues_remotely: bool = True
    # Whether the remote is an engine process of this project (takes the ``admission`` field);
    # learnt from GET /v1/models at start.
    chatsite: bool = False
    _tokenizer: object | None = None
    _requests: dict[str, asyncio.Task | None] = field(default_factory=dict)
    _load: EngineLoad = field(default_factory=EngineLoad)
    _load_reading: asyncio.Future | None = None

    @classmethod
    def from_settings(cls) -> OpenAIRemoteEngine:
        """Build the client from Django settings (see the module docstring)."""
        return cls(
            base_url=settings.CHAT_ENGINE_URL.rstrip("/"),
            api_key=settings.CHAT_ENGINE_API_KEY,
            model=settings.CHAT_MODEL_NAME,
            model_path=str(settings.CHAT_MODEL_PATH),
        )

    @classmethod
    def for_pool(cls, pool: PoolEndpoint) -> OpenAIRemoteEngine:
        """A client for a ``remote`` pool: its ``url``, ``api_key``, served ``model`` and
        tokenizer folder ``model_path``."""
        return cls(
            base_url=pool.url.rstrip("/"),
            api_key=pool.api_key,
            model=pool.model,
            model_path=pool.model_path,
        )

    def _headers(self) -> dict[str, str]:
        # No key: no header at all ("Bearer " with nothing after it is an illegal header value).
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def ensure_started(self) -> None:
        """Check the remote serves the model. Raises EngineUnavailable if it does not answer."""
        if self.ready:
            return
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(f"{self.base_url}/v1/models", headers=self._headers())
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"the model server at {self.base_url} is unreachable: {exc}") from exc
        if response.status_code != 200:
            raise EngineUnavailable(f"the model server answered {response.status_code}")
        listed = response.json().get("data", [])
        served = [m.get("id") for m in listed]
        if self.model not in served:
            raise EngineUnavailable(f"the model server does not serve {self.model!r} ({served})")
        self.chatsite = any(m.get("owned_by") == "chatsite" for m in listed)
        # The prompt is templated here: load the tokenizer now, so ready means ready (a
        # gateway's first turn would otherwise wait for it).
        await asyncio.to_thread(self._require_tokenizer)
        self.ready = True

    def _require_tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # noqa: PLC0415

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The model's chat template applied locally -> prompt token ids."""
        ids = self._require_tokenizer().apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=True
        )
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens)."""
        return list(self._require_tokenizer().encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        """Number of tokens ``text`` encodes to (no special tokens)."""
        return len(self.encode_text(text))

    def vocab_size(self) -> int:
        """How many token ids the tokenizer knows (valid prompt ids are below it)."""
        return len(self._require_tokenizer())

    async def generate(
        self, prompt_token_ids: list[int], options: GenerationOptions, request_id: str
    ) -> AsyncIterator[Delta]:
        """Stream deltas from the remote ``/v1/completions``.

        Running ``completion_tokens`` count one per text chunk until the final delta, which
        carries the server's usage (prompt, completion and cached prompt tokens) and the finish
        reason. Closing or cancelling the iteration closes the HTTP stream, which aborts the
        request remotely. Raises :class:`NodeFailure` (an EngineUnavailable) on transport errors,
        502/503/504 replies and a stream that ends with neither a finish reason nor ``[DONE]``
        (the node died mid-answer), EngineUnavailable on other error replies.
        """
        body = {
            "model": self.model,
            "prompt": list(prompt_token_ids),
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "top_p": options.top_p if options.temperature > 0 else 1.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if options.stop:
            body["stop"] = list(options.stop)
        if options.seed is not None:
            body["seed"] = options.seed
        if self.chatsite:
            # Only the service credential may set it (api/completions.py); ours is one.
            body["admission"] = {"tier": options.tier or "background", "priority": options.priority}
        elif options.priority:
            body["priority"] = options.priority
        if options.cache_salt:
            # The tenant's prefix-cache salt: vLLM's own request field, which this project's
            # engine process takes from the service credential only (gateway/admission.py).
            body["cache_salt"] = options.cache_salt
        if options.json_schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": options.json_schema},
            }
        self._requests[request_id] = asyncio.current_task()
        prompt = len(prompt_token_ids)
        completion = 0
        finish_reason = None
        finished = False
        done = False  # the server's "data: [DONE]" arrived
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as client:
                async with client.stream(
                    "POST", f"{self.base_url}/v1/completions", json=body, headers=self._headers()
                ) as response:
                    if response.status_code != 200:
                        detail = (await response.aread()).decode(errors="replace")[:300]
                        failure = NodeFailure if response.status_code in NODE_DOWN_STATUSES else EngineUnavailable
                        raise failure(f"the model server answered {response.status_code}: {detail}")
                    async for line in response.aiter_lines():
                        if line == "data: [DONE]":
                            done = True
                            continue
                        if not line.startswith("data: "):
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            raise EngineUnavailable(chunk["error"].get("message", "model error"))
                        usage = chunk.get("usage")
                        if usage:
                            details = usage.get("prompt_tokens_details") or {}
                            finished = True
                            yield Delta(
                                "", usage["prompt_tokens"], usage["completion_tokens"],
                                finish_reason or "stop", int(details.get("cached_tokens") or 0),
                            )  # fmt: skip
                            continue
                        for choice in chunk.get("choices", []):
                            finish_reason = choice.get("finish_reason") or finish_reason
                            if choice.get("text"):
                                completion += 1
                                yield Delta(choice["text"], prompt, completion)
                    if not finished and not done and finish_reason is None:
                        raise NodeFailure(f"the stream from {self.base_url} ended without a finish")
                    if not finished:
                        # A server that sends no usage chunk: end with our own count.
                        finished = True
                        yield Delta("", prompt, completion, finish_reason or "stop")
        except httpx.HTTPError as exc:
            self.ready = False
            raise NodeFailure(f"the model server failed: {exc}") from exc
        finally:
            self._requests.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Cancel the task reading ``request_id`` (its HTTP stream closes; the remote aborts)."""
        task = self._requests.get(request_id)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def load(self) -> EngineLoad:
        """The remote's queue now (:func:`load_parse` of its ``/metrics``), read at most once
        every ``settings.CHAT_ENGINE_LOAD_TTL_S`` seconds; concurrent callers share one read.
        When the read fails the last value is kept (a warning is logged): shedding then goes
        by what was last seen, and the remote's own queue still orders every request."""
        ttl = float(settings.CHAT_ENGINE_LOAD_TTL_S)
        if time.monotonic() - self._load.read_at < ttl:
            return self._load
        if self._load_reading is None or self._load_reading.done():
            self._load_reading = asyncio.ensure_future(self._read_load())
        return await asyncio.shield(self._load_reading)

    async def _read_load(self) -> EngineLoad:
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                response = await client.get(f"{self.base_url}/metrics", headers=self._headers())
            response.raise_for_status()
            self._load = load_parse(response.text, self.model)
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("could not read the queue of %s (%s); shedding on the last value", self.base_url, exc)
            self._load = EngineLoad(self._load.waiting, self._load.running, time.monotonic())
        return self._load

    def num_unfinished_requests(self) -> int:
        """Requests this process is streaming from the remote."""
        return len(self._requests)

    async def wait_ready(self, timeout_s: float) -> None:
        """Poll the remote until it serves the model, up to ``timeout_s`` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                await self.ensure_started()
                return
            except EngineUnavailable:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(1)

    def check_health(self) -> None:
        """Nothing to watch locally; readiness comes from ``ensure_started``."""
