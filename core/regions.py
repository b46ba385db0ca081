"""Home regions: each conversation, with its turns, lives in its region's database.

Configuration (``chatsite/settings/base.py``): ``CHAT_REGION_DATABASE_URLS`` gives regions a
database (alias ``region_<name>``); ``settings.CHAT_REGION_DATABASES`` maps region -> alias.
With none configured the deployment has one database and the region is only a label: every
conversation is in ``default``. With some configured, a conversation is stored in its home
region's database and nowhere else; the default region's is ``default`` unless it is listed.

How a conversation's database is found:

- *At creation* the home region is the organisation's (when the conversation belongs to one:
  data residency is the organisation's policy) else the owner's (:func:`home_region`).
- *By id*: the id says where it lives. Conversation ids minted here are RFC 9562 version-8
  UUIDs whose 12 bits after the version nibble are a tag of the region name (the same on every
  server: a hash, not a list position): ``xxxxxxxx-xxxx-8TTT-yxxx-xxxxxxxxxxxx``. So every
  path that only has an id (a Celery write-back, a resumed stream) goes straight to the right
  database with no lookup and no global directory table (which would be one more write per
  conversation, in another region, on the hot path). Ids without a tag (created before regions,
  or by code that did not use :func:`new_conversation_id`) are looked for in each region's
  database, the user's own first, and remembered.
- *From an instance*: ``instance._state.db`` (Django records where a row was loaded from), so
  ``conversation.turns`` and ``save()`` follow the conversation (``core/dbrouter.py``).

Selectors and services say which conversation they work on by decorating themselves with
:func:`routed` (reads) or :func:`atomic` (writes: also one transaction on that database), which
pin its cluster for the call; see ``core/dbrouter.py`` for replicas and read-your-writes.
A user's own regional data that belongs to no conversation (memory) is routed by
core/user_regions.py (``user_db``, ``for_user``, ``atomic_for_user``).

This module imports no app: what it needs to know about conversations and organisation
memberships (is this a conversation, does a database hold this id, which organisation a new
conversation belongs to) it asks the :class:`RegionLocator` that the conversations app
registers in its ``ready()`` (conversations/region_locator.py), the way that app also tells the
database router where an unsaved row belongs (``core.dbrouter.instance_locator_set``).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import inspect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol
from uuid import UUID, uuid4

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, router, transaction
from django.db.models import QuerySet

from core import db_breaker, dbrouter
from core.dbrouter import default_db, multi_region


class RegionUnavailable(ValidationError):
    """A region that is not served here (unknown, or with no database configured)."""


# --- what the conversations app tells this module ---


class RegionLocator(Protocol):
    """The conversation- and account-specific lookups routing needs, answered by the app that
    defines those models (conversations/region_locator.py, registered in conversations/apps.py
    ``ready()`` with :func:`region_locator_set`), so this module imports no app."""

    def is_conversation(self, value: object) -> bool:
        """Whether ``value`` is a conversation row (not a turn or a row beside one)."""

    def conversation_exists(self, conversation_id: UUID, *, db: str) -> bool:
        """Whether the primary alias ``db`` holds conversation ``conversation_id`` (one
        query there)."""

    def home_organisation(self, *, owner, org=None) -> object | None:
        """The organisation a new conversation of user ``owner`` belongs to (its ``region``
        is the conversation's home region), or None (the owner's own region then): ``org``
        when given, else the owner's first organisation (oldest membership), else None.
        Raises ValidationError (code ``not_member``) if ``owner`` is not a member of ``org``."""


_locator: RegionLocator | None = None


def region_locator_set(locator: RegionLocator | None) -> None:
    """Register the :class:`RegionLocator` this module asks (None: forget it, as before apps
    load)."""
    global _locator
    _locator = locator


def _region_locator() -> RegionLocator:
    if _locator is None:
        raise RuntimeError(
            "No RegionLocator registered: the conversations app registers one in its ready(), "
            "so region lookups need Django's apps loaded (django.setup())."
        )
    return _locator


# --- regions and their databases ---


def db_for_region(region: str) -> str:
    """The primary database alias holding ``region``'s conversations.

    Raises RegionUnavailable if ``region`` is not one of ``settings.CHAT_REGIONS``, or if regions
    have databases (``CHAT_REGION_DATABASE_URLS``) and this one has none: storing its data
    elsewhere would break its residency, so it is refused instead.
    """
    if region not in settings.CHAT_REGIONS:
        raise RegionUnavailable(
            f"Unknown region {region!r}; this service has {', '.join(settings.CHAT_REGIONS)}.",
            code="unknown_region",
        )
    if not multi_region():
        return DEFAULT_DB_ALIAS
    alias = settings.CHAT_REGION_DATABASES.get(region)
    if alias is None:
        raise RegionUnavailable(
            f"Region {region!r} has no database configured here, so its conversations cannot "
            f"be stored (configured: {', '.join(sorted(settings.CHAT_REGION_DATABASES))}).",
            code="region_unavailable",
        )
    return alias


def region_of_db(alias: str) -> str:
    """The region whose conversations the database ``alias`` (a primary or one of its
    replicas) holds: the region configured with it in ``CHAT_REGION_DATABASE_URLS``, else the
    default region (whose conversations are in ``default`` unless it has a database of its own)."""
    primary = dbrouter.primary_of(alias)
    for region, db in (getattr(settings, "CHAT_REGION_DATABASES", None) or {}).items():
        if db == primary:
            return region
    return settings.CHAT_DEFAULT_REGION


def region_dbs() -> list[str]:
    """Every primary alias that holds conversations, the default region's first."""
    if not multi_region():
        return [DEFAULT_DB_ALIAS]
    return list(dict.fromkeys([default_db(), *settings.CHAT_REGION_DATABASES.values()]))


