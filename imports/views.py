"""Importing a chat export (imports/services.py) from the "Your data" page and the API.

- ``POST /settings/import`` (the page's form, multipart field ``file``): imports, then back to
  the page with a message saying what was done, or what is wrong with the file.
- ``POST /v1/imports`` (API key; multipart field ``file``): 201 ``{"created": [ids],
  "already", "messages", "blocked", "skipped", "stand_ins", "added_calls",
  "repeated"}`` (imports/services.py
  ``ImportResult``); 400 naming the problem, 413 for a file over the limit, 415 for a body that
  is not multipart.

The file is read and written on a worker thread of its own (not the thread Django runs
synchronous views and ORM calls of async views on), so a large import holds no one else's page;
its database connections go back to the pool when it ends (core/db.py ``run_in_db_thread``).
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.shortcuts import redirect
from django.urls import reverse

from core.db import run_in_db_thread
from core.errors import ApiError
from core.http import api_view
from imports.own_format import STAND_IN_FUNCTION
from imports.services import ImportRefused, ImportResult, chats_import, file_read

FIELD = "file"


def _file_bytes(request: HttpRequest) -> bytes:
    """The one uploaded file's bytes. Raises ImportRefused (415 not multipart, 400 no file or
    several, 413 over the size limit)."""
    if request.content_type != "multipart/form-data":
        raise ImportRefused(f"Send the file as multipart/form-data, in the field '{FIELD}'.", 415)
    try:
        files = request.FILES.getlist(FIELD)
    except RequestDataTooBig:
        raise ImportRefused("The request's form fields are too large.", 413) from None
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise ImportRefused(f"The upload could not be read: {exc}") from None
    if len(files) != 1:
        raise ImportRefused("Choose one export file to import." if not files else "Import one file at a time.")
    upload = files[0]
    from django.conf import settings  # noqa: PLC0415

    if upload.size > settings.CHAT_IMPORT_MAX_BYTES:
        raise ImportRefused(
            f"The file is {upload.size:,} bytes; at most {settings.CHAT_IMPORT_MAX_BYTES:,} can be imported at once.", 413
        )
    return upload.read()


def _import(request: HttpRequest, user) -> ImportResult:
    return chats_import(owner=user, chats=file_read(_file_bytes(request)))


def _summary(result: ImportResult) -> str:
    """What an import did, for a person."""
    parts = [f"Imported {len(result.created)} conversation{'s' if len(result.created) != 1 else ''}"
             f" ({result.messages} message{'s' if result.messages != 1 else ''})."]  # fmt: skip
    if result.already:
        parts.append(f"{result.already} {'was' if result.already == 1 else 'were'} already here from an earlier import and left as they are.")
    if result.repeated:
        many = result.repeated != 1
        parts.append(f"{result.repeated} conversation{'s' if many else ''} {'were' if many else 'was'} in the file more than once and imported once.")
    if result.blocked:
        parts.append(f"{result.blocked} of your messages did not pass the safety check: they are kept, marked as stopped, and never sent to the model.")
    if result.stand_ins:
        many = result.stand_ins != 1
        parts.append(
            f"{result.stand_ins} answer{'s' if many else ''} that called tools {'were' if many else 'was'} missing "
            f"from the file: {'their' if many else 'its'} tool results are kept, under calls named '{STAND_IN_FUNCTION}'."
        )
    if result.added_calls:
        many = result.added_calls != 1
        parts.append(
            f"{result.added_calls} tool result{'s' if many else ''} named a call {'their answers' if many else 'its answer'} "
            f"did not list: {'they are' if many else 'it is'} kept, under calls named '{STAND_IN_FUNCTION}'."
        )
    if result.skipped:
        parts.append(f"{result.skipped} answer{'s' if result.skipped != 1 else ''} without a question before {'them' if result.skipped != 1 else 'it'} could not be placed and {'were' if result.skipped != 1 else 'was'} left out.")
    return " ".join(parts)


async def import_page(request: HttpRequest) -> HttpResponse:
    """``POST /settings/import``: the "Your data" page's import form (module docstring)."""
    user = await request.auser()
    if not user.is_authenticated:
        return redirect(f"{reverse('login')}?next={reverse('privacy-data')}")
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        result = await run_in_db_thread(_import, request=request, user=user)
    except ImportRefused as exc:
        messages.error(request, f"Nothing was imported: {exc}")
    else:
        messages.success(request, _summary(result))
    return redirect(f"{reverse('privacy-data')}#import")


@api_view("POST")
async def import_api(request: HttpRequest) -> HttpResponse:
    """``POST /v1/imports`` (module docstring)."""
    try:
        result = await run_in_db_thread(_import, request=request, user=request.api_user)
    except ImportRefused as exc:
        code = {413: "payload_too_large", 415: "unsupported_media_type"}.get(exc.status, "invalid_request")
        raise ApiError(exc.status, code, str(exc)) from None
    return JsonResponse(
        {
            "created": [str(c) for c in result.created], "already": result.already,
            "messages": result.messages, "blocked": result.blocked, "skipped": result.skipped,
            "stand_ins": result.stand_ins, "added_calls": result.added_calls,
            "repeated": result.repeated,
        },
        status=201,
    )  # fmt: skip
