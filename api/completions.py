"""``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models``, in OpenAI's
wire format: two protocols over the one turn pipeline (gateway/: route, shed, budget, prompt,
rate limit, input moderation, slot, generate beside the output gate, settle once).

Stateless (no conversation is stored), so the official ``openai`` client works unchanged. The
request is not resumable: when its client disconnects the engine request is aborted at once
(DESIGN.md, the disconnect rule) - closing the pipeline's generator aborts it. Shapes follow
OpenAI's API reference for chat completions and chat completion chunks; ``finish_reason`` keeps
OpenAI's values (``stop``, ``length``, ``content_filter``).

**Forwarded turns.** A gateway without an engine sends each user turn here as a token-id
``/v1/completions`` request under the service credential, with the ``admission`` field
(``{"tier", "priority"}``, api/schemas.py ``ForwardedAdmission``): the request then queues in
this process's admission queue at that priority, paid tiers may take the reserved slots, and no
ledger row is written here (the gateway settles the turn; DESIGN.md, "Production topology").
Only the service credential may send the field (403 otherwise). Service requests without it are
background jobs: the lowest priority (settings.CHAT_BACKGROUND_PRIORITY), no reserved slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from api import schemas
from core.db import release_db_connection
from core.errors import ApiError
from core.http import api_view, parse_json
from core.sse import sse_response
from gateway import gate, run
from inference.engine import EngineUnavailable, GenerationOptions
from inference.pools import pool_engine, pool_set
from inference.prompts import PromptTooLong, prompt_fit
from moderation.gate import withdrawn_message

logger = logging.getLogger(__name__)


def _options(body, budget: int, caller: gate.Caller) -> GenerationOptions:
    """Generation options from an OpenAI-style request ``body`` with ``budget`` completion
    tokens. Priority: a forwarded turn's (``body.admission``); other requests of the service
    credential (background jobs) run at the lowest, settings.CHAT_BACKGROUND_PRIORITY (DESIGN.md,
    "How background jobs reach the model"); user requests at 0 (the route decides).
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
    if body.admission is not None:
        priority = body.admission.priority
    else:
        priority = settings.CHAT_BACKGROUND_PRIORITY if caller.service else 0
    return GenerationOptions(
        max_tokens=budget,
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=stop,
        seed=body.seed,
        json_schema=schema,
        priority=priority,
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


async def _admit(request: HttpRequest, body) -> run.Admitted:
    """The pipeline's first steps for a stateless request: the caller, the route for
    ``body.model``, shedding under load (never for the service credential), the started engine.
    A forwarded turn (``body.admission``) keeps the tier and priority its gateway gave it.
    Raises ApiError 403 when anyone but the service credential sends ``admission``,
    gate.Refused (404 unknown model, 403 not for this tier, 503 busy), ApiError 503 if the
    engine cannot start."""
    caller = await gate.acaller_for(request.api_user)
    if body.admission is not None and not caller.service:
        raise ApiError(
            403, "permission_denied",
            "Only the service credential may set 'admission' (it carries a gateway's turn to "
            "its engine process); leave it out.",
        )  # fmt: skip
    route = await gate.shed_for(caller, gate.route_for(caller, body.model))
    admitted = run.Admitted(caller=caller, route=route, policy=run.policy_of(caller))
    if body.admission is not None:
        admitted = run.Admitted(
            caller=caller, route=replace(route, priority=body.admission.priority),
            policy=admitted.policy, tier=body.admission.tier, forwarded=True,
        )  # fmt: skip
    try:
        await pool_engine(route.pool).ensure_started()
    except EngineUnavailable as exc:
        raise ApiError(503, "unavailable", f"The model is unavailable: {exc}", {"Retry-After": "30"}) from None
    return admitted


async def _respond(
    admitted: run.Admitted, ids: list[int], options: GenerationOptions, body, kind: str, checked_text: str
) -> HttpResponse:
    """The pipeline from the rate limit on, for the prompt ``ids``: the input gate starts on
    ``checked_text`` (the newest user message, or the prompt) beside the rate limit (prompt +
    budget) and is acted on after it; then generate with the output gate beside the stream and
    answer in OpenAI's shape for ``kind`` ("chat" or "text"): ``data:`` chunks then ``data:
    [DONE]`` when ``body.stream``, else one JSON object. Either way the answer is settled once
    when the request ends (also when its client went away, PF-R5). Raises gate.Refused before
    any engine work: 429 when a limit is used up, 400 ``content_blocked`` (with the categories)
    when moderation flags the input, 503 when the check itself failed (fail closed, PF-M2)."""
    check = run.input_check_start(admitted.caller, checked_text, admitted.policy)
    try:
        admitted.decision = await gate.rate_limit(
            admitted.caller, prompt_tokens=len(ids), max_tokens=options.max_tokens
        )
    except BaseException:
        await run.input_check_discard(check)
        raise
    verdict = await run.input_verdict(check, admitted)
    if verdict is not None and verdict.flagged:
        await gate.settle(admitted.decision, prompt_tokens=0, completion_tokens=0)
        raise gate.Refused(
            400, "content_blocked", verdict.message(), details={"categories": list(verdict.categories)}
        )
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


def _openai_finish(answer: run.Answer) -> str:
    """OpenAI's finish_reason for the pipeline's (``content_filter`` for a withdrawn answer)."""
    return "content_filter" if answer.finish_reason == run.MODERATION else (answer.finish_reason or "stop")


def _moderation_note(answer: run.Answer) -> dict:
    categories = list(answer.flagged.categories) if answer.flagged is not None else []
    return {"categories": categories, "message": withdrawn_message(categories)}


async def _settle(admitted: run.Admitted, answer: run.Answer) -> None:
    await run.settle(admitted, answer.tally, status=answer.status)


async def _complete(admitted, ids, options, completion_id, created, kind, model) -> HttpResponse:
    """A non-streamed completion (see :func:`_respond`). When the output gate flags the text
    the generation stops, and the answer is empty with ``finish_reason`` ``content_filter`` (as
    OpenAI reports filtered output) and a ``moderation`` object saying why."""
    answer = run.Answer(run.Tally(prompt_tokens=len(ids)))
    try:
        async with contextlib.aclosing(
            run.generate(admitted, ids, options, completion_id, answer, output_gate=run.output_gate_for(admitted))
        ) as texts:
            async for _ in texts:
                pass
    finally:
        await asyncio.shield(_settle(admitted, answer))
    choice = {"index": 0, "finish_reason": _openai_finish(answer), "logprobs": None}
    content = answer.text
    if answer.finish_reason == run.MODERATION:
        content = ""
        choice["moderation"] = _moderation_note(answer)
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
            "usage": _usage_of(answer.tally),
        }
    )


