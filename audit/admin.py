"""The audit log in the admin: read-only (no add, change or delete, no bulk actions), for
staff with the ``audit.view_auditentry`` permission (superusers have it)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from audit.models import AuditEntry
from audit.services import with_region_details


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Newest first; filter by action, target type and date; search with a number (an actor,
    organisation or target id) or words of an action or target type."""

    list_display = (
        "id",
        "created_at",
        "actor",
        "action",
        "organisation",
        "target_type",
        "target_id",
        "details_json",
        "region",
    )
    list_filter = ("action", "target_type", "region")
    date_hierarchy = "created_at"
    search_fields = ("action", "target_type")
    fields = (
        "id",
        "created_at",
        "actor_id",
        "action",
        "org_id",
        "target_type",
        "target_id",
        "details_json",
        "region",
    )
    readonly_fields = fields
    actions = None
    list_per_page = 100

    @admin.display(description="actor", ordering="actor_id")
    def actor(self, entry: AuditEntry) -> str:
        if entry.actor_id is None:
            return "system"
        url = reverse("admin:accounts_user_change", args=[entry.actor_id])
        return format_html('<a href="{}">user #{}</a>', url, entry.actor_id)

    @admin.display(description="organisation", ordering="org_id")
    def organisation(self, entry: AuditEntry) -> str:
        if entry.org_id is None:
            return "-"
        url = reverse("admin:accounts_organisation_change", args=[entry.org_id])
        return format_html('<a href="{}">organisation #{}</a>', url, entry.org_id)

    @admin.display(description="details")
    def details_json(self, entry: AuditEntry) -> str:
        return json.dumps(entry.details, ensure_ascii=False, sort_keys=True)

    def get_changelist_instance(self, request):
        """The page's entries with the target ids and details kept in regions' databases
        filled in (audit.services.with_region_details: one query per region on the page)."""
        changelist = super().get_changelist_instance(request)
        changelist.result_list = with_region_details(changelist.result_list)
        return changelist

    def get_object(self, request, object_id, from_field=None):
        entry = super().get_object(request, object_id, from_field)
        return None if entry is None else with_region_details([entry])[0]

    def get_search_results(self, request, queryset, search_term):
        """A whole number finds entries whose actor, organisation or target has that id; other
        words search the action and target type. (A target id kept in a region's database is
        not searched: its entry lists the region instead.)"""
        term = search_term.strip()
        if term.isdigit() and len(term) < 19:
            number = int(term)
            return queryset.filter(actor_id=number) | queryset.filter(
                org_id=number
            ) | queryset.filter(target_id=term), False
        return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # append-only (audit/models.py)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # append-only (audit/models.py)