def home_region(*, owner, org=None) -> tuple[str, object | None]:
    """(region, organisation) for a new conversation of ``owner``.

    ``org`` (an Organisation the owner belongs to) when given, else the owner's first
    organisation (oldest membership) if any: the conversation belongs to it and lives in its
    region. Otherwise the owner's own region. Raises RegionUnavailable (see
    :func:`db_for_region`) and ValidationError if ``owner`` is not a member of ``org``.
    The memberships are read by the registered :class:`RegionLocator` (``home_organisation``).
    """
    org = _region_locator().home_organisation(owner=owner, org=org)
    region = org.region if org is not None else owner.region
    db_for_region(region)
    return region, org


def residency_zone(region: str) -> str:
    """The residency zone of ``region``: ``settings.CHAT_REGION_ZONES[region]``, else the part of
    its name before the first ``-`` (``eu-west`` -> ``eu``)."""
    return settings.CHAT_REGION_ZONES.get(region) or region.partition("-")[0]


def region_for_new_conversation(region: str, *, org=None) -> str:
    """The region a new conversation of home region ``region`` is created in now: ``region``
    itself while its primary is up, else, once its circuit breaker is open
    (core/db_breaker.py), ``settings.CHAT_REGION_FAILOVER[region]`` (the design brief:
    "conversations created during the outage land in the failover region").

    Residency decides whether the failover region is allowed: an organisation's conversations
    (``org`` given) may only move within the residency zone of their region
    (:func:`residency_zone`), so an EU organisation never gets a US conversation; a user without
    an organisation has no residency contract and may be served from any failover region.
    Raises PrimaryDown (503 + Retry-After) when the home primary is down and no failover region
    is allowed or up, or while the breaker is still counting failures (not yet open).
    """
    try:
        db_breaker.primary_ensure(db_for_region(region))
        return region
    except db_breaker.PrimaryDown as down:
        failover = settings.CHAT_REGION_FAILOVER.get(region)
        if not db_breaker.breaker(db_for_region(region)).is_open or not failover:
            raise
        if org is not None and residency_zone(failover) != residency_zone(region):
            raise db_breaker.PrimaryDown(
                region=region, retry_after_s=down.retry_after_s,
                message=(
                    f"The {region} region's database is unavailable. Your organisation's data "
                    f"must stay in {residency_zone(region).upper()} regions, so no conversation "
                    f"is started elsewhere; try again in {down.retry_after_s} s."
                ),
            ) from None  # fmt: skip
        try:
            failover_db = db_for_region(failover)
        except RegionUnavailable:
            raise down from None
        db_breaker.primary_ensure(failover_db)
        from core import metrics  # noqa: PLC0415

        metrics.REGION_FAILOVER_CREATES.labels(region=region, failover=failover).inc()
        return failover


# --- ids that carry their region ---


@functools.lru_cache(maxsize=256)
def region_tag(region: str) -> int:
    """The 12-bit tag of ``region`` in conversation ids (first 12 bits of SHA-256 of its name)."""
    digest = hashlib.sha256(region.encode()).digest()
    return (digest[0] << 4) | (digest[1] >> 4)


def new_conversation_id(region: str) -> UUID:
    """A random conversation id that names ``region``: an RFC 9562 version-8 UUID (114 random
    bits) with :func:`region_tag` in bits 52..63 (``xxxxxxxx-xxxx-8TTT-...``)."""
    raw = bytearray(os.urandom(16))
    tag = region_tag(region)
    raw[6] = 0x80 | (tag >> 8)
    raw[7] = tag & 0xFF
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 9562 variant
    return UUID(bytes=bytes(raw))


