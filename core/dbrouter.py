"""Which database a query goes to: primaries and read replicas, regions, read-your-writes.

Databases come in *clusters*: a primary alias and its read replicas (``settings.DATABASE_REPLICAS``,
built from ``DATABASE_REPLICA_URLS`` and ``CHAT_REGION_DATABASE_URLS``). ``default`` is the
global cluster; each region with a database of its own has one more.

- Global data (accounts, organisations, API keys, sessions, auth: every app not in
  ``settings.CHAT_REGIONAL_APPS``) lives in ``default`` and is read from its primary. Those reads
  are single rows by key, and authentication must never see a state older than the last write
  (a session or an API key created a moment ago has to work on the next request).
- Conversation data (``CHAT_REGIONAL_APPS``, and the models named in ``CHAT_REGIONAL_MODELS``,
  such as an audit entry's regional detail) lives in its region's cluster
  (``core/regions.py``). Writes go to the primary; reads go to a replica, except
  *read-your-writes*: for ``settings.CHAT_READ_YOUR_WRITES_S`` after a user's conversation data
  was written, that user's reads go to the primary, and so does every read inside a transaction
  on the primary.

Which cluster: a manager bound to one (``regions.manager``: the ``primary`` hint), else the model
instance a query starts from (``conversation.turns...``, ``save()``, related managers: Django
passes it as the ``instance`` hint), else the :func:`pinned` cluster of the calling selector or
service (a context variable, so it follows ``sync_to_async`` and the tasks a request starts),
else the default region's cluster.

Read-your-writes is tracked per user, because a user is who reads their conversations back, from
any gateway process and from any device: a write marks ``chat:ryw:{user_id}`` in Redis with the
window as its TTL (and in this process's memory, so this process does not ask Redis). Why not a
cookie: API clients keep none, and an answer written by a background task has no response to set
one on. If Redis cannot be asked, reads go to the primary (consistency over offloading, the same
as running without replicas).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from core import db_breaker

logger = logging.getLogger(__name__)


@dataclass
class Pin:
    """The cluster (its primary's alias) a selector or service works on, and whose data it is."""

    primary: str
    user_id: int | None = None
    wrote: bool = False  # this pinned call wrote: its later reads go to the primary
    recent: bool | None = None  # whether user_id wrote recently, asked once per pinned call
    outer: Pin | None = None  # the pin this one is nested in


_pin: contextvars.ContextVar[Pin | None] = contextvars.ContextVar("db_pin", default=None)


@contextlib.contextmanager
def pinned(primary: str, user_id: int | None = None) -> Iterator[Pin]:
    """Send regional queries without an instance hint to ``primary``'s cluster for the block,
    on behalf of ``user_id`` (for read-your-writes). ``primary`` is a primary alias (a replica
    alias is mapped to its primary). Nested in a pin of the same cluster, it keeps the outer
    pin's user (when it names none) and what that pin knows: a helper that only has an id
    (``cache.history_load(conversation_id)``) reads for the same user as its caller."""
    primary = primary_of(primary)
    outer = _pin.get()
    pin = Pin(primary=primary, user_id=user_id, outer=outer)
    if outer is not None and outer.primary == primary and user_id in (None, outer.user_id):
        pin.user_id, pin.wrote, pin.recent = outer.user_id, outer.wrote, outer.recent
    token = _pin.set(pin)
    try:
        yield _pin.get()
    finally:
        _pin.reset(token)


# --- clusters ---


def replicas_of(primary: str) -> list[str]:
    """The read-replica aliases of the primary alias ``primary`` (empty: none configured)."""
    return getattr(settings, "DATABASE_REPLICAS", {}).get(primary) or []


def primary_of(alias: str) -> str:
    """The primary alias of the cluster that ``alias`` (a primary or a replica) belongs to."""
    for primary, replicas in getattr(settings, "DATABASE_REPLICAS", {}).items():
        if alias in replicas:
            return primary
    return alias


def is_replica(alias: str) -> bool:
    return primary_of(alias) != alias


_round_robin = itertools.count()


def _read_alias(primary: str, user_id: int | None, pin: Pin | None) -> str:
    replicas = replicas_of(primary)
    if not replicas:
        return primary
    if connections[primary].in_atomic_block or (pin is not None and pin.wrote):
        return primary  # a transaction (or call) reads what it wrote
    if db_breaker.is_down(primary):
        # The primary is down (core/db_breaker.py): history keeps coming from replicas,
        # read-your-writes or not (there is nothing newer a user could miss: writes fail).
        return replicas[next(_round_robin) % len(replicas)]
    if user_id is not None:
        if pin is not None and pin.user_id == user_id:
            if pin.recent is None:  # one Redis question per selector or service call
                pin.recent = wrote_recently(user_id)
            recent = pin.recent
        else:
            recent = wrote_recently(user_id)
        if recent:
            return primary
    return replicas[next(_round_robin) % len(replicas)]


# --- read-your-writes ---

_local_writes: dict[int, float] = {}  # user id -> time.monotonic() of their last write here
_redis_marked: dict[int, float] = {}  # user id -> when this process last set their Redis key
_redis_lock = threading.Lock()
_redis_client = None
_last_redis_warning = 0.0


def _redis():
    global _redis_client
    with _redis_lock:
        if _redis_client is None:
            import redis  # noqa: PLC0415

            # Short timeouts: this is asked on the read path; a slow Redis means "use the
            # primary", not "wait".
            _redis_client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
            )
        return _redis_client


