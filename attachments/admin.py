"""Attachments in the admin: read-only metadata (never the file's text or bytes); deleting one
removes its file from storage too (once committed).

Lists the default region's database (the router's choice without a conversation); with a
database per region, the regional admin helpers in conversations/admin.py can take it over."""

from __future__ import annotations

from django.contrib import admin

from attachments import services
from attachments.models import Attachment


@admin.register(Attachment)
class AttachmentAdmin(admin.ModelAdmin):
    list_display = (
        "name", "kind", "size", "prompt_tokens", "tokens", "conversation", "turn_id", "created_at"
    )
    list_filter = ("kind",)
    search_fields = ("name", "=sha256")
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
