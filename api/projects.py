"""``/v1/projects``: a caller's projects (issue 30). The files of a project have their own
endpoints (projects/api.py); a conversation is started in a project with ``project_id`` on
``POST /v1/conversations`` (api/views.py).

Permissions as on the pages (projects/selectors.py): 404 for a project the caller may not open,
403 ``permission_denied`` for a workspace member who may open it but not change it.
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse

from api import schemas
from core.errors import ApiError
from core.http import api_view, parse_json
from projects import selectors, services
from projects.models import Project


def project_json(project: Project, *, user) -> dict:
    """A project as ``/v1`` gives it; ``can_edit``: whether ``user`` may change it."""
    return {
        "project_id": str(project.project_id),
        "name": project.name,
        "instructions": project.instructions,
        "region": project.region,
        "organisation_id": project.org_id,
        "owner_id": project.owner_id,
        "can_edit": selectors.project_can_edit(project=project, user=user),
        "created_at": project.created_at.isoformat(),
        "updated_at": project.updated_at.isoformat(),
    }


def _editable(project_id: UUID, user) -> Project:
    try:
        return selectors.project_get_for_editing(project_id=project_id, user=user)
    except PermissionDenied as exc:
        raise ApiError(403, "permission_denied", str(exc)) from None


@api_view("GET", "POST")
async def projects(request: HttpRequest) -> HttpResponse:
    """``POST`` ``{"name", "instructions"?}``: create a project (the caller's workspace's when
    they are in an organisation, like their chats) -> 201 the project. ``GET``: the projects the
    caller may open, most recently changed first -> ``{"projects": [...]}``. 400 for a bad body."""
    user = request.api_user
    if request.method == "POST":
        body = parse_json(request, schemas.ProjectCreate)
        try:
            project = await sync_to_async(services.project_create)(
                owner=user, name=body.name, instructions=body.instructions
            )
        except ValidationError as exc:
            raise ApiError(400, "invalid_request", exc.messages[0]) from None
        return JsonResponse(await sync_to_async(project_json)(project, user=user), status=201)

    def listed() -> list[dict]:
        return [project_json(p, user=user) for p in selectors.project_list(user=user)]

    return JsonResponse({"projects": await sync_to_async(listed)()})


@api_view("GET", "PATCH", "DELETE")
async def project_detail(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """``GET``: the project with its files' states -> ``{..., "files": [{"file_id", "name",
    "kind", "size", "status", "error"}]}``. ``PATCH`` ``{"name"?, "instructions"?}``: change
    them -> 200 the project. ``DELETE``: the project, its files and every chat in it, for good
    -> 204. 404 / 403 (module docstring); 400 for a bad body."""
    user = request.api_user
    if request.method == "GET":

        def shown() -> dict:
            project = selectors.project_get_for_user(project_id=project_id, user=user)
            files = [
                {
                    "file_id": str(f.file_id), "name": f.name, "kind": f.kind, "size": f.size,
                    "status": f.status, "error": f.error,
                }  # fmt: skip
                for f in selectors.project_files(project=project)
            ]
            return {**project_json(project, user=user), "files": files}

        return JsonResponse(await sync_to_async(shown)())
    project = await sync_to_async(_editable)(project_id, user)
    if request.method == "DELETE":
        await sync_to_async(services.project_delete)(project=project)
        return HttpResponse(status=204)
    body = parse_json(request, schemas.ProjectUpdate)

    def update() -> dict:
        if body.name is not None:
            services.project_rename(project=project, name=body.name)
        if body.instructions is not None:
            services.project_instructions_set(project=project, instructions=body.instructions)
        return project_json(project, user=user)

    try:
        return JsonResponse(await sync_to_async(update)())
    except ValidationError as exc:
        raise ApiError(400, "invalid_request", exc.messages[0]) from None
