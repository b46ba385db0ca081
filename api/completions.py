"""``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models``, in OpenAI's
wire format: two protocols over the one turn pipeline. They parse the request, give the
gateway's admission sequence (gateway/admission.py ``admit``: route, shed, budget, prompt,
rate limit, input verdict, policy) a callback that builds the prompt for the chosen pool, and
render what gateway/run.py generates (slot, generate beside the output gate, settle once).

Stateless (no conversation is stored), so the official ``openai`` client works unchanged. The
request is not resumable: when its client disconnects the engine request is aborted at once
(DESIGN.md, the disconnect rule) - closing the pipeline's generator aborts it. Shapes follow
OpenAI's API reference for chat completions and chat completion chunks; ``finish_reason`` keeps
OpenAI's values (``stop``, ``length``, ``content_filter``, and ``tool_calls`` for an answer
that calls functions: api/tools.py checks the tools, writes them into the prompt, constrains
the answer and reads the calls back).

**Forwarded turns.** A gateway without an engine sends each user turn here as a token-id
``/v1/completions`` request under the service credential, with the ``admission`` field
(``{"tier", "priority"}``, api/schemas.py ``ForwardedAdmission``): the request then queues in
this process's admission queue at that priority, paid tiers may take the reserved slots, and no
ledger row is written here (the gateway settles the turn; DESIGN.md, "Production topology").
Only the service credential may send the field (403 otherwise). Service requests without it are
background jobs: the lowest priority (settings.CHAT_BACKGROUND_PRIORITY), no reserved slots.

**Cache salt.** Every engine request carries its tenant's prefix-cache salt (gateway/tenancy.py:
the API key's user, or their organisation when it shares one cache). A service request may
bring the salt its gateway or job derived for the user it acts for (``cache_salt``, vLLM's
field): a forwarded turn, a background job on a user's data, the memory warm-up. Anyone else
sending it is refused (403), as for ``admission``: a client choosing its salt could read
another tenant's cache.
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

from accounts.callers import acaller_for
from api import schemas
from api.tools import ToolCalling, ToolStream, json_schema_check, prompt_messages, tool_calling
from core.db import release_db_connection
from core.errors import ApiError
from core.http import api_view, parse_json
from core.sse import sse_response
from gateway import admission, gate, run
from inference.engine import EngineUnavailable, GenerationOptions
from inference.pools import pool_engine, pool_set
from inference.prompts import prompt_fit
from moderation.gate import withdrawn_message

logger = logging.getLogger(__name__)


def _options(body) -> GenerationOptions:
    """Generation options from an OpenAI-style request ``body``, checked before admission (the
    completion budget and the priority are set once admitted: :func:`_respond`).
    Raises ApiError 400 for an invalid response_format (a json_schema that is not a JSON Schema
    included), more than 4 stop sequences, or an empty one (vLLM's SamplingParams raises on it)."""
    schema = None
    if getattr(body, "response_format", None) is not None:
        if body.response_format.type == "json_schema":
            if body.response_format.json_schema is None:
                raise ApiError(400, "invalid_request", "response_format.json_schema is required.")
            schema = body.response_format.json_schema.schema_
            json_schema_check(schema, "response_format.json_schema.schema")
        elif body.response_format.type == "json_object":
            schema = {"type": "object"}
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4:
        raise ApiError(400, "invalid_request", "At most 4 stop sequences are allowed.")
    if not all(stop):
        raise ApiError(400, "invalid_request", "stop: a stop sequence cannot be empty; leave stop out for none.")
    temperature = settings.CHAT_TEMPERATURE if body.temperature is None else body.temperature
    return GenerationOptions(
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=stop,
        seed=body.seed,
        json_schema=schema,
    )


def _priority(body, caller: gate.Caller) -> int:
    """The engine priority of an admitted request: a forwarded turn's (``body.admission``);
    other requests of the service credential (background jobs) run at the lowest,
    settings.CHAT_BACKGROUND_PRIORITY (DESIGN.md, "How background jobs reach the model"); user
    requests at 0 (the route decides)."""
    if body.admission is not None:
        return body.admission.priority
    return settings.CHAT_BACKGROUND_PRIORITY if caller.service else 0


@api_view("GET")
async def models(request: HttpRequest) -> HttpResponse:
    """The models the caller may use, as OpenAI's ``GET /v1/models`` lists them: each pool the
    caller's tier (or a feature flag) allows, by pool name, then the served model's own name
    (settings.CHAT_MODEL_NAME), which stands for the tier's default pool, then the embedding
    model (settings.CHAT_EMBEDDING_MODEL_NAME). Pools carry their
    version, context and answer ceilings and prices (USD per 1M tokens) as extra fields."""
    caller = await acaller_for(request.api_user)
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
    # The embedding model (POST /v1/embeddings, api/embeddings.py), open to every tier.
    data.append({"id": settings.CHAT_EMBEDDING_MODEL_NAME, "object": "model", "created": 0, "owned_by": "chatsite"})
    return JsonResponse({"object": "list", "data": data})


async def _admit(
    request: HttpRequest, body, build_prompt: admission.PromptBuilder, checked_text: str | None
) -> admission.AdmittedPlan:
    """The gateway's admission sequence (gateway/admission.py ``admit``: route, shed, budget,
    ``build_prompt``, rate limit, input verdict on ``checked_text``, policy) for the API key's
    user and ``body``'s model and budget. A forwarded turn (``body.admission``, service
    credential only) keeps the tier and priority its gateway gave it, and a service request's
    ``body.cache_salt`` the salt its gateway derived. Raises gate.Refused (the refusals of
    ``admit``, 403 for a service-only field sent by anyone else), ApiError 503 if the engine
    cannot start."""
    caller = await acaller_for(request.api_user)
    forwarded = None
    if body.admission is not None:
        forwarded = admission.Forwarded(tier=body.admission.tier, priority=body.admission.priority)
    requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
    return await admission.admit(
        caller=caller, model=body.model, max_tokens=requested, explicit_max_tokens=requested is not None,
        build_prompt=build_prompt, checked_text=checked_text, forwarded=forwarded, cache_salt=body.cache_salt,
    )  # fmt: skip


async def _engine_started(pool) -> object:
    """``pool``'s engine, started (its tokenizer and vocabulary are the model's). Raises
    ApiError 503 with Retry-After if it cannot start."""
    engine = pool_engine(pool)
    try:
        await engine.ensure_started()
    except EngineUnavailable as exc:
        raise ApiError(503, "unavailable", f"The model is unavailable: {exc}", {"Retry-After": "30"}) from None
    return engine


async def _respond(
    plan: admission.AdmittedPlan, options: GenerationOptions, body, kind: str, calling: ToolCalling | None = None
) -> HttpResponse:
    """Answer an admitted request in OpenAI's shape for ``kind`` ("chat" or "text"):
    generate with the output gate beside the stream (its leak check guarding the prompt's
    confidential instructions) and send ``data:`` chunks then ``data: [DONE]`` when
    ``body.stream``, else one JSON object. Either way the answer is settled once when the
    request ends (also when its client went away, PF-R5). ``options``: sampling
    (:func:`_options`), given the admitted completion budget and the priority here.
    ``calling``: the request's function calling (api/tools.py), None for a text completion."""
    admitted, ids = plan.admitted, plan.prompt.token_ids
    options = replace(options, max_tokens=plan.prompt.max_tokens, priority=_priority(body, admitted.caller))
    completion_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    await release_db_connection()  # nothing below queries the database
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response = sse_response(
            _chunks(admitted, ids, options, completion_id, created, include_usage, kind, body.model, calling)
        )
    else:
        response = await _complete(admitted, ids, options, completion_id, created, kind, body.model, calling)
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


async def _complete(admitted, ids, options, completion_id, created, kind, model, calling=None) -> HttpResponse:
    """A non-streamed completion (see :func:`_respond`). When the output gate flags the text
    the generation stops, and the answer is empty with ``finish_reason`` ``content_filter`` (as
    OpenAI reports filtered output) and a ``moderation`` object saying why. With
    ``calling``, the calls the answer makes are the message's ``tool_calls`` and
    ``finish_reason`` is ``tool_calls``."""
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
        if calling is not None and answer.finish_reason != run.MODERATION:
            text, calls = calling.parse(content)
            if calls:
                choice["message"] = {"role": "assistant", "content": text, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
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
    messages are kept) and the count is in the ``X-Context-Trimmed`` header. The pool's preamble
    goes before the caller's system messages; the output gate's leak check guards it."""
    body = parse_json(request, schemas.ChatCompletionCreate)
    calling = tool_calling(body)
    system, messages = _split_system(prompt_messages(body.messages))
    if not messages:
        raise ApiError(400, "invalid_request", "'messages' needs at least one non-system message.")
    options = _options(body)
    if calling.guided_schema() is not None:
        options = replace(options, json_schema=calling.guided_schema())
    newest = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
    # The tools section ends the system message: stable from turn to turn, in the cached prefix.
    tools_section = calling.system_section()

    async def build(route, budget: int) -> admission.Prompt:
        engine = await _engine_started(route.pool)
        fitted = prompt_fit(
            system_prompt="\n\n".join(p for p in (gate.with_preamble(route, system), tools_section) if p),
            messages=messages,
            encode_chat=engine.encode_chat, max_model_len=route.pool.max_context, max_tokens=budget,
        )  # fmt: skip
        # The caller's own system messages are theirs to see again; the pool's preamble is not.
        return admission.Prompt(
            fitted.token_ids, fitted.max_tokens, confidential=route.pool.system_preamble.strip(),
            detail=fitted.dropped_messages,
        )  # fmt: skip

    plan = await _admit(request, body, build, newest)
    response = await _respond(plan, options, body, "chat", calling)
    if plan.prompt.detail:
        response["X-Context-Trimmed"] = str(plan.prompt.detail)
    return response


@api_view("POST")
async def completions(request: HttpRequest) -> HttpResponse:
    """OpenAI-compatible (legacy) text completion; ``prompt`` is text or token ids, used as-is
    (no chat template). Streams ``data:`` chunks when ``stream`` is true. Errors as for chat
    completions; 400 also for a token id outside the vocabulary."""
    body = parse_json(request, schemas.CompletionCreate)
    options = _options(body)

    async def build(route, budget: int) -> admission.Prompt:
        engine = await _engine_started(route.pool)
        ids = list(body.prompt) if isinstance(body.prompt, list) else engine.encode_text(body.prompt)
        vocab_size = engine.vocab_size() if hasattr(engine, "vocab_size") else None
        if vocab_size is not None and any(not 0 <= token_id < vocab_size for token_id in ids):
            raise ApiError(
                400, "invalid_request",
                f"The prompt has a token id outside the model's vocabulary (0 to {vocab_size - 1}).",
            )  # fmt: skip
        room = route.pool.max_context - len(ids)
        if room < 1:
            raise gate.Refused(
                400, "context_length_exceeded",
                f"The prompt is {len(ids):,} tokens; the {route.pool.name} model's context holds "
                f"{route.pool.max_context:,}.",
            )  # fmt: skip
        # Token ids are checked as what they say, or the input gate would be trivially bypassed.
        text = None if isinstance(body.prompt, str) else engine_decode(engine, ids)
        return admission.Prompt(ids, min(budget, room), checked_text=text)

    plan = await _admit(request, body, build, body.prompt if isinstance(body.prompt, str) else None)
    return await _respond(plan, options, body, "text")


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
    kind: str, model: str, calling: ToolCalling | None = None,
) -> AsyncIterator[bytes]:
    def chunk(delta, finish_reason=None, usage=None, extra=None) -> bytes:
        return _chunk(completion_id, created, delta, finish_reason, usage, kind=kind, model=model, extra=extra)

    if kind == "chat":
        yield chunk({"role": "assistant", "content": ""})
    stream = ToolStream(calling) if calling is not None and calling.mode != "none" else None
    answer = run.Answer(run.Tally(prompt_tokens=len(prompt_ids)))
    try:
        async with contextlib.aclosing(
            run.generate(admitted, prompt_ids, options, completion_id, answer, output_gate=run.output_gate_for(admitted))
        ) as texts:
            async for text in texts:
                for delta in stream.feed(text) if stream is not None else [{"content": text}]:
                    yield chunk(delta)
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
    finish = _openai_finish(answer)
    if stream is not None:
        for delta in stream.close():
            yield chunk(delta)
        if stream.calls:
            finish = "tool_calls"
    yield chunk({}, finish)
    if include_usage:
        yield chunk(None, usage=_usage_of(answer.tally))
    yield b"data: [DONE]\n\n"
