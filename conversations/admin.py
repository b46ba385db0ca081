"""Conversations and the turn log in the admin, and the helpers every admin of regional data uses.

**Regions.** Conversations, their turns and the rows beside them (``settings.CHAT_REGIONAL_APPS``)
live in their home region's database (conversations/regions.py); accounts in ``default``. An
admin of regional rows (:class:`RegionalAdmin`) therefore

- lists one region's database (its primary: operators see the latest writes) at a time, chosen with the *region* filter (:class:`RegionFilter`,
  ``?region=us-east``; without one, the default region's). With one database (no
  ``CHAT_REGION_DATABASE_URLS``) the filter narrows by the conversation's region label instead;
- finds a row for its change, history and delete pages in whichever database holds it (the one
  the list was showing first, then the others), so links and bookmarks work across regions;
- never joins a regional table with a global one in SQL (a region's database has no
  ``accounts_user``): users are fetched with ``prefetch_related`` (a second query, which the
  router sends to ``default``), and searches and filters on users (username, email, tier)
  look the users up in ``default`` first (:meth:`RegionalAdmin.user_q`).

**The turn log is append-only**: no turn can be added, changed or deleted here, inline or not
(a conversation's deletion, which removes its turns through the service layer, aside).
"""

from __future__ import annotations

import json
import uuid

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Q, QuerySet, Subquery
from django.http import QueryDict
from django.urls import reverse
from django.utils.html import format_html

from accounts.models import Tier
from audit.models import Action
from audit.services import audit_record
from audit.signals import changed_fields, in_admin_action
from chatsite import dbrouter
from conversations import deletion, regions
from conversations.models import Conversation, Turn
from conversations.selectors import SEARCH_CONFIG

# Most users a search or filter on users can match in a region's database: their ids are sent
# to that database as a list (a join is impossible across databases); users past the first this
# many (by id) are not found. An operator narrows the search instead.
USER_MATCH_LIMIT = 5000
# Turns shown inline on a conversation's page (the newest; the turn list has them all).
INLINE_TURNS = 50


# --- regions ----------------------------------------------------------------------------------


def served_regions() -> dict[str, str]:
    """Region -> primary alias of every region whose conversations this deployment stores, the
    default region first (one database: every region in ``settings.CHAT_REGIONS`` -> default)."""
    served = {}
    for region in (settings.CHAT_DEFAULT_REGION, *settings.CHAT_REGIONS):
        try:
            served.setdefault(region, regions.db_for_region(region))
        except regions.RegionUnavailable:
            continue
    return served


def chosen_region(request) -> str | None:
    """The region the admin page was asked for (``?region=``, also through the preserved
    filters of a change page), if it is one this deployment serves; else None."""
    value = request.GET.get(RegionFilter.parameter_name)
    if value is None and "_changelist_filters" in request.GET:
        value = QueryDict(request.GET["_changelist_filters"]).get(RegionFilter.parameter_name)
    return value if value in served_regions() else None


