"""Attachments in the admin: read-only metadata (never the file's text or bytes); deleting one
removes its file from storage too (once committed).

One region's database at a time, like conversations (conversations.regional_admin.RegionalAdmin)."""

from __future__ import annotations

from django.contrib import admin

from attachments import services
from attachments.models import Attachment
from conversations.regional_admin import RegionalAdmin, RegionFilter


@admin.register(Attachment)
class AttachmentAdmin(RegionalAdmin):
    list_display = (
        "name", "kind", "size", "prompt_tokens", "tokens", "conversation", "turn_id", "created_at"
    )
    list_filter = (RegionFilter, "kind")
    search_fields = ("name", "sha256")
    id_search_fields = ("attachment_id", "conversation_id")
    list_select_related = ("conversation",)  # same database: a join is fine
    readonly_fields = (
        "attachment_id", "conversation", "turn_id", "name", "kind", "size", "sha256",
        "storage_name", "tokens", "prompt_tokens", "pages", "created_at",
    )  # fmt: skip
    exclude = ("text", "turn")  # the text is the user's content: not shown to staff here
    ordering = ("-created_at",)

    def has_add_permission(self, request) -> bool:
        return False  # uploaded by users through attachments.services

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def delete_model(self, request, obj: Attachment) -> None:
        services.attachments_delete(queryset=Attachment.objects.using(obj._state.db).filter(pk=obj.pk))

    def delete_queryset(self, request, queryset) -> None:
        services.attachments_delete(queryset=queryset)
