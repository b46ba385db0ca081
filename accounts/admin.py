from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts.models import ApiKey, Membership, Organisation, User
from moderation.forms import OrganisationAdminForm


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "email", "tier", "region", "is_staff")
    list_filter = ("tier", "region", "is_staff", "is_active")
    fieldsets = (*BaseUserAdmin.fieldsets, ("Service", {"fields": ("tier", "region")}))


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = (
        "name", "slug", "tier", "region", "moderation_fail_open", "blocked_term_count",
        "threshold_overrides", "created_at",
    )
    list_filter = ("moderation_fail_open",)
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    inlines = (MembershipInline,)
    # The moderation fields (raw JSON here) pass the same checks as the organisation's own
    # moderation page (moderation/forms.py).
    form = OrganisationAdminForm

    @admin.display(description="blocked terms")
    def blocked_term_count(self, org: Organisation) -> int:
        return len(org.blocked_terms or [])

    @admin.display(description="moderation thresholds")
    def threshold_overrides(self, org: Organisation) -> str:
        """The organisation's own thresholds ("offensive 0.9, ..."), or "defaults"."""
        thresholds = org.moderation_thresholds or {}
        return ", ".join(f"{k} {v}" for k, v in sorted(thresholds.items())) or "defaults"


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
