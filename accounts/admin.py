"""Users, organisations, memberships and API keys in the admin (all in the global ``default``
database).

API keys show only what is public about them (name, prefix, owner, dates): the secret is never
stored (only its SHA-256, accounts/services.py) and the hash is not shown either; keys are not
created or edited here, only revoked (an action).

A change of a training opt-out made here (``User.training_opt_out``,
``Organisation.not_for_training``) is audited with its old and new value, as the pages do
(accounts/services.py ``training_opt_out_record``), beside the admin's own ``admin.change``.

The apps above this one extend two of these admins where a workflow of theirs applies (each
unregisters the class here and registers its subclass): privacy/admin.py deletes a user with the
account's deletion service, and moderation/admin.py gives the organisation admin the form that
checks its moderation fields.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts import services
from accounts.models import ApiKey, Membership, Organisation, User


def _training_opt_out_before(model, obj) -> bool | None:
    """The stored ``model`` row's training opt-out (None for a new row)."""
    field = "not_for_training" if model is Organisation else "training_opt_out"
    if obj.pk is None:
        return None
    return model.objects.filter(pk=obj.pk).values_list(field, flat=True).first()


class TrainingOptOutAuditMixin:
    """``save_model`` that audits a change of the training opt-out (none for a new row)."""

    def save_model(self, request, obj, form, change) -> None:
        before = _training_opt_out_before(self.model, obj) if change else None
        super().save_model(request, obj, form, change)
        if before is not None:
            after = obj.not_for_training if self.model is Organisation else obj.training_opt_out
            services.training_opt_out_record(actor=request.user, subject=obj, old=before, new=after)


class UserMembershipInline(admin.TabularInline):
    model = Membership
    fk_name = "user"
    extra = 0
    autocomplete_fields = ("organisation",)
    readonly_fields = ("joined_at",)
    verbose_name_plural = "organisations"


class ApiKeyInline(admin.TabularInline):
    """The user's keys, public parts only; revoke them from the API key list."""

    model = ApiKey
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(User)
class UserAdmin(TrainingOptOutAuditMixin, BaseUserAdmin):
    list_display = ("username", "email", "tier", "region", "is_staff", "is_active", "date_joined")
    list_filter = ("tier", "region", "organisations", "is_staff", "is_superuser", "is_active")
    search_fields = ("username", "email", "first_name", "last_name")
    date_hierarchy = "date_joined"
    fieldsets = (
        *BaseUserAdmin.fieldsets,
        (
            "Service",
            {
                "fields": (
                    "tier",
                    "region",
                    "feature_flags",
                    "memory_enabled",
                    "training_opt_out",
                    "verified_email",
                )
            },
        ),
    )
    # Set only by a proven flow (a password reset link followed, an OIDC provider's word):
    # editing it here would let an account be joined by OIDC without proof.
    readonly_fields = ("verified_email", "last_login", "date_joined")
    inlines = (UserMembershipInline, ApiKeyInline)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)
    readonly_fields = ("joined_at",)


@admin.register(Organisation)
class OrganisationAdmin(TrainingOptOutAuditMixin, admin.ModelAdmin):
    list_display = (
        "name", "slug", "tier", "region", "zero_retention", "moderation_fail_open",
        "share_prefix_cache", "blocked_term_count", "threshold_overrides", "created_at",
    )  # fmt: skip
    list_filter = ("tier", "region", "zero_retention", "moderation_fail_open", "share_prefix_cache")
    search_fields = ("name", "slug")
    date_hierarchy = "created_at"
    prepopulated_fields = {"slug": ("name",)}
    inlines = (MembershipInline,)

    @admin.display(description="blocked terms")
    def blocked_term_count(self, org: Organisation) -> int:
        return len(org.blocked_terms or [])

    @admin.display(description="moderation thresholds")
    def threshold_overrides(self, org: Organisation) -> str:
        """The organisation's own thresholds ("offensive 0.9, ..."), or "defaults"."""
        thresholds = org.moderation_thresholds or {}
        return ", ".join(f"{k} {v}" for k, v in sorted(thresholds.items())) or "defaults"


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "organisation", "role", "joined_at")
    list_filter = ("role", "organisation__tier", "organisation")
    search_fields = ("user__username", "user__email", "organisation__name", "organisation__slug")
    autocomplete_fields = ("user", "organisation")
    list_select_related = ("user", "organisation")
    date_hierarchy = "joined_at"


class RevokedFilter(admin.SimpleListFilter):
    title = "revoked"
    parameter_name = "revoked"

    def lookups(self, request, model_admin):
        return (("yes", "Revoked"), ("no", "Active"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(revoked_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(revoked_at__isnull=True)
        return queryset


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys by name, prefix and owner; revoked with the action. The hash is never shown (it
    identifies the secret) and nothing can be edited; keys are issued on the user's settings
    page or with ``manage.py create_api_key``, where the secret is shown once."""

    list_display = ("name", "prefix", "user", "active", "created_at", "last_used_at", "revoked_at")
    list_filter = (RevokedFilter, "user__tier", "created_at")
    search_fields = ("name", "prefix", "user__username", "user__email")
    list_select_related = ("user",)
    date_hierarchy = "created_at"
    fields = ("name", "prefix", "user", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    actions = ("revoke",)

    @admin.display(description="active", boolean=True)
    def active(self, api_key: ApiKey) -> bool:
        return api_key.is_active

    @admin.action(description="Revoke the selected API keys", permissions=["revoke"])
    def revoke(self, request, queryset) -> None:
        """Revoke each selected key (services.api_key_revoke): it stops working at once.
        Revoking the background jobs' key stops their access until SECRET_KEY changes."""
        revoked = 0
        for api_key in queryset.filter(revoked_at__isnull=True):
            services.api_key_revoke(api_key=api_key)
            revoked += 1
        already = queryset.count() - revoked
        note = f" ({already} already revoked)" if already else ""
        self.message_user(request, f"Revoked {revoked} API key(s){note}.", messages.SUCCESS)

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm("accounts.change_apikey")

    def has_add_permission(self, request) -> bool:
        return False  # the secret must be shown to its owner once: the settings page does that

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # nothing to edit; revoking is the action

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: the row keeps the key's history (last use)
