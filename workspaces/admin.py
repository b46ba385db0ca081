"""Admin for invitations: listed, filtered and withdrawn; never created here (the secret is
shown only to whoever creates an invitation, on the workspace's invitations page)."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from workspaces.models import Invitation


class InvitationStateFilter(admin.SimpleListFilter):
    """Pending, accepted, withdrawn or expired."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [
            ("pending", "pending"),
            ("accepted", "accepted"),
            ("revoked", "withdrawn"),
            ("expired", "expired"),
        ]

    def queryset(self, request, queryset):
        now = timezone.now()
        open_ = {"accepted_at__isnull": True, "revoked_at__isnull": True}
        if self.value() == "pending":
            return queryset.filter(**open_, expires_at__gt=now)
        if self.value() == "accepted":
            return queryset.filter(accepted_at__isnull=False)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if self.value() == "expired":
            return queryset.filter(**open_, expires_at__lte=now)
        return queryset


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = (
        "organisation", "kind", "email", "role", "created_by", "created_at", "expires_at",
        "state", "accepted_by",
    )  # fmt: skip
    list_filter = (InvitationStateFilter, "role")
    search_fields = ("organisation__name", "organisation__slug", "email", "created_by__username")
    list_select_related = ("organisation", "created_by", "accepted_by")
    readonly_fields = (
        "organisation", "email", "role", "token_hash", "created_by", "created_at", "expires_at",
        "accepted_at", "accepted_by",
    )  # fmt: skip
    fields = (*readonly_fields, "revoked_at")
    actions = ("withdraw",)

    def has_add_permission(self, request) -> bool:
        return False  # the link's secret would be lost: invite from the workspace page

    @admin.display(description="state")
    def state(self, invitation: Invitation) -> str:
        if invitation.accepted_at is not None:
            return "accepted"
        if invitation.revoked_at is not None:
            return "withdrawn"
        if invitation.expires_at <= timezone.now():
            return "expired"
        return "pending"

    @admin.action(description="Withdraw the selected invitations")
    def withdraw(self, request, queryset) -> None:
        count = queryset.filter(accepted_at__isnull=True, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        self.message_user(request, f"{count} invitation(s) withdrawn.")
