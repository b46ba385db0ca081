from django.contrib import admin

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


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    list_display = ("turn_id", "conversation", "role", "status", "token_count", "created_at")
    list_filter = ("role", "status")
    readonly_fields = [f.name for f in Turn._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
