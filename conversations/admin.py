from django.contrib import admin
from django.db.models import Q

from conversations.models import Conversation, Turn


class TurnInline(admin.TabularInline):
    model = Turn
    fk_name = "conversation"
    fields = ("created_at", "role", "status", "token_count", "content")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # the turn log is append-only, written by the service layer


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "model", "region", "last_turn_at")
    list_filter = ("region", "model")
    search_fields = ("title", "owner__username")
    readonly_fields = ("conversation_id", "created_at", "last_turn_at")
    inlines = (TurnInline,)


class ModerationFilter(admin.SimpleListFilter):
    """Turns by their moderation verdict (``Turn.moderation_verdict``, moderation/verdicts.py
    ``Verdict.as_json``): flagged (``"flagged": true``), clean (``"flagged": false``) or not
    checked (no verdict: older turns, gates off, assistant turns of an unchecked answer)."""

    title = "moderation"
    parameter_name = "moderation"

    def lookups(self, request, model_admin):
        return (("flagged", "Flagged"), ("clean", "Clean"), ("unchecked", "Not checked"))

    def queryset(self, request, queryset):
        if self.value() == "flagged":
            return queryset.filter(moderation_verdict__flagged=True)
        if self.value() == "clean":
            return queryset.filter(moderation_verdict__flagged=False)
        if self.value() == "unchecked":
            return queryset.filter(~Q(moderation_verdict__has_key="flagged"))
        return queryset


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    list_display = (
        "turn_id", "conversation", "role", "status", "token_count", "moderation", "created_at"
    )
    list_filter = ("role", "status", ModerationFilter)
    readonly_fields = [f.name for f in Turn._meta.fields]

    @admin.display(description="moderation")
    def moderation(self, turn: Turn) -> str:
        """"flagged: <categories>", "clean" or "-" (not checked), with the gate when known."""
        verdict = turn.moderation_verdict or {}
        if "flagged" not in verdict:
            return "-"
        gate = f" ({verdict['gate']})" if verdict.get("gate") else ""
        if not verdict["flagged"]:
            return f"clean{gate}"
        categories = ", ".join(verdict.get("categories") or ()) or "no category"
        return f"flagged: {categories}{gate}"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
