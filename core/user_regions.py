"""A user's own regional data, which belongs to no conversation (their memory facts and memory
block): it lives in their home region's database (:func:`user_db`), and the memory selectors
and services say whose data they work on by decorating themselves with :func:`for_user`
(reads) or :func:`atomic_for_user` (writes: also one transaction on that database), or by
:func:`user_pinned` around a block. Conversations are routed by core/regions.py, whose
``home_region`` decides the region for both.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator

from django.db import DEFAULT_DB_ALIAS, router, transaction
from django.db.models import QuerySet

from core import dbrouter
from core.dbrouter import multi_region
from core.regions import call_arguments, db_for_region, home_region


def user_db(*, user=None, user_id: int | None = None) -> str:
    """The primary alias holding ``user``'s regional data that belongs to no conversation (their
    memory facts and memory block): their home region's database (core/regions.py ``home_region``: their
    first organisation's region, else their own). ``user_id`` instead of ``user`` loads the user
    (one query on ``default``). One database: ``default``, no query.

    Raises RegionUnavailable when that region has no database here (storing the data elsewhere
    would break its residency), and the user model's DoesNotExist for an unknown ``user_id``.
    A user whose home region changes (they join an organisation elsewhere) finds their facts in
    the new region only: facts are not moved between regions.
    """
    if not multi_region():
        return DEFAULT_DB_ALIAS
    if user is None:
        from django.contrib.auth import get_user_model  # noqa: PLC0415

        user = get_user_model().objects.only("pk", "region").get(pk=user_id)
    region, _org = home_region(owner=user)
    return db_for_region(region)


# The user whose regional data the running call works on, and its database: nested memory
# selectors of the same user reuse it instead of asking home_region again.
_user_pin: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar(
    "user_db_pin", default=None
)


@contextlib.contextmanager
def user_pinned(*, user=None, user_id: int | None = None, atomic: bool = False) -> Iterator[str]:
    """Pin the block to :func:`user_db` of ``user`` (or ``user_id``), on that user's behalf
    (read-your-writes); ``atomic``: also one transaction on that database. Yields the primary
    alias. Raises as :func:`user_db`."""
    user_id = int(user.pk if user is not None else user_id)
    outer = _user_pin.get()
    if outer is not None and outer[0] == user_id:
        db = outer[1]
    else:
        db = user_db(user=user) if user is not None else user_db(user_id=user_id)
    token = _user_pin.set((user_id, db))
    try:
        with dbrouter.pinned(db, user_id):
            if atomic:  # a savepoint when nested: a refused write rolls back only itself
                with transaction.atomic(using=db):
                    yield db
            else:
                yield db
    finally:
        _user_pin.reset(token)


def _user_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    arguments = call_arguments(signature, args, kwargs)
    user = arguments.get("user")
    if user is not None:
        return {"user": user}
    return {"user_id": arguments.get("user_id")}


def for_user(fn: Callable) -> Callable:
    """Decorate a selector of a user's own regional data (memory): its queries go to the cluster
    of :func:`user_db` for its ``user`` (or ``user_id``) argument, on that user's behalf
    (read-your-writes). A QuerySet it returns is bound to that database."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with user_pinned(**_user_arguments(signature, args, kwargs)):
            result = fn(*args, **kwargs)
            if isinstance(result, QuerySet) and result._db is None:
                result = result.using(router.db_for_read(result.model))
        return result

    return wrapper


def atomic_for_user(fn: Callable) -> Callable:
    """Decorate a service writing a user's own regional data (memory): like :func:`for_user`,
    and the call is one transaction on that database (as :func:`atomic`; put it under
    ``@transaction.atomic`` when the service also writes ``default``)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with user_pinned(**_user_arguments(signature, args, kwargs), atomic=True):
            return fn(*args, **kwargs)

    return wrapper
