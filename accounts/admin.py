from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts.models import ApiKey, Membership, Organisation, User


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
    list_display = ("name", "slug", "tier", "region", "created_at")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    inlines = (MembershipInline,)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
