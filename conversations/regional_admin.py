"""The base of every admin of regional data: conversations, their turns and the rows beside them
(``settings.CHAT_REGIONAL_APPS``) live in their home region's database
(core/regions.py); accounts in ``default``. An admin of regional rows
(:class:`RegionalAdmin`) therefore

- lists one region's database (its primary: operators see the latest writes) at a time, chosen
  with the *region* filter (:class:`RegionFilter`, ``?region=us-east``; without one, the
  default region's). With one database (no ``CHAT_REGION_DATABASE_URLS``) the filter narrows
  by the conversation's region label instead;
- finds a row for its change, history and delete pages in whichever database holds it (the one
  the list was showing first, then the others), so links and bookmarks work across regions;
- never joins a regional table with a global one in SQL (a region's database has no
  ``accounts_user``): users are fetched with ``prefetch_related`` (a second query, which the
  router sends to ``default``), and searches and filters on users (username, email, tier)
  look the users up in ``default`` first (:meth:`RegionalAdmin.user_q`, :class:`UserTierFilter`).

The admins themselves are in each app's ``admin.py`` (conversations/admin.py: conversations and
the turn log).
"""

from __future__ import annotations

import json
import uuid

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Q, QuerySet
from django.http import QueryDict

from accounts.models import Tier
from audit.models import Action
from audit.services import audit_record
from audit.signals import changed_fields, in_admin_action
from core import dbrouter, regions

# Most users a search or filter on users can match in a region's database: their ids are sent
# to that database as a list (a join is impossible across databases); users past the first this
# many (by id) are not found. An operator narrows the search instead.
USER_MATCH_LIMIT = 5000



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
            as_uuid = uuid_or_none(word)
            if as_uuid is not None:
                for field in self.id_search_fields:
                    q |= Q(**{field: as_uuid})
            queryset = queryset.filter(q)
        return queryset, False


def uuid_or_none(text: str) -> uuid.UUID | None:
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
