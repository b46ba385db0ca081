"""Conversations and the turn log in the admin, with the list filters other apps' admins reuse
(pool, model version, moderation outcome) and ``excerpt`` / ``verdict_summary``.

**Regions.** These admins are conversations/regional_admin.py ``RegionalAdmin``s: one region's
database at a time, chosen with its region filter; users looked up in ``default``.

**The turn log is append-only**: no turn can be added, changed or deleted here, inline or not
(a conversation's deletion, which removes its turns through the service layer, aside).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db.models import Q, Subquery
from django.urls import reverse
from django.utils.html import format_html

from conversations import deletion
from conversations.models import Conversation, Turn
from conversations.regional_admin import RegionalAdmin, RegionFilter, UserTierFilter, uuid_or_none
from conversations.search_selectors import SEARCH_CONFIG

# Turns shown inline on a conversation's page (the newest; the turn list has them all).
INLINE_TURNS = 50


# --- pools: choices from the configuration, not a DISTINCT over millions of rows --------------


def _pools():
    from inference.pools import pool_set  # noqa: PLC0415 - the admin loads before the engine

    try:
        return list(pool_set())
    except Exception:  # noqa: BLE001 - a bad pool file is reported by `manage.py check`
        return []


class PoolFilter(admin.SimpleListFilter):
    """By pool (``?pool=mini``): the configured pools, and the one asked for if no longer
    configured (older rows)."""

    title = "pool"
    parameter_name = "pool"

    def lookups(self, request, model_admin):
        names = list(dict.fromkeys(p.name for p in _pools()))
        if self.value() and self.value() not in names:
            names.append(self.value())
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        return queryset.filter(pool=self.value()) if self.value() is not None else queryset


class ModelVersionFilter(admin.SimpleListFilter):
    """By model version (``?model_version=smollm2-135m-1``): the configured pools' versions and
    canary versions (``settings.CHAT_CANARIES``), and the one asked for."""

    title = "model version"
    parameter_name = "model_version"

    def lookups(self, request, model_admin):
        versions = [p.version for p in _pools()]
        versions += [str(c.get("version")) for c in settings.CHAT_CANARIES if c.get("version")]
        versions = list(dict.fromkeys(versions))
        if self.value() and self.value() not in versions:
            versions.append(self.value())
        return [(v, v) for v in versions]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        return queryset.filter(model_version=self.value())


# --- moderation verdicts (Turn.moderation_verdict, moderation/verdicts.py) ----------------------


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


def verdict_summary(turn: Turn) -> str:
    """"flagged: <categories> (<gate>)", "clean (<gate>)" or "-" (not checked)."""
    verdict = turn.moderation_verdict or {}
    if "flagged" not in verdict:
        return "-"
    gate = f" ({verdict['gate']})" if verdict.get("gate") else ""
    if not verdict["flagged"]:
        return f"clean{gate}"
    categories = ", ".join(verdict.get("categories") or ()) or "no category"
    return f"flagged: {categories}{gate}"


def excerpt(text: str, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


# --- conversations ----------------------------------------------------------------------------


class TurnInline(admin.TabularInline):
    """The conversation's newest ``INLINE_TURNS`` turns, oldest first; read-only."""

    model = Turn
    fk_name = "conversation"
    fields = ("created_at", "role", "status", "pool", "model_version", "token_count", "content")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    verbose_name_plural = f"turns (the newest {INLINE_TURNS})"

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # the turn log is append-only, written by the service layer

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Conversation)
class ConversationAdmin(RegionalAdmin):
    """Conversations, read-only (they change through their owner's turns); deleting one goes
    through the deletion service (conversations/deletion.py: its turns and Redis copies go too,
and an answer still being written in it is stopped)."""

    region_path = "region"
    list_display = ("__str__", "owner", "org", "model", "region", "created_at", "last_turn_at")
    list_filter = (RegionFilter, UserTierFilter, "org", "model")
    search_fields = ("title",)
    user_fields = ("owner",)
    id_search_fields = ("conversation_id",)
    date_hierarchy = "created_at"
    ordering = ("-last_turn_at",)
    inlines = (TurnInline,)

    list_prefetch_related = ("owner", "org")
    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Conversation._meta.fields] + ["turn_list"]

    @admin.display(description="all turns")
    def turn_list(self, conversation: Conversation) -> str:
        url = reverse("admin:conversations_turn_changelist")
        return format_html(
            '<a href="{}?conversation__exact={}&amp;region={}">Every turn of this conversation</a>',
            url, conversation.conversation_id, conversation.region,
        )  # fmt: skip

    def get_formset_kwargs(self, request, obj, inline, prefix):
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, TurnInline) and obj is not None:
            newest = (
                Turn.objects.using(obj._state.db).filter(conversation=obj)
                .order_by("-created_at", "-turn_id").values("turn_id")[:INLINE_TURNS]
            )  # fmt: skip
            kwargs["queryset"] = (
                kwargs["queryset"].filter(turn_id__in=Subquery(newest)).order_by("created_at", "turn_id")
            )
        return kwargs

    def has_add_permission(self, request) -> bool:
        return False  # conversations are started by their owners

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_deleted_objects(self, objs, request):
        """As Django's, except that the turns (read-only here: nobody may delete one on its
        own) do not stop their conversation's deletion: they go with it."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed -= {Turn._meta.verbose_name, TurnInline.verbose_name}
        return deleted, counts, perms_needed, protected

    def delete_model(self, request, obj) -> None:
        deletion.conversation_delete(conversation=obj)

    def delete_queryset(self, request, queryset) -> None:
        for conversation in queryset:
            deletion.conversation_delete(conversation=conversation)


# --- the turn log -----------------------------------------------------------------------------


class TurnAdminBase(RegionalAdmin):
    """Turns, read-only: the log is append-only (no add, change or delete; Django answers 403).

    Search: a UUID finds the turn or the conversation with that id; other words search the turn
    text with the full-text index (``turn_content_fts``, the same expression as
    ``conversations.search_selectors.conversation_search``)."""

    list_display = (
        "turn_id", "conversation", "role", "status", "pool", "model_version", "token_count",
        "moderation", "created_at",
    )  # fmt: skip
    list_select_related = ("conversation",)  # same database
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    search_fields = ("content",)  # shows the search box; get_search_results does the search
    search_help_text = "A turn or conversation id, or words of the text (full-text search)."

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        as_uuid = uuid_or_none(term)
        if as_uuid is not None:
            return queryset.filter(Q(turn_id=as_uuid) | Q(conversation_id=as_uuid)), False
        query = SearchQuery(term, search_type="websearch", config=SEARCH_CONFIG)
        return (
            queryset.annotate(document=SearchVector("content", config=SEARCH_CONFIG)).filter(
                document=query
            ),
            False,
        )

    def get_fields(self, request, obj=None):
        # Turn-to-turn references as plain ids: following them costs a query each, and from the
        # ModeratedTurn proxy (not a regional app label) the router would ask the default
        # region's database rather than the turn's.
        return [f.attname if f.related_model is Turn else f.name for f in Turn._meta.fields]

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj)

    @admin.display(description="moderation")
    def moderation(self, turn: Turn) -> str:
        """"flagged: <categories>", "clean" or "-" (not checked), with the gate when known."""
        return verdict_summary(turn)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Turn)
class TurnAdmin(TurnAdminBase):
    list_filter = (RegionFilter, "role", "status", PoolFilter, ModelVersionFilter, ModerationFilter)
