"""Share links in the admin: read-only (owners make and revoke them through their pages), one
region's database at a time (conversations.regional_admin.RegionalAdmin), with a revoke action."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from conversations.regional_admin import RegionalAdmin, RegionFilter
from sharing.models import ShareLink


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return (("working", "Working"), ("revoked", "Revoked"))

    def queryset(self, request, queryset):
        if self.value() == "working":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(ShareLink)
class ShareLinkAdmin(RegionalAdmin):
    """Share links, read-only; staff may revoke them (an action), e.g. a link to abusive
    content reported by someone who received it."""

    list_display = (
        "token_start", "title", "conversation", "created_by", "through_at", "created_at",
        "revoked_at",
    )  # fmt: skip
    list_filter = (RegionFilter, StateFilter)
    search_fields = ("token", "title")
    user_fields = ("created_by",)
    id_search_fields = ("link_id", "conversation_id")
    search_help_text = (
        "A token, words of the title, the creator's username or email, or a link or "
        "conversation id."
    )
    ordering = ("-created_at", "-link_id")
    list_select_related = ("conversation",)  # same database
    list_prefetch_related = ("created_by",)  # accounts: default's database
    readonly_fields = [f.name for f in ShareLink._meta.fields]
    actions = ("revoke",)

    @admin.display(description="token")
    def token_start(self, link: ShareLink) -> str:
        return f"{link.token[:7]}…"

    @admin.action(description="Revoke the selected links")
    def revoke(self, request, queryset) -> None:
        revoked = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {revoked} link(s); they answer 404 from now on.")

    def has_add_permission(self, request) -> bool:
        return False  # made by owners through sharing.services

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # the fields are the service layer's; revoking is the action above
