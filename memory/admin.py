"""Admin for long-term memory: find a user's facts by username or text; embeddings not shown."""

from django.contrib import admin

from memory.models import UserMemory


@admin.register(UserMemory)
class UserMemoryAdmin(admin.ModelAdmin):
    list_display = ("text", "user", "source", "source_conversation_id", "created_at")
    list_filter = ("source", "user__tier", "created_at")
    search_fields = ("user__username", "user__email", "text")
    # The 384-float vector means nothing to a person, and editing the text without re-embedding
    # would make retrieval disagree with what is shown: facts are read-only here (delete only).
    exclude = ("embedding",)
    readonly_fields = ("fact_id", "user", "text", "source", "source_conversation_id", "created_at")
    list_select_related = ("user",)
    date_hierarchy = "created_at"
    ordering = ("-created_at",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("embedding")

    def has_add_permission(self, request) -> bool:
        return False  # a fact needs its embedding: add through the memory page or the API

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # every field is read-only (see above); a wrong fact is deleted
