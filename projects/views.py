"""Project pages (issue 30): create, the project page (name, instructions, files, its chats and a
composer that starts a chat in it), and the htmx fragments that change it.

Thin: parse, call a selector (permissions: projects/selectors.py) or a service, render. A new
chat in a project is started by the chat's own endpoint (conversations.turn_views.turn_create
with ``project``), so a project's turn takes the one turn pipeline.
"""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from conversations.chat_context import sidebar_context
from gateway.gate import Refused
from projects import selectors, services
from projects.models import ProjectFile

# How often (ms) the file list asks again while a file is being read.
FILES_POLL_MS = 2000


def _is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def _files_context(request: HttpRequest, project, *, error: str = "") -> dict:
    files = list(selectors.project_files(project=project))
    return {
        "project": project,
        "files": files,
        "reading": any(f.status == ProjectFile.Status.PENDING for f in files),
        "can_edit": selectors.project_can_edit(project=project, user=request.user),
        "file_error": error,
        "poll_ms": FILES_POLL_MS,
    }


def _page(request: HttpRequest, project, *, status: int = 200, **extra) -> HttpResponse:
    context = {
        "project": project,
        "conversations": list(selectors.project_conversations(project=project, user=request.user)),
        "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "instructions_max": services.INSTRUCTIONS_MAX_CHARS,
        "current_project_id": project.pk,
        **_files_context(request, project),
        **sidebar_context(request.user, request.COOKIES, current_id=None),
        **extra,
    }
    return render(request, "projects/project.html", context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
def project_new(request: HttpRequest) -> HttpResponse:
    """``GET``: the form naming a new project. ``POST`` (``name``): create it (the user's
    workspace's when they are in an organisation, like their chats: projects/services.py) and
    open it (303). 400 with the form and the reason for a bad name."""
    error = ""
    if request.method == "POST":
        try:
            project = services.project_create(owner=request.user, name=request.POST.get("name", ""))
        except ValidationError as exc:
            error = exc.messages[0]
        else:
            return redirect("project", project_id=project.pk)
    context = {
        "error": error,
        "name": request.POST.get("name", ""),
        "current_project_id": None,
        **sidebar_context(request.user, request.COOKIES, current_id=None),
    }
    return render(request, "projects/new.html", context, status=400 if error else 200)


@require_GET
@login_required
def project_detail(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """The project page. 404 for a project the user may not open."""
    return _page(request, selectors.project_get_for_user(project_id=project_id, user=request.user))


@require_POST
@login_required
def project_rename(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """Rename (``name``) -> the page's name form again (htmx) or the page (303); 400 with the
    reason for a bad name; 403 for a member who may not change it, 404 for others."""
    project = selectors.project_get_for_editing(project_id=project_id, user=request.user)
    try:
        services.project_rename(project=project, name=request.POST.get("name", ""))
    except ValidationError as exc:
        return _fragment(request, "projects/_name.html", {"project": project, "can_edit": True, "name_error": exc.messages[0]}, 400)
    if not _is_htmx(request):
        return redirect("project", project_id=project.pk)
    response = _fragment(request, "projects/_name.html", {"project": project, "can_edit": True, "name_saved": True})
    response["HX-Trigger"] = "projectsChanged"  # the sidebar's list shows the new name
    return response


@require_POST
@login_required
def project_instructions(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """Save the instructions (``instructions``; blank clears them) -> a status line (htmx) or the
    page (303). 400 with the reason; 403 / 404 as :func:`project_rename`."""
    project = selectors.project_get_for_editing(project_id=project_id, user=request.user)
    try:
        services.project_instructions_set(project=project, instructions=request.POST.get("instructions", ""))
    except ValidationError as exc:
        return HttpResponse(exc.messages[0], status=400) if _is_htmx(request) else _page(request, project, status=400, instructions_error=exc.messages[0])
    if not _is_htmx(request):
        return redirect("project", project_id=project.pk)
    return HttpResponse("Saved. Used from the next message in this project's chats.")


def _fragment(request: HttpRequest, template: str, context: dict, status: int = 200) -> HttpResponse:
    return HttpResponse(render_to_string(template, context, request=request), status=status)


@require_GET
@login_required
def project_files(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """The file list (what the page polls while a file is being read). 404 for a project the
    user may not open."""
    project = selectors.project_get_for_user(project_id=project_id, user=request.user)
    return _fragment(request, "projects/_files.html", _files_context(request, project))


@require_POST
@login_required
def project_files_add(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """Add files (multipart ``files``): each through projects/ingest.py ``project_file_add``
    (checked, stored, read in a worker) -> the file list (htmx), with why a file was refused
    (400 when every file was), or the page (303). The request counts against the user's RPM
    first (``upload_admit``: 429 with the list and why). 403 / 404 as :func:`project_rename`."""
    project = selectors.project_get_for_editing(project_id=project_id, user=request.user)
    from projects.uploads import project_file_add, upload_admit  # noqa: PLC0415 - reads files only on upload

    try:
        upload_admit(project=project, user=request.user)  # before the body is read
    except Refused as exc:
        response = _fragment(request, "projects/_files.html", _files_context(request, project, error=exc.message), exc.status)
        for name, value in (exc.headers or {}).items():
            response[name] = value
        return response
    uploads = request.FILES.getlist("files")
    errors, added = [], 0
    for upload in uploads:
        try:
            project_file_add(project=project, user=request.user, upload=upload)
            added += 1
        except Refused as exc:
            errors.append(f"{upload.name}: {exc.message}")
    if not uploads:
        errors.append("Choose a file to add.")
    if not _is_htmx(request) and not errors:
        return redirect("project", project_id=project.pk)
    status = 400 if errors and not added else 200
    return _fragment(request, "projects/_files.html", _files_context(request, project, error=" ".join(errors)), status)


@require_POST
@login_required
def project_file_delete(request: HttpRequest, project_id: UUID, file_id: UUID) -> HttpResponse:
    """Delete one file (its passages; answers that cited it keep their copies) -> the file list
    (htmx) or the page (303). 403 / 404 as :func:`project_rename`; 404 for another project's
    file."""
    project = selectors.project_get_for_editing(project_id=project_id, user=request.user)
    services.project_file_delete(file=selectors.project_file_get(project=project, file_id=file_id))
    if not _is_htmx(request):
        return redirect("project", project_id=project.pk)
    return _fragment(request, "projects/_files.html", _files_context(request, project))


@require_POST
@login_required
def project_delete(request: HttpRequest, project_id: UUID) -> HttpResponse:
    """Delete the project with its chats (every member's) and files -> the new-chat page (303,
    or HX-Redirect for htmx). 403 / 404 as :func:`project_rename`."""
    project = selectors.project_get_for_editing(project_id=project_id, user=request.user)
    services.project_delete(project=project)
    if _is_htmx(request):
        return HttpResponse(status=204, headers={"HX-Redirect": reverse("home")})
    return redirect("home")


@require_GET
@login_required
def sidebar_projects(request: HttpRequest) -> HttpResponse:
    """The sidebar's Projects section (templates/projects/_sidebar.html), refreshed after a
    rename (``projectsChanged``)."""
    context = {"projects": selectors.project_list(user=request.user), "current_project_id": None}
    return _fragment(request, "projects/_sidebar.html", context)
