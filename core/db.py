"""The database from async code: work that outlives the request that started it runs on the
loop's bounded executor and closes its connections; a streaming view gives its connection back
after its last query."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connections


async def release_db_connection() -> None:
    """Close this request's database connection; call it in a streaming view after its last
    query. A stream can stay open for minutes and must not pin one of PostgreSQL's ~100
    sessions meanwhile (measured: 1 session per open stream, "too many clients" at ~97)."""
    await sync_to_async(_close_connection)()


def _close_connection() -> None:
    # Connections resolve per thread: close them here, in the worker thread that owns them;
    # every alias it used (replicas, regions: core/dbrouter.py).
    connections.close_all()


async def run_in_db_thread(fn, /, **kwargs):
    """Run the blocking ORM call ``fn(**kwargs)`` for work that outlives the request that
    started it (a generation task, a write-back), and return its result.

    Django closes a request's connections when the request finishes; such a task's calls would
    otherwise open a connection per asgiref thread and never close it, until PostgreSQL refuses
    clients (seen in the benchmark: "too many clients already" at 32 concurrent chats). So the
    call runs on the loop's bounded default executor and closes every connection it used
    (default, replicas, regions) afterwards. Exceptions from ``fn`` propagate.
    """

    def call():
        try:
            return fn(**kwargs)
        finally:
            connections.close_all()

    return await sync_to_async(call, thread_sensitive=False)()
