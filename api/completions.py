"""``POST /v1/chat/completions`` and ``GET /v1/models``, in OpenAI's wire format.

Stateless (no conversation is stored), so the official ``openai`` client works unchanged. The
request is not resumable: when its client disconnects the engine request is aborted at once
(DESIGN.md, the disconnect rule) - ``VllmEngine.generate`` aborts when its consumer is cancelled.
Shapes follow OpenAI's API reference for chat completions and chat completion chunks.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from accounts.services import user_is_service
from api import schemas
from api.errors import ApiError
from api.http import api_view, parse_json
from conversations.sse import release_db_connection, sse_response
from conversations.streaming import max_tokens_for
from inference.engine import EngineUnavailable, GenerationOptions, get_engine
from inference.prompts import PromptTooLong, prompt_fit


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
    """The served models, as OpenAI's ``GET /v1/models`` lists them."""
    return JsonResponse(
        {
            "object": "list",
            "data": [
                {"id": settings.CHAT_MODEL_NAME, "object": "model", "created": 0, "owned_by": "chatsite"}
            ],
        }
    )


async def _served_engine(model: str):
    """The process's engine, started, if ``model`` is the one served. Raises ApiError 404 for
    another model, 503 if the engine cannot start."""
    if model != settings.CHAT_MODEL_NAME:
        raise ApiError(
            404, "model_not_found",
            f"The model {model!r} does not exist; this server serves {settings.CHAT_MODEL_NAME!r}.",
        )  # fmt: skip
    engine = get_engine()
    try:
        await engine.ensure_started()
    except EngineUnavailable as exc:
        raise ApiError(503, "unavailable", f"The model is unavailable: {exc}", {"Retry-After": "30"}) from None
    return engine


async def _respond(engine, ids: list[int], options: GenerationOptions, body, kind: str) -> HttpResponse:
    """Generate for ``ids`` and answer in OpenAI's shape for ``kind`` ("chat" or "text"):
    ``data:`` chunks then ``data: [DONE]`` when ``body.stream``, else one JSON object."""
    completion_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    await release_db_connection()  # nothing below queries the database
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(_chunks(engine, ids, options, completion_id, created, include_usage, kind))
    text, finish_reason, usage = [], None, (len(ids), 0)
    async for delta in engine.generate(ids, options, completion_id):
        text.append(delta.text)
        usage = (delta.prompt_tokens, delta.completion_tokens)
        finish_reason = delta.finish_reason or finish_reason
    choice = {"index": 0, "finish_reason": finish_reason or "stop", "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        choice["text"] = "".join(text)
    return JsonResponse(
        {
            "id": completion_id,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": settings.CHAT_MODEL_NAME,
            "choices": [choice],
            "usage": _usage(*usage),
        }
    )


@api_view("POST")
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """OpenAI-compatible chat completion, streamed (``stream: true``: ``data:`` chunks, then
    ``data: [DONE]``) or not. 404 for an unknown model, 400 for a prompt that does not fit the
    context or an invalid body, 503 if the engine is down."""
    body = parse_json(request, schemas.ChatCompletionCreate)
    engine = await _served_engine(body.model)
    requested = body.max_completion_tokens or body.max_tokens
    try:
        fitted = prompt_fit(
            system_prompt="",
            messages=[m.model_dump() for m in body.messages],
            encode_chat=engine.encode_chat,
            max_model_len=settings.CHAT_MAX_MODEL_LEN,
            max_tokens=max_tokens_for(request.api_user.tier, requested),
        )
    except PromptTooLong as exc:
        raise ApiError(400, "context_length_exceeded", str(exc)) from None
    if fitted.dropped_messages:
        raise ApiError(
            400, "context_length_exceeded",
            "The messages do not fit the model's context with room for an answer; send fewer.",
        )  # fmt: skip
    return await _respond(engine, fitted.token_ids, _options(body, fitted.max_tokens, request.api_user), body, "chat")


@api_view("POST")
async def completions(request: HttpRequest) -> HttpResponse:
    """OpenAI-compatible (legacy) text completion; ``prompt`` is text or token ids, used as-is
    (no chat template). Streams ``data:`` chunks when ``stream`` is true. 404 for an unknown
    model, 400 for a prompt that leaves no room for an answer, 503 if the engine is down."""
    body = parse_json(request, schemas.CompletionCreate)
    engine = await _served_engine(body.model)
    ids = list(body.prompt) if isinstance(body.prompt, list) else engine.encode_text(body.prompt)
    vocab_size = engine.vocab_size() if hasattr(engine, "vocab_size") else None
    if vocab_size is not None and any(not 0 <= token_id < vocab_size for token_id in ids):
        raise ApiError(
            400, "invalid_request",
            f"The prompt has a token id outside the model's vocabulary (0 to {vocab_size - 1}).",
        )  # fmt: skip
    room = settings.CHAT_MAX_MODEL_LEN - len(ids)
    if room < 1:
        raise ApiError(
            400, "context_length_exceeded",
            f"The prompt is {len(ids)} tokens; the context holds {settings.CHAT_MAX_MODEL_LEN}.",
        )  # fmt: skip
    budget = min(max_tokens_for(request.api_user.tier, body.max_tokens), room)
    return await _respond(engine, ids, _options(body, budget, request.api_user), body, "text")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chunk(
    completion_id: str, created: int, delta: dict | None, finish_reason=None, usage=None, kind="chat"
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
        "model": settings.CHAT_MODEL_NAME,
        "choices": choices,
    }
    if usage is not None:
        payload["usage"] = usage
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


async def _chunks(
    engine, prompt_ids, options, completion_id: str, created: int, include_usage: bool, kind="chat"
) -> AsyncIterator[bytes]:
    if kind == "chat":
        yield _chunk(completion_id, created, {"role": "assistant", "content": ""})
    usage = (len(prompt_ids), 0)
    finish_reason = None
    try:
        async for delta in engine.generate(prompt_ids, options, completion_id):
            usage = (delta.prompt_tokens, delta.completion_tokens)
            finish_reason = delta.finish_reason or finish_reason
            if delta.text:
                yield _chunk(completion_id, created, {"content": delta.text}, kind=kind)
    except EngineUnavailable as exc:
        error = {"error": {"type": "unavailable", "message": f"The model failed: {exc}"}}
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
        return
    yield _chunk(completion_id, created, {}, finish_reason or "stop", kind=kind)
    if include_usage:
        yield _chunk(completion_id, created, None, usage=_usage(*usage), kind=kind)
    yield b"data: [DONE]\n\n"
