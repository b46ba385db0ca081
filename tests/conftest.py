"""Shared fixtures.

- ``engine_double``: the scripted engine (``tests/fakes.py``) as the process's engine.
- ``chat_server``: uvicorn (the production ASGI server, configured by chatsite/serve.py) in a
  thread of this process, on its own event loop, serving the
  real app with the real vLLM engine. Started once per test session, on first use, and shared by
  every real-engine and browser test; tests reach the same engine object through it.
- ``make_user`` / ``login``: accounts and signed-in HTTP clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from django.conf import settings
from django.db import DatabaseError

import inference.engine as engine_module
from chatsite.serve import ThreadedServer, serve_in_thread
from conversations import locks, turnstream
from tests.fakes import ScriptedEngine
from tests.processes import RemoteServer

# Helpers that came out of test modules (issue 31) keep pytest's assertion messages.
pytest.register_assert_rewrite(
    "tests.api_support", "tests.chat_support", "tests.versions_support", "tests.browser.chat_ui_support"
)

PASSWORD = "correct-horse-battery-staple-42"


# Tables whose rows a DELETE may not remove (append-only triggers, audit/migrations): the flush
# truncates them (TRUNCATE is not a row operation).
TRUNCATED_BY_FLUSH = ("audit_auditentry", "audit_auditdetail")
# Tables the flush keeps: what migrations put there is what the post_migrate signal that follows
# a flush would insert again row by row (content types, permissions); it finds them present.
KEPT_BY_FLUSH = ("django_content_type", "auth_permission")
# How often a flush that failed (a late request's locks or rows) is tried again.
FLUSH_ATTEMPTS = 4


@pytest.fixture(autouse=True, scope="session")
def _flush_by_delete():
    """Transactional tests empty the database after each test (Django's flush: one ``TRUNCATE``
    of every table). TRUNCATE makes new files for each table, its partitions and indexes: ~0.3 s
    a flush here, some 3-4 minutes over the suite's ~700 transactional tests. A test leaves a
    few rows, which ``DELETE`` removes in milliseconds; every foreign key is DEFERRABLE
    INITIALLY DEFERRED (Django's and ours), so the deletes run in any order inside the flush's
    transaction (django/db/backends/base/operations.py ``execute_sql_flush``). Sequences are not
    reset either way (``reset_sequences`` keeps Django's TRUNCATE ... RESTART IDENTITY). Content
    types and permissions are kept (:data:`KEPT_BY_FLUSH`)."""
    from django.db.backends.postgresql.operations import DatabaseOperations  # noqa: PLC0415

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        truncated = [t for t in tables if t in TRUNCATED_BY_FLUSH]
        deleted = [t for t in tables if t not in TRUNCATED_BY_FLUSH and t not in KEPT_BY_FLUSH]
        return [
            "SET CONSTRAINTS ALL DEFERRED;",
            *(f"DELETE FROM {self.quote_name(t)};" for t in deleted),
            *truncate(self, style, truncated),
        ]

    execute = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        # A request the browser sent as the test ended can still be writing (its transaction
        # holds row locks the deletes wait on, or it deadlocks with them, or it commits a row
        # that points at one just deleted): the flush's transaction rolls back whole, so it is
        # run again once that request has ended (CI: "Database test_chat_N couldn't be flushed").
        for attempt in range(FLUSH_ATTEMPTS):
            try:
                return execute(self, sql_list)
            except DatabaseError:
                if attempt == FLUSH_ATTEMPTS - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
        return None

    DatabaseOperations.sql_flush = sql_flush
    DatabaseOperations.execute_sql_flush = execute_sql_flush
    try:
        yield
    finally:
        DatabaseOperations.sql_flush = truncate
        DatabaseOperations.execute_sql_flush = execute


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing():
    # PBKDF2 with Django's iteration count costs ~0.3 s a user; tests need no real hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True, scope="session")
def _moderation_deadline_for_a_shared_machine():
    """The input check's deadline is 10 s in tests, not production's 1 s
    (``CHAT_MODERATION_TIMEOUT_S``): on 2 cores shared by the engine, a browser and the test
    process a ~30 ms check has been seen to wait past 1 s, and the turn was refused
    ``moderation_unavailable`` in a test about something else. Tests of the deadline set their
    own (tests/test_moderation_acheck.py, tests/test_moderation_gates_output.py)."""
    settings.CHAT_MODERATION_TIMEOUT_S = 10


@pytest.fixture(autouse=True, scope="session")
def _fixed_admission_cap():
    """The adaptive admission cap and the expected-wait shedding are off in tests unless a test
    turns them on (tests/test_admission_adaptive.py, tests/integration/test_admission_real.py):
    the real engine is shared by the whole session, and a cap one test's load lowered must not
    queue or shed another test's turns."""
    settings.CHAT_ADMISSION_ADAPTIVE = False
    settings.CHAT_SHED_FREE_WAIT_S = 0.0


@pytest.fixture(autouse=True, scope="session")
def _moderation_classifiers_loaded():
    """Load the moderation classifiers once (as the server does at start, chatsite/asgi.py), so
    no test's first turn waits for them past the check timeout."""
    from moderation.base import moderator  # noqa: PLC0415
    from moderation.verdicts import policy_for  # noqa: PLC0415

    moderator().check_input("warm-up", policy_for(None))
    moderator().check_output("warm-up", policy_for(None))
    # The memory embedding model too (the server warms both): a turn embeds its message beside
    # the input check, and a first load (~2 s of imports holding the GIL) would starve it.
    from inference.embeddings import embeddings_warm  # noqa: PLC0415

    embeddings_warm()


@pytest.fixture(autouse=True, scope="session")
def _celery_tasks_run_in_process():
    """Celery tasks run inline (eagerly) in this process unless a test starts a real worker
    (tests/processes.py: celery_worker_process), as the tests of at-least-once delivery do."""
    from chatsite.celery import app  # noqa: PLC0415

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture(autouse=True, scope="session")
def _release_test_database(django_db_setup, django_db_blocker):
    """Close sessions other threads left open (the async ORM's executor thread, the server
    thread) so the test database can be dropped at the end."""
    yield
    from django.db import connection  # noqa: PLC0415

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True, scope="session")
def _memory_block_warm_off():
    """No memory block warm-up (conversations/prefix_warm.py) unless a test turns it on (with the ``settings``
    fixture, which puts this back): it calls the model endpoint (settings.CHAT_INTERNAL_API_URL),
    which most tests do not serve. Session-scoped on purpose: an autouse function fixture
    taking ``settings`` would set that fixture up before every module's own autouse fixtures,
    so their teardowns would run with a test's settings still in place."""
    settings.CHAT_MEMORY_BLOCK_WARM = False


@pytest.fixture
def engine_double() -> Iterator[ScriptedEngine]:
    """Install a fresh ScriptedEngine as the process's engine; restore the previous one after."""
    previous = engine_module._engine
    double = ScriptedEngine()
    engine_module._engine = double
    try:
        yield double
    finally:
        engine_module._engine = previous


@pytest.fixture(autouse=True)
def _clean_stream_registry():
    yield
    turnstream._streams.clear()
    turnstream._busy.clear()
    turnstream._by_answer.clear()
    locks._claimed.clear()


@pytest.fixture
def make_user(django_user_model):
    """Create a user: ``make_user("alice", tier="paid")``; the password is ``PASSWORD``."""
    counter = iter(range(1_000_000))

    def make(username: str | None = None, **fields):
        name = username or f"user{next(counter)}"
        return django_user_model.objects.create_user(username=name, password=PASSWORD, **fields)

    return make


@dataclass
class ChatServer:
    """uvicorn on 127.0.0.1:``port`` in a background thread, with the real engine; ``loop`` is
    the server's event loop (run code there with :meth:`call`)."""

    url: str
    loop: asyncio.AbstractEventLoop
    engine: engine_module.VllmEngine
    server: ThreadedServer

    def call(self, coro, timeout: float = 30):
        """Run ``coro`` in the server's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def unfinished(self) -> int:
        """The real engine's unfinished request count (read in the server's loop)."""
        return self.call(_unfinished(self.engine))

    def drain(self, timeout: float = 30) -> None:
        """Wait until no generation task is running in the server."""

        async def wait_all():
            tasks = [s.task for s in list(turnstream._streams.values()) if s.task]
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)

        self.call(wait_all(), timeout + 5)

    def settle(self, timeout: float = 2) -> None:
        """Wait up to ``timeout`` seconds for the requests the server is still answering to end
        (the page's own requests sent as a test ended), so the flush after the test does not
        race them; a stream a browser still holds open is not waited for beyond that."""
        deadline = time.monotonic() + timeout
        while self.server.server.server_state.tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def login(self, username: str, password: str = PASSWORD) -> httpx.Client:
        """A client signed in through the real login form (session cookie + CSRF)."""
        client = self.client()
        client.get("/accounts/login/")
        response = client.post(
            "/accounts/login/",
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        assert response.status_code == 302, response.text
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
        return client


async def _unfinished(engine) -> int:
    return engine.num_unfinished_requests()


@pytest.fixture(scope="session")
def chat_server(django_db_setup, django_db_blocker) -> Iterator[ChatServer]:
    """Start uvicorn with the real engine once per session (the engine warms up before use)."""
    from chatsite.asgi import application  # noqa: PLC0415

    real = engine_module.VllmEngine.from_settings()
    engine_module._engine = real
    server = serve_in_thread(application)
    chat = ChatServer(
        url=f"http://127.0.0.1:{server.port}", loop=server.loop, engine=real, server=server
    )
    chat.call(real.ensure_started(), timeout=600)
    try:
        yield chat
    finally:
        with contextlib.suppress(Exception):
            chat.drain(10)
        real.shutdown()
        engine_module._engine = None
        server.stop()


@pytest.fixture
def live(chat_server, transactional_db) -> Iterator[ChatServer]:
    """The shared server for one test, with committed test data and the real engine installed;
    waits for every generation to end before the test's data is flushed."""
    previous = engine_module._engine
    engine_module._engine = chat_server.engine
    try:
        yield chat_server
    finally:
        chat_server.drain()
        chat_server.settle()
        engine_module._engine = previous


class _VllmServe:
    """The session's ``vllm serve``: started on first use, started again if a test killed it."""

    def __init__(self, tmp_path_factory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.stack = contextlib.ExitStack()
        self.server: RemoteServer | None = None

    def get(self) -> RemoteServer:
        from tests.processes import vllm_server  # noqa: PLC0415 - real-engine tests only

        if self.server is None or self.server.proc.poll() is not None:
            self.stack.close()
            self.stack = contextlib.ExitStack()
            self.server = self.stack.enter_context(vllm_server(str(self.tmp_path_factory.mktemp("vllm"))))
        return self.server

    def close(self) -> None:
        from tests.processes import group_alive  # noqa: PLC0415

        self.stack.close()
        assert self.server is None or not group_alive(self.server.proc.pid)


@pytest.fixture(scope="session")
def _vllm_serve_holder(tmp_path_factory) -> Iterator[_VllmServe]:
    holder = _VllmServe(tmp_path_factory)
    try:
        yield holder
    finally:
        holder.close()  # nothing of it (API server, EngineCore, worker) outlives the session


@pytest.fixture
def vllm_serve(_vllm_serve_holder) -> RemoteServer:
    """vLLM's own OpenAI server (``vllm serve``) for the shipped model, started when a test
    first asks for it and shared by the rest of the session: the remote pool's tests
    (tests/integration/test_remote_pool.py) and then the node-failover test, which uses it as
    its second node and SIGKILLs it (tests/integration/test_zy_node_failover.py; a later test
    that asks for it gets a new one). One start (~50 s on the CPU) instead of one per module."""
    return _vllm_serve_holder.get()


def pytest_collection_modifyitems(config, items):
    """``make screenshots``'s writer (marked ``screenshots``) runs only when asked for
    (``CHAT_SCREENSHOTS_DIR`` set): otherwise it is deselected, not collected as a skip."""
    if os.environ.get("CHAT_SCREENSHOTS_DIR"):
        return
    kept = [item for item in items if item.get_closest_marker("screenshots") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
