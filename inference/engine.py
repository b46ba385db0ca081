"""The process's inference engine client: one vLLM ``AsyncLLM``, started lazily in the running loop.

vLLM starts its EngineCore with multiprocessing *spawn*, so the engine must be created after the
server process is up, from inside its event loop, never at import time (DESIGN.md, "What is known
to work"). :func:`get_engine` returns the process-wide client; the first caller of
:meth:`Engine.ensure_started` starts it, concurrent callers wait for the same start.

Every engine implementation (this one, and the scripted double in ``tests/``) offers the same
surface, :class:`EngineProtocol`:

- ``await ensure_started()`` - start (idempotent); ``ready`` - True once warmed up.
- ``encode_chat(messages) -> list[int]`` - chat template applied, prompt token ids.
- ``generate(prompt_token_ids, options, request_id)`` - async iterator of :class:`Delta`.
- ``await abort(request_id)`` - stop a request now and free its KV cache blocks.
- ``num_unfinished_requests()`` - requests the engine still holds (0 when idle).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from inference.errors import EngineUnavailable  # noqa: F401 - raised here; callers import it from here too
from inference.imports import shared_libraries_import
from inference.tuning import EngineTuning

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationOptions:
    """Sampling settings for one request.

    ``max_tokens`` caps completion tokens; ``temperature`` 0 means greedy; ``stop`` strings end
    the answer and are never part of it (vLLM holds back any text that could be a stop string's
    prefix until it knows, PF-S1).
    """

    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # A JSON schema the answer must match (vLLM structured output; the first request with a
    # new schema compiles its grammar, ~5 s on the CPU).
    json_schema: dict | None = None
    # vLLM priority scheduling: lower runs first (ties first come, first served). User turns
    # run at 0; background jobs at settings.CHAT_BACKGROUND_PRIORITY (DESIGN.md).
    priority: int = 0
    # The tier the request is served for (``free`` | ``paid`` | ``enterprise`` | ``background``;
    # "" unknown). An in-process engine ignores it; a remote engine of this project receives it
    # with the priority (inference/remote.py), so its admission queue keeps the reserved slots
    # for paid turns (DESIGN.md, "Production topology").
    tier: str = ""
    # What a pool of several nodes hashes to pick a node (inference/nodes.py): the conversation
    # id, so a conversation's turns reuse one node's prefix cache; "" hashes the request id.
    affinity: str = ""
    # The tenant's prefix-cache salt (vLLM's ``cache_salt``, PR #17045, against the prefix-cache
    # side channel of CVE-2025-46570): a request reuses only KV blocks cached by requests with
    # the same salt. Derived on the server from the tenant (gateway/tenancy.py), never taken
    # from a client; every engine path sends it (in-process prompt, engine process, ``vllm
    # serve``). "": unsalted (only the engine's own warm-up).
    cache_salt: str = ""


@dataclass(frozen=True)
class Delta:
    """One step of a generation.

    ``text`` is the new text since the previous delta (may be empty on the final delta);
    ``prompt_tokens`` and ``completion_tokens`` are running totals for the whole request;
    ``finish_reason`` is None until the last delta, then ``"stop"`` or ``"length"``.
    ``cached_tokens`` is how many of the prompt tokens were served from the engine's prefix
    cache (KV blocks reused, not prefilled again): vLLM's ``RequestOutput.num_cached_tokens``,
    read from the request's first output and repeated on every delta (0 when unknown).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    cached_tokens: int = 0


class EngineProtocol(Protocol):
    """What the gateway needs from an inference engine (see the module docstring)."""

    ready: bool

    async def ensure_started(self) -> None: ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def generate(
        self, prompt_token_ids: list[int], options: GenerationOptions, request_id: str
    ) -> AsyncIterator[Delta]: ...

    async def abort(self, request_id: str) -> None: ...

    def num_unfinished_requests(self) -> int: ...

    def encode_text(self, text: str) -> list[int]: ...

    async def wait_ready(self, timeout_s: float) -> None: ...

    def check_health(self) -> None: ...