def _redis_failed(exc: Exception) -> None:
    global _last_redis_warning
    now = time.monotonic()
    if now - _last_redis_warning > 30:
        _last_redis_warning = now
        logger.warning("read-your-writes: Redis unavailable (%s); reading from primaries", exc)


def ryw_key(user_id: int) -> str:
    """Redis key marking that ``user_id`` wrote conversation data within the window."""
    return f"chat:ryw:{user_id}"


def note_write(user_id: int | None) -> None:
    """Record that ``user_id`` just wrote conversation data: their reads go to primaries for the
    next ``settings.CHAT_READ_YOUR_WRITES_S`` seconds, in every process. Never raises."""
    if user_id is None:
        return
    window = settings.CHAT_READ_YOUR_WRITES_S
    if window <= 0 or not any(getattr(settings, "DATABASE_REPLICAS", {}).values()):
        return
    now = time.monotonic()
    if len(_local_writes) > 10_000:  # forget writes whose window is over
        for uid, at in list(_local_writes.items()):
            if now - at >= window:
                _local_writes.pop(uid, None)
                _redis_marked.pop(uid, None)
    _local_writes[user_id] = now
    # One SET per quarter window per user and process is enough: the key lives a whole window
    # from the last SET, and this process also remembers the write itself.
    if now - _redis_marked.get(user_id, -1e9) < window / 4:
        return
    try:
        _redis().set(ryw_key(user_id), b"1", px=max(1, int(window * 1000)))
        _redis_marked[user_id] = now
    except Exception as exc:  # noqa: BLE001 - a missed mark is degraded mode, not an error
        _redis_failed(exc)


def wrote_recently(user_id: int) -> bool:
    """Whether ``user_id`` wrote conversation data within the window (any process). True when
    Redis cannot be asked: then the primary answers, which is always consistent."""
    window = settings.CHAT_READ_YOUR_WRITES_S
    if window <= 0:
        return False
    if time.monotonic() - _local_writes.get(user_id, -1e9) < window:
        return True
    try:
        return bool(_redis().exists(ryw_key(user_id)))
    except Exception as exc:  # noqa: BLE001
        _redis_failed(exc)
        return True


def forget_writes() -> None:
    """Forget this process's record of recent writes (tests and benchmarks)."""
    _local_writes.clear()
    _redis_marked.clear()


# --- the router ---


def multi_region() -> bool:
    """Whether any region has a database of its own (else everything is in ``default``)."""
    return bool(getattr(settings, "CHAT_REGION_DATABASES", None))


def default_db() -> str:
    """The primary alias of the default region (``settings.CHAT_DEFAULT_REGION``)."""
    if not multi_region():
        return DEFAULT_DB_ALIAS
    return settings.CHAT_REGION_DATABASES.get(settings.CHAT_DEFAULT_REGION, DEFAULT_DB_ALIAS)