def _usage_of(tally: run.Tally) -> dict:
    """OpenAI's ``usage`` object (cached prompt tokens under ``prompt_tokens_details``)."""
    return {
        **_usage(tally.prompt_tokens, tally.completion_tokens),
        "prompt_tokens_details": {"cached_tokens": tally.cached_tokens},
    }


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
    admitted = await _admit(request, body)
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
            encode_chat=pool_engine(pool).encode_chat,
            max_model_len=pool.max_context,
            max_tokens=budget,
        )
    except PromptTooLong as exc:
        raise ApiError(400, "context_length_exceeded", f"{exc} (model {pool.name}: {pool.max_context:,} tokens of context)") from None
    options = _options(body, fitted.max_tokens, admitted.caller)
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
    admitted = await _admit(request, body)
    pool = admitted.route.pool
    engine = pool_engine(pool)
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
    options = _options(body, min(budget, room), admitted.caller)
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
    admitted: run.Admitted, prompt_ids, options, completion_id: str, created: int, include_usage: bool,
    kind: str, model: str,
) -> AsyncIterator[bytes]:
    def chunk(delta, finish_reason=None, usage=None, extra=None) -> bytes:
        return _chunk(completion_id, created, delta, finish_reason, usage, kind=kind, model=model, extra=extra)

    if kind == "chat":
        yield chunk({"role": "assistant", "content": ""})
    answer = run.Answer(run.Tally(prompt_tokens=len(prompt_ids)))
    try:
        async with contextlib.aclosing(
            run.generate(admitted, prompt_ids, options, completion_id, answer, output_gate=run.output_gate_for(admitted))
        ) as texts:
            async for text in texts:
                yield chunk({"content": text})
    except EngineUnavailable as exc:
        error = {"error": {"type": "unavailable", "message": f"The model failed: {exc}"}}
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
        return
    finally:
        # Settled once, for what was generated, also when the client went away (PF-R5).
        await asyncio.shield(_settle(admitted, answer))
    if answer.finish_reason == run.MODERATION:
        # OpenAI's streaming protocol cannot take back text already sent: the final chunk says
        # the rest was filtered and why; clients should discard the partial answer.
        yield chunk({}, "content_filter", extra={"moderation": {**_moderation_note(answer), "retract": True}})
        yield b"data: [DONE]\n\n"
        return
    yield chunk({}, _openai_finish(answer))
    if include_usage:
        yield chunk(None, usage=_usage_of(answer.tally))
    yield b"data: [DONE]\n\n"