@dataclass
class VllmEngine:
    """An in-process vLLM ``AsyncLLM`` for one model folder.

    Settings used (``chatsite/settings/engine.py``): ``CHAT_MODEL_PATH`` (HF model folder),
    ``CHAT_MAX_MODEL_LEN`` (tokens of context), ``CHAT_KV_CACHE_BYTES`` (explicit KV cache size:
    on the CPU backend the default, a fraction of a NUMA node's RAM, fails to start here),
    ``CHAT_MAX_NUM_SEQS`` (continuous-batching width), and the ``CHAT_ENGINE_*`` speed levers
    (:class:`EngineTuning`).
    """

    model_path: str
    max_model_len: int
    kv_cache_bytes: int
    max_num_seqs: int
    tuning: EngineTuning | None = None
    ready: bool = False
    _llm: object | None = None
    _tokenizer: object | None = None
    _start_task: asyncio.Task | None = None
    _start_error: BaseException | None = None
    _active: set[str] = field(default_factory=set)
    _restarting: bool = False
    restarts: int = 0

    @classmethod
    def from_settings(cls) -> VllmEngine:
        """Build (not start) the engine from Django settings."""
        return cls(
            model_path=str(settings.CHAT_MODEL_PATH),
            max_model_len=settings.CHAT_MAX_MODEL_LEN,
            kv_cache_bytes=settings.CHAT_KV_CACHE_BYTES,
            max_num_seqs=settings.CHAT_MAX_NUM_SEQS,
            tuning=EngineTuning.from_settings(),
        )

    async def ensure_started(self) -> None:
        """Start the engine once and warm it up; later calls return at once.

        The first generation after start is about 10x slower than the rest (measured, DESIGN.md),
        so a short warm-up generation runs before ``ready`` becomes True.
        Raises EngineUnavailable if the engine cannot start.
        """
        if self.ready:
            return
        if self._start_error is not None:
            raise EngineUnavailable(str(self._start_error)) from self._start_error
        if self._start_task is None:
            self._start_task = asyncio.get_running_loop().create_task(self._start_once())
        # Shielded: a request cancelled while it waits (a Stop during the first turn) must not
        # cancel the shared start.
        await asyncio.shield(self._start_task)

    async def _start_once(self) -> None:
        try:
            await self._start()
        except Exception as exc:
            self._start_error = exc
            logger.exception("inference engine failed to start")
            raise EngineUnavailable(f"the model could not be loaded: {exc}") from exc

    async def _start(self) -> None:
        await asyncio.to_thread(shared_libraries_import)  # before vLLM's own imports
        from vllm import AsyncEngineArgs  # noqa: PLC0415 - heavy; only in a serving process
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        tuning = self.tuning or EngineTuning()
        tuning.apply_process_env()
        args = AsyncEngineArgs(**self.engine_args_kwargs())
        logger.info(
            "starting vLLM engine for %s (%s)", args.model, tuning.describe(self.model_path)
        )
        # Built in a worker thread: construction waits ~25 s for the EngineCore handshake, and
        # the server's event loop must keep serving (readiness probes, other streams) meanwhile.
        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        self._tokenizer = self._llm.get_tokenizer()
        _install_shutdown_on_signals(self)
        warmup_ids = self.encode_chat([{"role": "user", "content": "Hello"}])
        async for _ in self.generate(
            warmup_ids, GenerationOptions(max_tokens=8, temperature=0.0), "warmup"
        ):
            pass
        self.ready = True
        logger.info("vLLM engine ready")

    def engine_args_kwargs(self) -> dict:
        """The keyword arguments for vLLM's ``AsyncEngineArgs`` (issue 9's levers included).

        Reads nothing but this object: ``self.tuning`` (:class:`EngineTuning`, from the
        ``CHAT_ENGINE_*`` settings) decides compile vs eager, block size, chunked prefill,
        speculative decoding, prefix caching and the (quantised) weights folder.
        Raises EngineUnavailable when the quantised folder it names does not exist.
        """
        tuning = self.tuning or EngineTuning()
        kwargs = {
            "model": tuning.weights_path(self.model_path),
            "tokenizer": self.model_path,
            "dtype": tuning.resolved_dtype(),
            # Eager skips graph compilation (start ~30 s on 2 cores); compile mode (torch
            # inductor) decodes faster but its first start compiles for ~2 minutes (cached in
            # ~/.cache/vllm afterwards). docs/engine-tuning.md has the numbers.
            "enforce_eager": tuning.eager,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_bytes": self.kv_cache_bytes,
            "disable_log_stats": True,
            # Requests carry a priority (GenerationOptions.priority); equal priorities are
            # served first come, first served, as with the default policy.
            "scheduling_policy": "priority",
            # Repeated prompt prefixes (system prompt, earlier turns) reuse their KV blocks
            # (Delta.cached_tokens; bench/context_bench.py measures the hit rate).
            "enable_prefix_caching": tuning.prefix_caching,
        }
        if tuning.block_size:
            kwargs["block_size"] = tuning.block_size
        if tuning.max_batched_tokens:
            kwargs["max_num_batched_tokens"] = tuning.max_batched_tokens
        if tuning.speculative:
            kwargs["speculative_config"] = dict(tuning.speculative)
        ir_op_priority = tuning.ir_op_priority()
        if ir_op_priority:
            kwargs["ir_op_priority"] = ir_op_priority
        if tuning.compile_sizes and not tuning.eager:
            kwargs["compilation_config"] = {"compile_sizes": list(tuning.compile_sizes)}
        return kwargs

    def encode_chat(self, messages: Sequence[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        """Apply the model's chat template to ``messages`` ([{role, content}]) -> token ids.

        The generation prompt (the assistant header) is appended, so the model answers next.
        ``tools``: OpenAI ``tools`` items for a template with a tool format
        (inference/tool_format.py ``chat_encoder``); None: none.
        """
        tokenizer = self._require_tokenizer()
        extra = {"tools": tools} if tools else {}
        ids = tokenizer.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=True, **extra
        )
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def chat_template(self) -> str | None:
        """The model's chat template (Jinja text), None when its tokenizer has none."""
        template = getattr(self._require_tokenizer(), "chat_template", None)
        return template if isinstance(template, str) else None

    def count_tokens(self, text: str) -> int:
        """Number of tokens ``text`` encodes to (no special tokens)."""
        return len(self.encode_text(text))

    def vocab_size(self) -> int:
        """How many token ids the model knows: valid prompt ids are ``0 <= id < vocab_size()``
        (the larger of the tokenizer's and the model's vocabulary, as vLLM checks it)."""
        tokenizer = self._require_tokenizer()
        size = len(tokenizer)
        if self._llm is not None:
            size = max(size, self._llm.model_config.get_vocab_size())
        return size

    def _require_tokenizer(self):
        if self._tokenizer is None:
            # Loading the tokenizer alone is cheap and needs no engine (prompt assembly may run
            # before the engine is up, e.g. to reject an over-long prompt early).
            from transformers import AutoTokenizer  # noqa: PLC0415

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    async def generate(
        self, prompt_token_ids: list[int], options: GenerationOptions, request_id: str
    ) -> AsyncIterator[Delta]:
        """Stream :class:`Delta` values for one request.

        Empty text deltas are skipped except the last (which carries the finish reason and the
        final usage). If the consumer stops iterating (task cancelled, generator closed), the
        request is aborted in the engine at once so its KV cache blocks are freed.
        Raises EngineUnavailable if the engine is not started or has died.
        """
        from vllm import SamplingParams  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams  # noqa: PLC0415

        if self._llm is None:
            raise EngineUnavailable("the engine is not started")
        params = SamplingParams(
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p if options.temperature > 0 else 1.0,
            stop=list(options.stop) or None,
            seed=options.seed,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=(
                StructuredOutputsParams(json=options.json_schema) if options.json_schema else None
            ),
        )
        prompt_tokens = len(prompt_token_ids)
        completion_tokens = 0
        # From the prefill stats; not every output carries them (the first may say None or 0
        # before the prefill's stats arrive), so the largest count seen is the one.
        cached_tokens = 0
        finished = False
        self._active.add(request_id)
        try:
            async for output in self._llm.generate(
                engine_prompt(prompt_token_ids, options),
                params,
                request_id,
                priority=options.priority,
            ):
                completion = output.outputs[0]
                completion_tokens += len(completion.token_ids)
                finished = output.finished
                cached_tokens = max(cached_tokens, output.num_cached_tokens or 0)
                if completion.text or finished:
                    yield Delta(
                        text=completion.text,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens,
                        finish_reason=completion.finish_reason if finished else None,
                        cached_tokens=cached_tokens,
                    )
        except Exception as exc:
            if self._llm is None or self._llm.errored:
                self._on_engine_death()
                raise EngineUnavailable(f"the inference engine died: {exc}") from exc
            raise
        finally:
            self._active.discard(request_id)
            if not finished:
                # Covers CancelledError and GeneratorExit: free the KV blocks now. vLLM also
                # aborts on cancellation, but only when the cancel lands inside its own await.
                await asyncio.shield(self.abort(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` in the engine now; a no-op if it is unknown or finished."""
        if self._llm is not None:
            await self._llm.abort(request_id)

    def num_unfinished_requests(self) -> int:
        """Requests the engine still holds (queued or running); 0 before start."""
        if self._llm is None:
            return 0
        return self._llm.get_num_unfinished_requests()

    def _on_engine_death(self) -> None:
        """The EngineCore process died: report not ready and start a fresh engine in the
        background (once, however many requests noticed). Requests wait in ``wait_ready``."""
        if self._restarting:
            return
        self._restarting = True
        self.ready = False
        self.restarts += 1
        logger.error("inference engine died; restarting it (restart #%d)", self.restarts)
        dead, self._llm = self._llm, None
        self._start_task = None
        self._start_error = None

        async def restart():
            try:
                if dead is not None:
                    try:
                        await asyncio.to_thread(dead.shutdown)
                    except Exception:  # noqa: BLE001 - it is dead already; free what we can
                        logger.warning("shutting down the dead engine failed", exc_info=True)
                await self.ensure_started()
            finally:
                self._restarting = False

        restart_task = asyncio.get_running_loop().create_task(restart())
        restart_task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def check_health(self) -> None:
        """Notice an engine that died while idle (and restart it); cheap, no I/O."""
        if self._llm is not None and self._llm.errored and not self._restarting:
            self._on_engine_death()

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until the engine is ready (started or restarted). Raises EngineUnavailable
        after ``timeout_s`` seconds or if starting fails."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.ready:
            if self._start_error is not None:
                raise EngineUnavailable(str(self._start_error))
            if asyncio.get_running_loop().time() > deadline:
                raise EngineUnavailable("the model did not come back in time")
            await asyncio.sleep(0.2)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens)."""
        return list(self._require_tokenizer().encode(text, add_special_tokens=False))

    def shutdown(self) -> None:
        """Stop the EngineCore process. Safe to call twice."""
        llm, self._llm = self._llm, None
        self.ready = False
        if llm is not None:
            llm.shutdown()


def engine_prompt(prompt_token_ids: list[int], options: GenerationOptions) -> dict:
    """vLLM's ``TokensPrompt`` for ``prompt_token_ids``, salted with ``options.cache_salt``
    when it has one (vllm/inputs/llm.py: ``cache_salt`` is hashed into the first KV block's key,
    so only requests with the same salt share cached blocks)."""
    prompt: dict = {"prompt_token_ids": prompt_token_ids}
    if options.cache_salt:
        prompt["cache_salt"] = options.cache_salt
    return prompt


def _install_shutdown_on_signals(engine: VllmEngine) -> None:
    """Shut the engine down on SIGINT/SIGTERM, then run the previous handler.

    Measured here (DESIGN.md): daphne did not exit on SIGTERM while the engine ran, so Ctrl-C on
    ``make run`` hung. Under uvicorn (chatsite/serve.py) the previous handler is uvicorn's
    graceful shutdown, which this runs after the engine's. Only possible from the main thread;
    elsewhere it is skipped.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)

        def handler(received, frame, previous=previous):
            engine.shutdown()
            if callable(previous):
                previous(received, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(received, signal.SIG_DFL)
                os.kill(os.getpid(), received)

        signal.signal(signum, handler)


_engine: EngineProtocol | None = None


def get_engine() -> EngineProtocol:
    """Return this process's engine client (created on first call, started separately).

    The class comes from ``settings.CHAT_ENGINE_CLASS`` (a dotted path with a ``from_settings``
    classmethod), so tests can swap in a scripted double.
    """
    global _engine
    if _engine is None:
        cls = import_string(settings.CHAT_ENGINE_CLASS)
        _engine = cls.from_settings()
    return _engine