def region_of_id(conversation_id: UUID) -> str | None:
    """The region a conversation id names, or None (not a tagged id, or no such region here)."""
    if not isinstance(conversation_id, UUID):
        try:
            conversation_id = UUID(str(conversation_id))
        except ValueError:
            return None
    if conversation_id.version != 8:
        return None
    tag = ((conversation_id.bytes[6] & 0x0F) << 8) | conversation_id.bytes[7]
    for region in settings.CHAT_REGIONS:
        if region_tag(region) == tag:
            return region
    return None


def new_turn_id(conversation_id: UUID) -> UUID:
    """A random turn id that names the same region as ``conversation_id`` (as
    :func:`new_conversation_id`), so the Redis keys of the turn (its event log, its held
    record) are found on the region's server from the turn id alone; a random version-4 id when
    the conversation id names no region."""
    region = region_of_id(conversation_id)
    return new_conversation_id(region) if region is not None else uuid4()


def redis_region(*ids: UUID | str | None) -> str | None:
    """The region whose Redis server holds the keys of these ids (conversation or turn ids):
    the first that names a region (:func:`region_of_id`), else None (the global server,
    ``settings.REDIS_URL``). Pass the conversation id first when it is known."""
    for value in ids:
        if value is not None and (region := region_of_id(value)) is not None:
            return region
    return None


_located: OrderedDict[UUID, str] = OrderedDict()  # untagged id -> primary alias, LRU
_located_lock = threading.Lock()
_LOCATED_MAX = 10_000


def db_for_conversation_id(conversation_id: UUID, *, user=None) -> str:
    """The primary alias holding conversation ``conversation_id`` (which may not exist: then
    the database it would be in, so the caller's query finds nothing and says so).

    Tagged ids: the region's database, no query. Untagged ids with several regional databases:
    each is asked (``user``'s region first; :class:`RegionLocator` ``conversation_exists``) and
    the answer remembered (a conversation never moves).
    """
    region = region_of_id(conversation_id)
    if region is not None:
        try:
            return db_for_region(region)
        except RegionUnavailable:
            return default_db()
    dbs = region_dbs()
    if len(dbs) == 1:
        return dbs[0]
    key = UUID(str(conversation_id))
    with _located_lock:
        if key in _located:
            _located.move_to_end(key)
            return _located[key]
    locator = _region_locator()
    if user is not None:
        try:
            first = db_for_region(user.region)
            dbs = [first, *(db for db in dbs if db != first)]
        except RegionUnavailable:
            pass
    for db in dbs:
        if locator.conversation_exists(key, db=db):
            with _located_lock:
                _located[key] = db
                if len(_located) > _LOCATED_MAX:
                    _located.popitem(last=False)
            return db
    return dbs[0]


# --- instances (used by the router) ---


def instance_db(instance) -> str | None:
    """The primary alias an unsaved regional ``instance`` belongs in, or None if unknown."""
    if _region_locator().is_conversation(instance):
        if instance.region:
            return db_for_region(instance.region)
        return None
    conversation = _cached_conversation(instance)
    if conversation is not None:
        return conversation_db(conversation)
    conversation_id = getattr(instance, "conversation_id", None)
    return db_for_conversation_id(conversation_id) if conversation_id else None


def instance_owner(instance) -> int | None:
    """The user whose conversation ``instance`` belongs to, if known without a query."""
    owner = getattr(instance, "owner_id", None)
    if owner is not None:
        return owner
    conversation = _cached_conversation(instance)
    return conversation.owner_id if conversation is not None else None


def _cached_conversation(instance):
    field = _conversation_field(type(instance))
    if field is not None and field.is_cached(instance):
        return field.get_cached_value(instance)
    return None


@functools.cache
def _conversation_field(model):
    try:
        return model._meta.get_field("conversation")
    except Exception:  # noqa: BLE001 - FieldDoesNotExist: not a per-conversation model
        return None


def conversation_db(conversation) -> str:
    """The primary alias holding ``conversation`` (where it was loaded from or belongs)."""
    if conversation._state.db:
        return dbrouter.primary_of(conversation._state.db)
    if conversation.region:
        return db_for_region(conversation.region)
    return db_for_conversation_id(conversation.pk)


# --- pinning selectors and services to a conversation's database ---

_TURN_ARGUMENTS = ("turn", "upto", "question", "answer")


