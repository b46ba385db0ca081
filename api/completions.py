"""``POST /v1/chat/completions`` and ``GET /v1/models``, in OpenAI's wire format.

Stateless (no conversation is stored), so the official ``openai`` client works unchanged. The
request is not resumable: when its client disconnects the engine request is aborted at once
(DESIGN.md, the disconnect rule) - ``VllmEngine.generate`` aborts when its consumer is cancelled.
Shapes follow OpenAI's API reference for chat completions and chat completion chunks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from accounts.services import user_is_service
from api import schemas
from api.errors import ApiError
from api.http import api_view, parse_json
from conversations.sse import release_db_connection, run_in_db_thread, sse_response
from conversations.streaming import withdrawn_message
from inference import gate
from inference.engine import EngineUnavailable, GenerationOptions
from inference.pools import pool_engine, pool_set
from inference.prompts import PromptTooLong, prompt_fit
from inference.router import Route
from inference.serving import pool_generate
from moderation.base import acheck
from moderation.gate import OutputGate
from moderation.verdicts import Policy, policy_for

logger = logging.getLogger(__name__)


def _options(body, budget: int, user=None) -> GenerationOptions:
    """Generation options from an OpenAI-style request ``body`` with ``budget`` completion
    tokens; requests of the service user (background jobs) run at the lowest priority
    (settings.CHAT_BACKGROUND_PRIORITY; DESIGN.md, "How background jobs reach the model").
    Raises ApiError 400 for an invalid response_format or more than 4 stop sequences."""
    schema = None
    if getattr(body, "response_format", None) is not None:
        if body.response_format.type == "json_schema":
            if body.response_format.json_schema is None:
                raise ApiError(400, "invalid_request", "response_format.json_schema is required.")
            schema = body.response_format.json_schema.schema_
        elif body.response_format.type == "json_object":
            schema = {"type": "object"}
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4:
        raise ApiError(400, "invalid_request", "At most 4 stop sequences are allowed.")
    temperature = settings.CHAT_TEMPERATURE if body.temperature is None else body.temperature
    return GenerationOptions(
        max_tokens=budget,
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=stop,
        seed=body.seed,
        json_schema=schema,
        priority=settings.CHAT_BACKGROUND_PRIORITY if user is not None and user_is_service(user) else 0,
    )


@api_view("GET")
async def models(request: HttpRequest) -> HttpResponse:
    """The models the caller may use, as OpenAI's ``GET /v1/models`` lists them: each pool the
    caller's tier (or a feature flag) allows, by pool name, then the served model's own name
    (settings.CHAT_MODEL_NAME), which stands for the tier's default pool. Pools carry their
    version, context and answer ceilings and prices (USD per 1M tokens) as extra fields."""
    caller = await gate.acaller_for(request.api_user)
    data = [
        {
            "id": pool.name, "object": "model", "created": 0, "owned_by": "chatsite",
            "version": pool.version, "max_context": pool.max_context, "max_tokens": pool.max_tokens,
            "price_per_million_tokens": {
                "input": str(pool.price_input_per_m),
                "cached_input": str(pool.price_cached_input_per_m),
                "output": str(pool.price_output_per_m),
            },
        }
        for pool in pool_set().for_tier(caller.tier, caller.flags)
    ]  # fmt: skip
    data.append({"id": settings.CHAT_MODEL_NAME, "object": "model", "created": 0, "owned_by": "chatsite"})
    return JsonResponse({"object": "list", "data": data})


@dataclass
class _Admitted:
    """A stateless request admitted by the gateway (inference/gate.py): its caller, route,
    started engine, completion budget and rate-limit decision."""

    caller: gate.Caller
    route: Route
    engine: object
    budget: int = 0
    decision: object | None = None


async def _admit(request: HttpRequest, model: str) -> _Admitted:
    """Route ``model`` for the caller and shed under load, then start the pool's engine.
    Raises gate.Refused (400 unknown model, 403 not for this tier, 503 busy), ApiError 503 if
    the engine cannot start."""
    caller = await gate.acaller_for(request.api_user)
    route = gate.shed_for(caller, gate.route_for(caller, model))
    engine = pool_engine(route.pool)
    try:
        await engine.ensure_started()
    except EngineUnavailable as exc:
        raise ApiError(503, "unavailable", f"The model is unavailable: {exc}", {"Retry-After": "30"}) from None
    return _Admitted(caller=caller, route=route, engine=engine)


async def _respond(
    admitted: _Admitted, ids: list[int], options: GenerationOptions, body, kind: str, checked_text: str
) -> HttpResponse:
    """Take the rate limits for ``ids`` + the budget, pass ``checked_text`` (the newest user
    message, or the prompt) through the input moderation gate, generate with the output gate
    beside the stream, and answer in OpenAI's shape for ``kind`` ("chat" or "text"): ``data:``
    chunks then ``data: [DONE]`` when ``body.stream``, else one JSON object. Either way the
    unused TPM reservation is refunded and the usage ledger written once the request ends (also
    when its client went away, PF-R5). Raises gate.Refused before any engine work: 429 when a
    limit is used up, 400 ``content_blocked`` (with the categories) when moderation flags the
    input, 503 when the check itself failed (fail closed, PF-M2)."""
    admitted.decision = await gate.rate_limit(
        admitted.caller, prompt_tokens=len(ids), max_tokens=options.max_tokens
    )
    await _input_gate(admitted, checked_text)
    completion_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    await release_db_connection()  # nothing below queries the database
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response = sse_response(
            _chunks(admitted, ids, options, completion_id, created, include_usage, kind, body.model)
        )
    else:
        response = await _complete(admitted, ids, options, completion_id, created, kind, body.model)
    response["X-Pool"] = admitted.route.pool.key
    if admitted.decision is not None:
        for name, value in admitted.decision.headers().items():
            response[name] = value
    return response


async def _complete(admitted, ids, options, completion_id, created, kind, model) -> HttpResponse:
    """A non-streamed completion (see :func:`_respond`). When the output gate flags the text
    the generation stops, and the answer is empty with ``finish_reason`` ``content_filter`` (as
    OpenAI reports filtered output) and a ``moderation`` object saying why."""
    text, finish_reason, tally = [], None, _Tally(prompt=len(ids))
    output_gate = _output_gate(admitted)
    try:
        async with aclosing(
            pool_generate(admitted.route, ids, options, completion_id, tier=admitted.caller.usage_tier)
        ) as deltas:
            async for delta in deltas:
                text.append(delta.text)
                tally.add(delta)
                finish_reason = delta.finish_reason or finish_reason
                if output_gate is not None:
                    output_gate.feed(delta.text)
                    if output_gate.flagged is not None:
                        break  # closing the generator aborts the engine request
        verdict = await output_gate.finish() if output_gate is not None else None
    finally:
        if output_gate is not None:
            output_gate.cancel()
        await asyncio.shield(_account(admitted, tally, finished=finish_reason is not None))
    choice = {"index": 0, "finish_reason": finish_reason or "stop", "logprobs": None}
    content = "".join(text)
    if verdict is not None and verdict.flagged:
        choice["finish_reason"], content = "content_filter", ""
        choice["moderation"] = {"categories": list(verdict.categories), "message": withdrawn_message(verdict.categories)}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": content}
    else:
        choice["text"] = content
    return JsonResponse(
        {
            "id": completion_id,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": tally.usage(),
        }
    )


async def _input_gate(admitted: _Admitted, text: str) -> None:
    """The input moderation gate for a stateless request (nothing is stored). Raises
    gate.Refused 400 ``content_blocked`` with the categories, or 503 when the check failed
    (fail closed unless the organisation chose fail-open), after refunding the reservation."""
    if not settings.CHAT_MODERATION_INPUT or admitted.caller.service:
        return
    verdict = await acheck("input", text, _policy(admitted))
    if not verdict.flagged:
        return
    await gate.settle(admitted.decision, prompt_tokens=0, completion_tokens=0)
    details = {"categories": list(verdict.categories)}
    if "moderation_unavailable" in verdict.categories:
        raise gate.Refused(503, "moderation_unavailable", verdict.message(), {"Retry-After": "30"}, details)
    raise gate.Refused(400, "content_blocked", verdict.message(), details=details)


def _policy(admitted: _Admitted) -> Policy:
    """The caller's moderation policy; the system prompt is the request's own (there is no
    hidden one to leak)."""
    return admitted.caller.moderation or policy_for(None)


def _output_gate(admitted: _Admitted) -> OutputGate | None:
    """The output gate for a stateless request; None while off or for background jobs (the
    service credential summarises users' own text)."""
    if not settings.CHAT_MODERATION_OUTPUT or admitted.caller.service:
        return None
    return OutputGate(_policy(admitted))


@dataclass
class _Tally:
    """Token counts of one request so far (running totals from the engine's deltas)."""

    prompt: int
    cached: int = 0
    completion: int = 0

    def add(self, delta) -> None:
        self.prompt, self.completion = delta.prompt_tokens, delta.completion_tokens
        self.cached = max(self.cached, getattr(delta, "cached_tokens", 0))

    def usage(self) -> dict:
        """OpenAI's ``usage`` object (cached prompt tokens under ``prompt_tokens_details``)."""
        return {
            **_usage(self.prompt, self.completion),
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


async def _account(admitted: _Admitted, tally: _Tally, *, finished: bool) -> None:
    """Refund the unused TPM reservation and write the usage ledger row (no turn: a stateless
    request). Never raises."""
    await gate.settle(admitted.decision, prompt_tokens=tally.prompt, completion_tokens=tally.completion)
    from usage import services as usage_services  # noqa: PLC0415

    try:
        await run_in_db_thread(
            usage_services.usage_record,
            user=admitted.caller.user_id, org=admitted.caller.org_id, turn_id=None,
            conversation_id=None, route_pool=admitted.route.pool, tier=admitted.caller.usage_tier,
            prompt_tokens=tally.prompt, cached_tokens=tally.cached,
            completion_tokens=tally.completion, status="complete" if finished else "cancelled",
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - billing must not fail the answer; logged for the operator
        logger.exception("could not record usage of a completion")


def engine_decode(engine, ids: list[int]) -> str:
    """The text of a token-id prompt, for the input gate (token ids must be checked as what
    they say, or the gate would be trivially bypassed)."""
    tokenizer = engine._require_tokenizer() if hasattr(engine, "_require_tokenizer") else None
    if tokenizer is None:
        return " ".join(map(str, ids))
    return tokenizer.decode(ids, skip_special_tokens=True)


def _split_system(messages: list[dict]) -> tuple[str, list[dict]]:
    """The leading system messages joined (kept whatever is trimmed) and the rest."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    return "\n\n".join(m["content"] for m in messages[:head]), messages[head:]


@api_view("POST")
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """OpenAI-compatible chat completion, streamed (``stream: true``: ``data:`` chunks, then
    ``data: [DONE]``) or not. ``model``: a pool name (GET /v1/models) or the served model's
    name (the tier's default pool). Errors: 400 unknown model, invalid body, max_tokens beyond
    the context, or a newest message that alone does not fit; 403 a model the tier may not
    use; 429 over the rate limits (Retry-After); 503 busy (shed) or the engine down. A history
    that overflows the context by a little is trimmed from the oldest messages (leading system
    messages are kept) and the count is in the ``X-Context-Trimmed`` header."""
    body = parse_json(request, schemas.ChatCompletionCreate)
    admitted = await _admit(request, body.model)
    pool = admitted.route.pool
    requested = body.max_completion_tokens or body.max_tokens
    budget = gate.answer_budget(admitted.caller, pool, requested, explicit=requested is not None)
    system, messages = _split_system([m.model_dump() for m in body.messages])
    if not messages:
        raise ApiError(400, "invalid_request", "'messages' needs at least one non-system message.")
    try:
        fitted = prompt_fit(
            system_prompt=gate.with_preamble(admitted.route, system),
            messages=messages,
            encode_chat=admitted.engine.encode_chat,
            max_model_len=pool.max_context,
            max_tokens=budget,
        )
    except PromptTooLong as exc:
        raise ApiError(400, "context_length_exceeded", f"{exc} (model {pool.name}: {pool.max_context:,} tokens of context)") from None
    options = _options(body, fitted.max_tokens, request.api_user)
    newest = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
    response = await _respond(admitted, fitted.token_ids, options, body, "chat", newest)
    if fitted.dropped_messages:
        response["X-Context-Trimmed"] = str(fitted.dropped_messages)
    return response


@api_view("POST")
async def completions(request: HttpRequest) -> HttpResponse:
    """OpenAI-compatible (legacy) text completion; ``prompt`` is text or token ids, used as-is
    (no chat template). Streams ``data:`` chunks when ``stream`` is true. Errors as for chat
    completions; 400 also for a token id outside the vocabulary."""
    body = parse_json(request, schemas.CompletionCreate)
    admitted = await _admit(request, body.model)
    engine, pool = admitted.engine, admitted.route.pool
    ids = list(body.prompt) if isinstance(body.prompt, list) else engine.encode_text(body.prompt)
    vocab_size = engine.vocab_size() if hasattr(engine, "vocab_size") else None
    if vocab_size is not None and any(not 0 <= token_id < vocab_size for token_id in ids):
        raise ApiError(
            400, "invalid_request",
            f"The prompt has a token id outside the model's vocabulary (0 to {vocab_size - 1}).",
        )  # fmt: skip
    budget = gate.answer_budget(admitted.caller, pool, body.max_tokens, explicit=body.max_tokens is not None)
    room = pool.max_context - len(ids)
    if room < 1:
        raise ApiError(
            400, "context_length_exceeded",
            f"The prompt is {len(ids):,} tokens; the {pool.name} model's context holds {pool.max_context:,}.",
        )  # fmt: skip
    options = _options(body, min(budget, room), request.api_user)
    text = body.prompt if isinstance(body.prompt, str) else engine_decode(engine, ids)
    return await _respond(admitted, ids, options, body, "text", text)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chunk(
    completion_id: str, created: int, delta: dict | None, finish_reason=None, usage=None, kind="chat",
    model: str = "", extra: dict | None = None,
) -> bytes:
    if delta is None:
        choices = []
    elif kind == "chat":
        choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    else:  # a text completion chunk carries the text itself
        choices = [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish_reason, "logprobs": None}]
    payload = {
        "id": completion_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        payload["usage"] = usage
    if extra and choices:
        choices[0].update(extra)
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


async def _chunks(
    admitted: _Admitted, prompt_ids, options, completion_id: str, created: int, include_usage: bool,
    kind: str, model: str,
) -> AsyncIterator[bytes]:
    def chunk(delta, finish_reason=None, usage=None) -> bytes:
        return _chunk(completion_id, created, delta, finish_reason, usage, kind=kind, model=model)

    if kind == "chat":
        yield chunk({"role": "assistant", "content": ""})
    tally = _Tally(prompt=len(prompt_ids))
    finish_reason = None
    output_gate = _output_gate(admitted)
    verdict = None
    try:
        async with aclosing(
            pool_generate(admitted.route, prompt_ids, options, completion_id, tier=admitted.caller.usage_tier)
        ) as deltas:
            async for delta in deltas:
                tally.add(delta)
                finish_reason = delta.finish_reason or finish_reason
                if output_gate is not None and output_gate.flagged is not None:
                    break  # stop at once; closing the generator aborts the engine request
                if delta.text:
                    yield chunk({"content": delta.text})
                    if output_gate is not None:
                        output_gate.feed(delta.text)  # checked beside the stream, after sending
        if output_gate is not None:
            verdict = await output_gate.finish()
    except EngineUnavailable as exc:
        error = {"error": {"type": "unavailable", "message": f"The model failed: {exc}"}}
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
        return
    finally:
        if output_gate is not None:
            output_gate.cancel()
        # Charged once, for what was generated, also when the client went away (PF-R5).
        await asyncio.shield(_account(admitted, tally, finished=finish_reason is not None))
    if verdict is not None and verdict.flagged:
        # OpenAI's streaming protocol cannot take back text already sent: the final chunk says
        # the rest was filtered and why; clients should discard the partial answer.
        yield _chunk(
            completion_id, created, {}, "content_filter", kind=kind, model=model,
            extra={"moderation": {"categories": list(verdict.categories), "retract": True,
                                  "message": withdrawn_message(verdict.categories)}},
        )  # fmt: skip
        yield b"data: [DONE]\n\n"
        return
    yield chunk({}, finish_reason or "stop")
    if include_usage:
        yield chunk(None, usage=tally.usage())
    yield b"data: [DONE]\n\n"
