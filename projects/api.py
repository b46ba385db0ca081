"""``/v1/projects/{project_id}/files``: a project's files over the API (issue 30).

- ``POST`` (``multipart/form-data``, the file in the field ``file``, one per request): 201 with
  :func:`file_json`, ``status`` ``pending``: the text is read by a worker afterwards; poll
  ``GET`` until ``ready`` (or ``failed``, with ``error`` saying why). 400 (no file, several, an
  empty file), 413 (over ``CHAT_PROJECT_FILE_MAX_BYTES``; ``too_many_files`` when the project
  holds ``CHAT_PROJECT_MAX_FILES``), 415 (not multipart; not text, Markdown, PDF or DOCX by
  content), 429 (the request is counted against the caller's RPM, as a chat request is).
- ``GET``: ``{"files": [file_json, ...]}``, oldest first.
- ``DELETE /v1/projects/{project_id}/files/{file_id}``: 204; the file, its passages and its bytes.

Who: as on the project's page (projects/selectors.py): whoever may open the project lists its
files, whoever may change it adds and deletes them (403 for a member who may only open it);
anyone else gets the same 404 as for a project that does not exist.
The multipart body is parsed on a thread of its own (``thread_sensitive=False``, as imports do),
so a 50 MB body holds neither the event loop nor the thread other views share; the database work
(the project's lookup, before the body is read, and the new row) runs on that shared thread.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError

from core.errors import ApiError
from core.http import api_view
from projects import ingest, selectors, uploads
from projects.models import Project, ProjectFile

FIELD = "file"


def file_json(file: ProjectFile, passages: int | None = None) -> dict:
    """A project file in the ``/v1`` shape: ``file_id``, ``name``, ``kind`` (``text``,
    ``markdown``, ``pdf``, ``docx``: by content), ``size`` (bytes), ``status`` (``pending``,
    ``ready``, ``failed``), ``error`` (why it failed, for a person; "" otherwise), ``pages``
    (PDF, DOCX; null otherwise or unknown), ``chars`` (extracted text), ``passages`` (how many
    it was cut into), ``created_at`` and ``ready_at`` (ISO 8601; null until ready)."""
    return {
        "file_id": str(file.file_id),
        "name": file.name,
        "kind": file.kind,
        "size": file.size,
        "status": file.status,
        "error": file.error,
        "pages": file.pages,
        "chars": file.chars,
        "passages": passages if passages is not None else getattr(file, "passage_count", 0),
        "created_at": file.created_at.isoformat(),
        "ready_at": file.ready_at.isoformat() if file.ready_at else None,
    }


def _project_for(*, project_id: UUID, user, edit: bool) -> Project:
    """The project as the pages see it (projects/selectors.py): anyone who may open it lists its
    files; only who may change it (``edit``) adds or deletes one. Raises Http404 (missing or not
    theirs) or ApiError 403 (a member who may only open it)."""
    if not edit:
        return selectors.project_get_for_user(project_id=project_id, user=user)
    try:
        return selectors.project_get_for_editing(project_id=project_id, user=user)
    except PermissionDenied as exc:
        raise ApiError(403, "permission_denied", str(exc)) from None


def _files(project: Project) -> list[dict]:
    db = ingest.project_db(project)
    rows = ProjectFile.objects.using(db).filter(project=project).annotate(passage_count=Count("passages"))
    return [file_json(f) for f in rows.order_by("created_at", "file_id")]


def _upload_of(request: HttpRequest):
    """The one uploaded file of the multipart body (parsed here: Django spools it to a temporary
    file). Raises ApiError 400 / 413 / 415. Touches no database, so it runs on a thread of its
    own and a 50 MB body holds no thread other views share."""
    if request.content_type != "multipart/form-data":
        raise ApiError(
            415, "unsupported_media_type", f"Send the file as multipart/form-data, in the field '{FIELD}'."
        )
    try:
        uploads = request.FILES.getlist(FIELD)
    except RequestDataTooBig:
        raise ApiError(413, "payload_too_large", "The request's form fields are too large.") from None
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise ApiError(400, "invalid_request", f"The multipart body could not be read: {exc}") from None
    if len(uploads) != 1:
        raise ApiError(
            400, "invalid_request",
            f"Send exactly one file, in the multipart field '{FIELD}' (this request has {len(uploads)}).",
        )  # fmt: skip
    return uploads[0]


def _delete(project_id: UUID, file_id: UUID, user) -> None:
    project = _project_for(project_id=project_id, user=user, edit=True)
    file = ProjectFile.objects.using(ingest.project_db(project)).filter(project=project, pk=file_id).first()
    if file is None:
        raise Http404("No such file in this project.")
    ingest.project_file_delete(file=file)


@api_view("GET", "POST")
async def project_files(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """``GET``: the project's files; ``POST``: add one -> 201 :func:`file_json` (module
    docstring)."""
    user = request.api_user
    if request.method == "GET":
        project = await sync_to_async(_project_for)(project_id=project_id, user=user, edit=False)
        return JsonResponse({"files": await sync_to_async(_files)(project)})
    project = await sync_to_async(_project_for)(project_id=project_id, user=user, edit=True)
    await sync_to_async(uploads.upload_admit)(project=project, user=user)  # RPM, before the body
    upload = await sync_to_async(_upload_of, thread_sensitive=False)(request)
    added = await sync_to_async(uploads.project_file_add)(project=project, user=user, upload=upload)
    return JsonResponse(file_json(added, passages=0), status=201)


@api_view("DELETE")
async def project_file(request: HttpRequest, project_id: UUID, file_id: UUID) -> HttpResponse:
    """``DELETE``: the file, its passages and its bytes -> 204."""
    await sync_to_async(_delete)(project_id, file_id, request.api_user)
    return HttpResponse(status=204)
