"""Plumbing shared by the ``/v1`` views of every app: bearer auth, JSON bodies, the error shape.

Bearer keys are checked by ``settings.CHAT_API_KEY_AUTHENTICATOR`` (a dotted path to a function
``key -> User | None``; accounts.services.api_key_authenticate), so this package imports no
feature app."""

from __future__ import annotations

import codecs
import functools
import json
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError

from django.conf import settings
from django.utils.module_loading import import_string

from core.errors import ApiError, error_response


def _bearer_user(request: HttpRequest):
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "authentication",
            "Send an API key as 'Authorization: Bearer <key>'. Create one at /settings/api-keys/.",
            {"WWW-Authenticate": "Bearer"},
        )
    user = import_string(settings.CHAT_API_KEY_AUTHENTICATOR)(token.strip())
    if user is None:
        raise ApiError(
            401, "authentication", "This API key is not valid or was revoked.",
            {"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )  # fmt: skip
    return user


def api_view(*methods: str) -> Callable:
    """Decorate an async ``/v1`` view: allowed ``methods`` (else 405), bearer auth (else 401,
    the user is passed as ``request.api_user``), and every ApiError (gate.Refused included) / Http404 rendered in the
    ``{"error": {"type", "message"}}`` shape. CSRF does not apply (no cookies are used)."""

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise ApiError(
                        405, "method_not_allowed",
                        f"{request.method} is not allowed here; use {', '.join(methods)}.",
                        {"Allow": ", ".join(methods)},
                    )  # fmt: skip
                request.api_user = await sync_to_async(_bearer_user)(request)
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                # Also the gateway's refusals (gateway/gate.py Refused: 400/403 model, 429 rate
                # limit, 503 shed), with their Retry-After / X-RateLimit-* headers.
                return error_response(exc.status, exc.type, exc.message, exc.headers, exc.details)
            except Http404 as exc:
                message = str(exc) or "Not found."
                return error_response(404, "not_found", message)

        wrapper.api_methods = methods
        return wrapper

    return decorate


def parse_json(request: HttpRequest, schema: type[BaseModel]) -> BaseModel:
    """Validate the request's JSON body against ``schema``.

    A leading UTF-8 byte order mark is ignored (RFC 8259 section 8.1 allows it; some Windows
    tools write one).

    Raises ApiError: 415 unless the Content-Type is ``application/json``; 413 for a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``; 400 for malformed JSON, JSON nested deeper than Python's
    recursion limit, or a body that does not match, including a value of the wrong JSON type
    (the message names each offending field).
    """
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "Send the body as JSON (Content-Type: application/json).")
    try:
        raw = request.body.removeprefix(codecs.BOM_UTF8)
    except RequestDataTooBig:
        raise ApiError(413, "payload_too_large", "The request body is too large.") from None
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_request", f"The body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid_request", "The body's JSON is nested too deeply.") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "The body must be a JSON object.")
    try:
        # Strict: a JSON type that is wrong for the field ("5" or true for an integer, "yes"
        # for a boolean) is an error, not coerced; JSON's own spellings (UUIDs and times as
        # strings, integers for floats) are accepted.
        return schema.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()
        )
        raise ApiError(400, "invalid_request", f"Invalid request body: {problems}") from None


def query_int(request: HttpRequest, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]. Raises ApiError 400 otherwise."""
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "invalid_request", f"'{name}' must be an integer.") from None
    if not low <= value <= high:
        raise ApiError(400, "invalid_request", f"'{name}' must be between {low} and {high}.")
    return value