class RegionFilter(admin.SimpleListFilter):
    """Which region's rows to list. With a database per region it picks the database (every
    listing shows one region; the default region's until another is chosen, so there is no
    "All"); with one database it narrows by the conversation's region label.
    ``RegionalAdmin.region_path`` names the region field from the listed model."""

    title = "region"
    parameter_name = "region"

    def lookups(self, request, model_admin):
        served = served_regions()
        if regions.multi_region():
            return [(region, f"{region} ({alias})") for region, alias in served.items()]
        return [(region, region) for region in served]

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.region_path = getattr(model_admin, "region_path", "conversation__region")

    def queryset(self, request, queryset):
        # The database was chosen by RegionalAdmin.get_queryset; this narrows by the label,
        # which with a database per region changes nothing (a region's database holds only its
        # own conversations) and with one database is the whole filter.
        if self.value() not in served_regions():
            return queryset
        return queryset.filter(**{self.region_path: self.value()})

    def choices(self, changelist):
        if not regions.multi_region():
            yield from super().choices(changelist)
            return
        current = chosen_region(self.request) or settings.CHAT_DEFAULT_REGION
        for lookup, title in self.lookup_choices:
            yield {
                "selected": current == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


class RegionalChangeList(ChangeList):
    """A change list that also prefetches ``list_prefetch_related`` for the page's rows."""

    def apply_select_related(self, qs):
        qs = super().apply_select_related(qs)
        return qs.prefetch_related(*getattr(self.model_admin, "list_prefetch_related", ()))


class RegionalAdmin(admin.ModelAdmin):
    """Base admin of rows in ``settings.CHAT_REGIONAL_APPS`` (see the module docstring).

    Subclasses set ``region_path`` (the lookup of the conversation's region from the model:
    ``"region"`` on Conversation, ``"conversation__region"`` below it), put :class:`RegionFilter`
    first in ``list_filter``, and name user references in ``user_fields`` (searched by username
    and email) and UUID fields in ``id_search_fields`` (an exact match when the term is a UUID)
    instead of putting either in ``search_fields``, which holds local text fields only.
    References to users and organisations shown in the list go in ``list_prefetch_related``
    (one more query each, to ``default``), never in ``list_select_related``.
    """

    region_path = "conversation__region"
    user_fields: tuple[str, ...] = ()
    id_search_fields: tuple[str, ...] = ()
    # Joins across databases are impossible: never Django's automatic select_related of every
    # foreign key in list_display (subclasses list same-database relations only).
    list_select_related: tuple[str, ...] = ()
    list_prefetch_related: tuple[str, ...] = ()
    show_full_result_count = False  # a second COUNT(*) over a large regional table per page

    def region_db(self, request) -> str:
        """The primary alias whose rows the page lists (see :func:`chosen_region`)."""
        region = chosen_region(request)
        return served_regions()[region] if region is not None else regions.default_db()

    def get_queryset(self, request):
        return super().get_queryset(request).using(self.region_db(request))

    def get_changelist(self, request, **kwargs):
        return RegionalChangeList

    def get_object(self, request, object_id, from_field=None):
        """The row with this id from whichever region's database holds it (the listed one
        first), or None (also for an id that is not valid for the field)."""
        queryset = self.get_queryset(request)
        model = queryset.model
        field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            value = field.to_python(object_id)
        except Exception:  # noqa: BLE001 - ValidationError, ValueError: a bad id is "not found"
            return None
        first = queryset.db
        for db in dict.fromkeys([first, *regions.region_dbs()]):
            found = queryset.using(db).filter(**{field.name: value}).first()
            if found is not None:
                return found
        return None

    def get_formset_kwargs(self, request, obj, inline, prefix):
        """Inline rows come from the parent's database (the inline's own queryset would be
        routed to the default region's)."""
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if obj is not None and obj._state.db:
            kwargs["queryset"] = kwargs["queryset"].using(obj._state.db)
        return kwargs

    def get_deleted_objects(self, objs, request):
        """What a deletion takes with it, collected in the rows' own database."""
        objs = list(objs)
        db = objs[0]._state.db if objs and objs[0]._state.db else regions.default_db()
        with dbrouter.pinned(db):
            return super().get_deleted_objects(objs, request)

    # --- the admin's log of these rows stays in their region ---

    def _log(self, request, obj, action: str, message) -> None:
        """An ``admin.*`` audit entry for ``obj`` whose id and changed fields are kept in the
        row's region database (audit.services.audit_record ``region``), instead of Django's
        global LogEntry, which would store the row's id and ``str()`` (a conversation's title)
        outside its region (issue 20). Field names only, as for every admin entry."""
        text = message if isinstance(message, str) else json.dumps(message or [])
        audit_record(
            actor=request.user, action=action, target_type=self.model._meta.label_lower,
            target_id=obj.pk, details={"via": "admin", **changed_fields(text)},
            region=regions.region_of_db(obj._state.db or regions.default_db()),
        )  # fmt: skip

    def log_addition(self, request, obj, message):
        self._log(request, obj, Action.ADMIN_ADD, message)

    def log_change(self, request, obj, message):
        self._log(request, obj, Action.ADMIN_CHANGE, message)

    def log_deletions(self, request, queryset):
        """One ``admin.delete`` entry per row (a bulk "delete selected" is recorded by
        audit/middleware.py instead, which silences this while it runs)."""
        if in_admin_action.get():
            return
        for obj in queryset:
            self._log(request, obj, Action.ADMIN_DELETE, "[]")

    # --- users live in another database ---

    def user_q(self, queryset: QuerySet, field: str, **lookups) -> Q:
        """A condition on ``queryset``'s rows: the user referenced by ``field`` matches
        ``lookups`` (User field lookups, OR-ed: ``username__icontains="ann"``). In ``default``
        (where users are) a join; in a region's database a list of matching user ids, looked
        up in ``default`` first (at most ``USER_MATCH_LIMIT``)."""
        if queryset.db == DEFAULT_DB_ALIAS:
            return Q.create([(f"{field}__{k}", v) for k, v in lookups.items()], connector=Q.OR)
        users = get_user_model().objects.filter(Q.create(list(lookups.items()), connector=Q.OR))
        ids = list(users.order_by("pk").values_list("pk", flat=True)[:USER_MATCH_LIMIT])
        return Q(**{f"{field}_id__in": ids})

    def get_search_results(self, request, queryset, search_term):
        """Each word must match one of: ``search_fields`` (local text, contains), a user of
        ``user_fields`` (username or email contains), or, for a UUID, ``id_search_fields``
        exactly. No joins across databases."""
        words = search_term.split()
        if not words:
            return queryset, False
        for word in words:
            q = Q.create([(f"{f}__icontains", word) for f in self.search_fields], connector=Q.OR)
            for field in self.user_fields:
                q |= self.user_q(queryset, field, username__icontains=word, email__icontains=word)
            as_uuid = _uuid_or_none(word)
            if as_uuid is not None:
                for field in self.id_search_fields:
                    q |= Q(**{field: as_uuid})
            queryset = queryset.filter(q)
        return queryset, False


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


class UserTierFilter(admin.SimpleListFilter):
    """Rows whose user (``RegionalAdmin.tier_user_field``, default ``owner``) is on a tier."""

    title = "tier"
    parameter_name = "tier"

    def lookups(self, request, model_admin):
        return Tier.choices

    def queryset(self, request, queryset):
        if self.value() not in Tier.values:
            return queryset
        field = getattr(self.model_admin, "tier_user_field", "owner")
        return queryset.filter(self.model_admin.user_q(queryset, field, tier=self.value()))

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.model_admin = model_admin


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
    ``conversations.selectors.conversation_search``)."""

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
        as_uuid = _uuid_or_none(term)
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
