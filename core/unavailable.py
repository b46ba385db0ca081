"""A database that cannot be reached is a 503 with ``Retry-After``, never a 500 (issue 26).

While a primary is down (a Patroni failover, a region's outage) a request can fail three ways,
and all three mean the same thing to the person who sent it, "not now, try again shortly":

- core/db_breaker.py ``PrimaryDown``: a conversation write refused by its region's breaker
  (an ``ApiError`` 503 that already carries its ``Retry-After``);
- Django's ``OperationalError``: a connect that failed, a pooled connection that could not be had
  within ``DB_POOL_TIMEOUT_S`` (psycopg_pool's ``PoolTimeout``, which Django re-raises as
  ``OperationalError``), a server that went away mid-query;
- Django's ``InterfaceError``: a connection already closed under the request.

:func:`unavailable_error` maps each to one :class:`ApiError` 503 ``unavailable``;
chatsite/middleware.py renders it for every entrypoint (the API's JSON error, the chat page's
message above the box, the site's own 503 page), and chatsite/error_pages.py does the same for
an error raised in middleware, before any view ran. Nothing is acknowledged that was not
stored: every write is one transaction that either committed before the error or did not.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import InterfaceError, OperationalError

from core.errors import ApiError

MESSAGE = (
    "The service cannot reach its database right now (it is switching to a standby server, "
    "which takes up to half a minute). Your chats are safe, but this request was not carried "
    "out: try again in {s} s."
)


def retry_after_s() -> int:
    """Whole seconds (>= 1) a client should wait before retrying a request refused because the
    database is unreachable: the primary breaker's cool-down, ``CHAT_REGION_BREAKER_OPEN_S``
    (the time before a write probes the primary again; docs/operations.md "Failover")."""
    return max(1, math.ceil(settings.CHAT_REGION_BREAKER_OPEN_S))


def unavailable_error(exc: BaseException) -> ApiError | None:
    """The 503 refusal that ``exc`` stands for, or None when ``exc`` is not about reaching the
    database. An ``ApiError`` 503 (``PrimaryDown``) is returned as it is; an ``OperationalError``
    or ``InterfaceError`` becomes ``ApiError(503, "unavailable", ...)`` with ``Retry-After``
    (:func:`retry_after_s`). Other database errors (an ``IntegrityError``, a ``DataError``) are
    bugs or bad input, not outages, and stay None."""
    if isinstance(exc, ApiError):
        return exc if exc.status == 503 and exc.type == "unavailable" else None
    if isinstance(exc, (OperationalError, InterfaceError)):
        seconds = retry_after_s()
        return ApiError(503, "unavailable", MESSAGE.format(s=seconds), {"Retry-After": str(seconds)})
    return None
