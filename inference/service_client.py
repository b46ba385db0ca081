"""The model for background jobs: an OpenAI-compatible ``/v1/chat/completions``, as a service.

DESIGN.md, "How background jobs reach the model": a Celery worker never starts an engine of its
own beside the server's. Jobs that need the model (summaries now, memory extraction later)
call the server's own authenticated OpenAI-compatible endpoint on loopback
(``settings.CHAT_INTERNAL_API_URL``; for a remote pool, its URL), with the service credential
(the key ``settings.CHAT_SERVICE_API_KEY_PROVIDER`` names: accounts.services.service_api_key,
resolved at use so this layer imports no feature app), so they draw on no person's limits.

Tenancy: a job on a user's data sends that user's prefix-cache salt (``cache_salt``; the caller
derives it, gateway/tenancy.py), so what it caches serves that user alone, and the memory
warm-up (conversations/prefix_warm.py) warms the very cache the user's turns read.

Priority: the serving side runs every service-credential request that carries no gateway
``admission`` field at ``settings.CHAT_BACKGROUND_PRIORITY``, the lowest (api/completions.py),
and never lets it take the slots reserved for paid turns (inference/admission.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
from django.conf import settings

from django.utils.module_loading import import_string


class ServiceCallError(RuntimeError):
    """The model endpoint could not be reached or did not answer with a completion."""


def http_client() -> httpx.Client:
    """An HTTP client for the model endpoint, authenticated as the service user."""
    return httpx.Client(
        base_url=settings.CHAT_INTERNAL_API_URL.rstrip("/"),
        timeout=settings.CHAT_INTERNAL_API_TIMEOUT_S,
        headers={"Authorization": f"Bearer {import_string(settings.CHAT_SERVICE_API_KEY_PROVIDER)()}"},
    )


def chat_complete(
    messages: Sequence[dict[str, str]],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    model: str | None = None,
    response_format: dict | None = None,
    cache_salt: str | None = None,
) -> str:
    """One non-streamed chat completion of ``messages`` ([{role, content}]) by ``model`` (a pool
    name; default the served model, ``settings.CHAT_MODEL_NAME``: the service tier's default
    pool); returns the answer's text (may be empty).

    ``max_tokens`` caps the completion (tokens); ``temperature`` 0 is greedy (repeatable jobs);
    ``response_format``: OpenAI's, e.g. ``{"type": "json_schema", "json_schema": {...}}`` (vLLM
    structured output: the answer matches the schema); ``cache_salt``: the prefix-cache salt of
    the user whose data the job works on (gateway/tenancy.py; None: the service's own), which
    the endpoint takes from the service credential only.
    Waits up to ``settings.CHAT_INTERNAL_API_TIMEOUT_S`` seconds (jobs queue behind chats).
    Raises ServiceCallError on a transport error or any answer but 200 with a completion (the
    message carries the endpoint's error text).
    """
    body = {
        "model": model or settings.CHAT_MODEL_NAME,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": False,
    }
    if response_format is not None:
        body["response_format"] = response_format
    if cache_salt:
        body["cache_salt"] = cache_salt
    try:
        with http_client() as client:
            response = client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise ServiceCallError(
            f"the model endpoint {settings.CHAT_INTERNAL_API_URL} is unreachable: {exc}"
        ) from exc
    if response.status_code != 200:
        raise ServiceCallError(
            f"the model endpoint answered {response.status_code}: {response.text[:500]}"
        )
    try:
        return response.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ServiceCallError(f"the model endpoint sent no completion: {response.text[:500]}") from exc


def prompt_complete(
    prompt_ids: Sequence[int], *, max_tokens: int, model: str | None = None, cache_salt: str | None = None
) -> dict:
    """One non-streamed text completion of the token ids ``prompt_ids`` (``/v1/completions``,
    used as-is: no chat template) by ``model`` (a pool name; default ``settings.CHAT_MODEL_NAME``),
    greedy, at most ``max_tokens`` tokens; returns the answer's OpenAI ``usage`` object
    (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``).

    For jobs that want the engine's state rather than text: a ``max_tokens=1`` request puts
    the prompt's KV blocks into the prefix cache (conversations/prefix_warm.py) under ``cache_salt`` (the
    user's, so their own turns find them; None: the service's). Background priority and no
    rate limits, as for :func:`chat_complete`. Raises ServiceCallError as it does."""
    body = {
        "model": model or settings.CHAT_MODEL_NAME,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": False,
    }
    if cache_salt:
        body["cache_salt"] = cache_salt
    try:
        with http_client() as client:
            response = client.post("/v1/completions", json=body)
    except httpx.HTTPError as exc:
        raise ServiceCallError(
            f"the model endpoint {settings.CHAT_INTERNAL_API_URL} is unreachable: {exc}"
        ) from exc
    if response.status_code != 200:
        raise ServiceCallError(
            f"the model endpoint answered {response.status_code}: {response.text[:500]}"
        )
    try:
        return dict(response.json()["usage"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ServiceCallError(f"the model endpoint sent no usage: {response.text[:500]}") from exc
