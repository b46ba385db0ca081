"""Projects in the admin (issue 30): read-mostly, one region's database at a time, like
conversations (conversations.admin.RegionalAdmin: the region filter, ids searched exactly,
owners by username or email).

Staff see a project's name, owner, workspace and region and its files' names, kinds, sizes and
states (why a file failed, for support), never the instructions' or files' text nor the
passages: those are the owner's content. Nothing is added or changed here (projects change
through their pages and /v1); deleting goes through the services, so a project's chats,
passages and stored bytes go with it (projects/services.py ``projects_delete``,
projects/ingest.py ``project_file_delete``).
"""

from __future__ import annotations

from django.contrib import admin

from conversations.admin import RegionalAdmin, RegionFilter
from projects import ingest, services
from projects.models import Project, ProjectFile


class _ReadOnly(RegionalAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Project)
class ProjectAdmin(_ReadOnly):
    region_path = "region"
    list_display = ("name", "owner", "org", "region", "created_at", "updated_at")
    list_filter = (RegionFilter,)
    search_fields = ("name",)
    user_fields = ("owner",)
    id_search_fields = ("project_id",)
    list_prefetch_related = ("owner", "org")  # the global database: never a join
    readonly_fields = ("project_id", "name", "owner", "org", "region", "created_at", "updated_at")
    exclude = ("instructions",)  # the owner's content
    ordering = ("-updated_at",)

    def delete_model(self, request, obj: Project) -> None:
        services.projects_delete(db=obj._state.db, project_ids=[obj.pk])

    def delete_queryset(self, request, queryset) -> None:
        services.projects_delete(db=queryset.db, project_ids=list(queryset.values_list("pk", flat=True)))


@admin.register(ProjectFile)
class ProjectFileAdmin(_ReadOnly):
    region_path = "project__region"
    list_display = ("name", "kind", "size", "status", "pages", "chars", "project", "created_at", "ready_at")
    list_filter = (RegionFilter, "status", "kind")
    search_fields = ("name", "sha256")
    user_fields = ("uploaded_by",)
    id_search_fields = ("file_id", "project_id")
    list_select_related = ("project",)  # same database: a join is fine
    list_prefetch_related = ("uploaded_by",)
    readonly_fields = (
        "file_id", "project", "uploaded_by", "name", "kind", "size", "sha256", "storage_name", "status",
        "error", "pages", "chars", "created_at", "ready_at",
    )  # fmt: skip
    ordering = ("-created_at",)

    def delete_model(self, request, obj: ProjectFile) -> None:
        ingest.project_file_delete(file=obj)

    def delete_queryset(self, request, queryset) -> None:
        for file in queryset:
            ingest.project_file_delete(file=file)
