"""The usage ledger in the admin: listed, filtered and searched, never edited (read-only)."""

from django.contrib import admin

from conversations.admin import ModelVersionFilter, PoolFilter
from usage.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = (
        "created_at", "user", "org", "pool", "model_version", "tier", "tokens", "cost", "operator_cost",
        "status",
    )
    # Pools and versions from the configuration: a DISTINCT over the whole ledger per page
    # would grow with it.
    list_filter = (PoolFilter, ModelVersionFilter, "tier", "status", "org", "created_at")
    search_fields = (
        "user__username", "user__email", "org__name", "org__slug", "=turn_id", "=conversation_id",
    )  # fmt: skip
    date_hierarchy = "created_at"
    list_select_related = ("user", "org")
    ordering = ("-created_at", "-id")
    show_full_result_count = False  # one COUNT(*) of the ledger per page is enough

    @admin.display(description="tokens (prompt + completion)")
    def tokens(self, record: UsageRecord) -> str:
        return f"{record.tokens:,} ({record.prompt_tokens:,} + {record.completion_tokens:,})"

    @admin.display(description="cost (USD)", ordering="cost_usd")
    def cost(self, record: UsageRecord) -> str:
        return f"${record.cost_usd}"

    @admin.display(description="operator's cost (USD)", ordering="operator_cost_usd")
    def operator_cost(self, record: UsageRecord) -> str:
        """What the operator bore: a withdrawn answer's cost, not charged to the user."""
        return f"${record.operator_cost_usd}" if record.operator_cost_usd else "-"

    # A ledger: rows are written by usage.services.usage_record only.
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
