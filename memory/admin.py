"""Admin for long-term memory: find a user's facts by username or text; embeddings not shown.

Facts live in their user's home region's database (core/user_regions.py ``user_db``), so
this is a :class:`conversations.regional_admin.RegionalAdmin`: one region's database at a time, chosen
with the region filter, users looked up in ``default`` (no join across databases)."""

from django.contrib import admin

from conversations.regional_admin import RegionalAdmin, RegionFilter, UserTierFilter
from memory.models import UserMemory


@admin.register(UserMemory)
class UserMemoryAdmin(RegionalAdmin):
    # With one database the region filter narrows by the user's region label (a join in
    # ``default``); with a database per region it picks the database.
    region_path = "user__region"
    list_display = ("text", "user", "source", "source_conversation_id", "created_at")
    list_filter = (RegionFilter, "source", UserTierFilter, "created_at")
    tier_user_field = "user"
    search_fields = ("text",)
    user_fields = ("user",)
    id_search_fields = ("fact_id", "source_conversation_id")
    # The 384-float vector means nothing to a person, and editing the text without re-embedding
    # would make retrieval disagree with what is shown: facts are read-only here (delete only).
    exclude = ("embedding",)
    readonly_fields = ("fact_id", "user", "text", "source", "source_conversation_id", "created_at")
    list_prefetch_related = ("user",)
    date_hierarchy = "created_at"
    ordering = ("-created_at",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("embedding")

    def has_add_permission(self, request) -> bool:
        return False  # a fact needs its embedding: add through the memory page or the API

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # every field is read-only (see above); a wrong fact is deleted