def _target(kwargs: dict) -> tuple[str | None, int | None]:
    """(primary alias, user id) named by a selector's or service's keyword arguments."""
    user = kwargs.get("user") or kwargs.get("owner")
    user_id = getattr(user, "pk", None)
    conversation = kwargs.get("conversation")
    if conversation is not None and _region_locator().is_conversation(conversation):
        return conversation_db(conversation), conversation.owner_id
    for name in _TURN_ARGUMENTS:
        turn = kwargs.get(name)
        if turn is not None and hasattr(turn, "_state"):
            db = turn._state.db and dbrouter.primary_of(turn._state.db)
            return db or instance_db(turn), instance_owner(turn) or user_id
    conversation_id = kwargs.get("conversation_id")
    if conversation_id is not None:
        return db_for_conversation_id(conversation_id, user=user), user_id
    return None, user_id


def call_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """The arguments of a call of a function with ``signature``, by name (as passed when it
    cannot be bound: the call itself will raise). For the routing decorators here and in
    core/user_regions.py."""
    if not args:
        return kwargs
    try:
        return signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return kwargs  # the call itself will raise


def routed(fn: Callable) -> Callable:
    """Decorate a selector: its queries go to the cluster of the conversation named by its
    arguments (``conversation``, a turn as ``turn``/``upto``/``question``/``answer``, or
    ``conversation_id``), on behalf of its owner (read-your-writes). A QuerySet it returns is
    bound to the database chosen now, so it stays right when evaluated later."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        db, user_id = _target(call_arguments(signature, args, kwargs))
        if db is None:
            return fn(*args, **kwargs)
        with dbrouter.pinned(db, user_id):
            result = fn(*args, **kwargs)
            if isinstance(result, QuerySet) and result._db is None:
                result = result.using(router.db_for_read(result.model))
        return result

    return wrapper


def atomic(fn: Callable) -> Callable:
    """Decorate a service, under its ``@transaction.atomic``: like :func:`routed`, and the call
    is one transaction on that conversation's database too. Before it starts, the database's
    primary must be reachable (core/db_breaker.py: raises PrimaryDown, a 503 with
    Retry-After, while it is down) (the one on ``default`` does not
    cover writes to another database, and ``select_for_update`` needs one where it runs).

    Order: ``@transaction.atomic`` outside, this inside. The conversation's database commits
    first, then ``default``'s, so ``transaction.on_commit`` callbacks (registered on
    ``default``) run only after the conversation's writes are committed. When the conversation
    is in ``default`` this joins the outer transaction (no savepoint)."""

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        db, user_id = _target(call_arguments(signature, args, kwargs))
        db = db or default_db()
        if not transaction.get_connection(db).in_atomic_block:
            db_breaker.primary_ensure(db)  # PrimaryDown (503) while that primary is down
        with dbrouter.pinned(db, user_id), transaction.atomic(using=db, savepoint=False):
            return fn(*args, **kwargs)

    return wrapper


def manager(model, db: str, *, user_id: int | None = None):
    """``model.objects`` bound to the cluster of primary alias ``db`` (reads: a replica, or the
    primary under read-your-writes for ``user_id``), decided when a query runs, so querysets
    from it can be built in async code and evaluated later in a thread."""
    return model.objects.db_manager(hints={"primary": db, "user_id": user_id})


def managers(model, *, user) -> list:
    """:func:`manager` for each regional database, the default region's first: the pieces of a
    listing of ``user``'s conversations. A user's conversations may be in any region (their
    organisation's, or their own before it changed), so every region is asked; with one
    database that is one query, as before."""
    return [manager(model, db, user_id=getattr(user, "pk", None)) for db in region_dbs()]


def merged(querysets: Iterable[QuerySet], *, key: Callable, reverse: bool = False):
    """One ordered sequence over querysets from several databases, each already ordered by
    ``key`` (``reverse``: descending): the queryset itself when there is one, else a lazy
    :class:`Merged` (evaluated on first use, so it can be built in async code and iterated in a
    thread, like a QuerySet)."""
    querysets = list(querysets)
    if len(querysets) == 1:
        return querysets[0]
    return Merged(querysets, key, reverse)


class Merged:
    """See :func:`merged`."""

    def __init__(self, querysets: list[QuerySet], key: Callable, reverse: bool):
        self._querysets, self._key, self._reverse = querysets, key, reverse
        self._rows: list | None = None

    def _fetch(self) -> list:
        if self._rows is None:
            self._rows = list(
                heapq.merge(
                    *(list(q) for q in self._querysets), key=self._key, reverse=self._reverse
                )
            )
        return self._rows

    def __iter__(self) -> Iterator:
        return iter(self._fetch())

    def __len__(self) -> int:
        return len(self._fetch())

    def __getitem__(self, index):
        return self._fetch()[index]

    def __bool__(self) -> bool:
        return bool(self._fetch())
