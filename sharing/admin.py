from django.contrib import admin
from django.utils import timezone

from sharing.models import ShareLink


@admin.register(ShareLink)
class ShareLinkAdmin(admin.ModelAdmin):
    """Share links, read-only; the one change staff can make is to revoke (an action). No
    searches or filters that join users: accounts live in another database than the links."""

    list_display = ("token_prefix", "conversation", "created_by", "through_at", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("=token", "=conversation__conversation_id")
    list_select_related = ("conversation",)
    readonly_fields = [f.name for f in ShareLink._meta.fields]
    actions = ("revoke",)

    @admin.display(description="token")
    def token_prefix(self, link: ShareLink) -> str:
        return f"{link.token[:7]}…"

    @admin.action(description="Revoke the selected links")
    def revoke(self, request, queryset) -> None:
        revoked = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {revoked} link(s).")

    def has_add_permission(self, request) -> bool:
        return False  # made by owners through sharing.services

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # the fields are the service layer's; revoking is the action above