class InstanceLocator(Protocol):
    """Where an unsaved regional model instance belongs, known without a query: core/regions.py
    says (``instance_db``, ``instance_owner``, with what the conversations app tells it),
    registered in conversations/apps.py ``ready()``: registered, not imported, because
    core/regions.py imports this module."""

    def instance_db(self, instance) -> str | None: ...

    def instance_owner(self, instance) -> int | None: ...


_locator: InstanceLocator | None = None


def instance_locator_set(locator: InstanceLocator | None) -> None:
    """Register the :class:`InstanceLocator` the router asks about unsaved instances (until
    one is registered, as while apps load, an instance without a database goes by pin or to
    the default region)."""
    global _locator
    _locator = locator


def _is_regional(model_or_instance) -> bool:
    # ``._meta`` and not ``type(x)._meta``: ``request.user`` is a SimpleLazyObject. A proxy
    # model (moderation's "Moderated turn") lives where its concrete model's rows do.
    meta = model_or_instance._meta.concrete_model._meta
    return meta.app_label in settings.CHAT_REGIONAL_APPS or meta.label_lower in getattr(
        settings, "CHAT_REGIONAL_MODELS", ()
    )


class PrimaryReplicaRouter:
    """``settings.DATABASE_ROUTERS`` entry; see the module docstring for the rules."""

    def _route(self, model, hints) -> tuple[str, int | None, Pin | None]:
        """(primary alias, user on whose behalf, pin) for a query on a regional ``model``."""
        pin = _pin.get()
        if hints.get("primary"):  # a manager from core.regions.manager()
            return primary_of(hints["primary"]), hints.get("user_id"), None
        instance = hints.get("instance")
        user_id = pin.user_id if pin is not None else None
        if instance is not None and _is_regional(instance):
            owner = _locator.instance_owner(instance) if _locator is not None else None
            if owner is not None:
                user_id = owner
            if instance._state.db:
                return primary_of(instance._state.db), user_id, pin
            db = _locator.instance_db(instance) if _locator is not None else None
            if db is not None:
                return db, user_id, pin
        elif instance is not None and user_id is None and instance._meta.label == settings.AUTH_USER_MODEL:
            user_id = instance.pk  # a user's related manager (``user.conversations``)
        if pin is not None:
            return pin.primary, user_id, pin
        return default_db(), user_id, pin

    def db_for_read(self, model, **hints) -> str:
        if not _is_regional(model):
            return DEFAULT_DB_ALIAS
        primary, user_id, pin = self._route(model, hints)
        return _read_alias(primary, user_id, pin)

    def db_for_write(self, model, **hints) -> str:
        if not _is_regional(model):
            return DEFAULT_DB_ALIAS
        primary, user_id, pin = self._route(model, hints)
        while pin is not None:  # this call and the calls it is nested in read what they wrote
            if pin.primary == primary:
                pin.wrote = True
            pin = pin.outer
        note_write(user_id)
        return primary

    def allow_relation(self, obj1, obj2, **hints) -> bool | None:
        """Global rows may be referenced from any cluster (by id, no FK constraint); regional
        rows only from their own cluster."""
        if not (_is_regional(obj1) and _is_regional(obj2)):
            return True
        db1, db2 = obj1._state.db, obj2._state.db
        if db1 is None or db2 is None:
            return None
        return primary_of(db1) == primary_of(db2)

    def allow_migrate(self, db: str, app_label: str, model_name=None, **hints) -> bool | None:
        """Replicas are physical copies: never migrated. ``default`` gets every app (it also
        holds the default region's conversations unless that region has its own database); a
        region's database gets the regional apps and ``CHAT_REGIONAL_MODELS`` only (a RunSQL
        operation is for one of those when its ``hints`` name the model)."""
        if is_replica(db):
            return False
        if db == DEFAULT_DB_ALIAS:
            return True
        if db in getattr(settings, "CHAT_REGION_DATABASES", {}).values():
            if app_label in settings.CHAT_REGIONAL_APPS:
                return True
            label = f"{app_label}.{(model_name or '').lower()}"
            return model_name is not None and label in getattr(
                settings, "CHAT_REGIONAL_MODELS", ()
            )
        return None
