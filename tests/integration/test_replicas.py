"""Read replicas with read-your-writes, against a real primary and a real streaming replica
(issue 4, "Replicas and regions").

Two PostgreSQL 16 clusters (tests/pgcluster.py): a primary and a replica made from it with
``pg_basebackup -R``, streaming its WAL. The app runs in its own process configured only by its
environment (``DATABASE_URL`` = the primary, ``DATABASE_REPLICA_URLS`` = the replica), and each
op reports the server that answered its conversation queries, asked on the connection the
router picked (``inet_server_port()``, ``pg_is_in_recovery()``). Where it matters the replica is
made to lag (``pg_wal_replay_pause()``): what a read returns then shows which server answered.
"""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import AppProcess, clusters, wait_replayed

WINDOW_S = 2.0  # CHAT_READ_YOUR_WRITES_S in the app under test
PEOPLE = ("ann", "ben", "cat", "dov", "eve", "fay")


@pytest.fixture(scope="module")
def servers():
    with clusters() as made:
        primary = made.primary("primary")
        replica = made.replica(primary, "replica")
        yield SimpleNamespace(primary=primary, replica=replica)


def app_env(servers, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": servers.primary.url(),
        "DATABASE_REPLICA_URLS": servers.replica.url(),
        "REDIS_URL": settings.REDIS_URL,
        "CHAT_READ_YOUR_WRITES_S": str(WINDOW_S),
        # The hot cache off: a Redis copy would answer some history reads, and what these tests
        # look at is which database answers (with it on, the cache's own fall-through reads take
        # the same route: regions.routed, nested pins).
        "CHAT_HOT_CACHE_TURNS": "0",
        **extra,
    }


@pytest.fixture(scope="module")
def app(servers):
    with AppProcess(app_env(servers)) as app:
        app.call("migrate")
        yield app


@pytest.fixture(scope="module")
def people(app, servers) -> dict[str, SimpleNamespace]:
    """Users, each with a conversation of one turn, replicated, their write window over."""
    found = {}
    for name in PEOPLE:
        username = f"{name}-{uuid.uuid4().hex[:6]}"
        app.call("user_create", username=username, region="eu-west")
        conversation_id = app.call("conversation_create", username=username).value["conversation_id"]
        turn_id = app.call(
            "turn_append_user", username=username, conversation_id=conversation_id, content="hi"
        ).value
        found[name] = SimpleNamespace(username=username, conversation_id=conversation_id, turn_ids=[turn_id])
    wait_replayed(servers.primary, servers.replica)
    time.sleep(WINDOW_S + 0.2)
    return found


@pytest.fixture
def lagging_replica(servers):
    """The replica stops applying WAL for the test (it still receives it), then catches up."""
    servers.replica.pause_replay()
    try:
        yield servers.replica
    finally:
        servers.replica.resume_replay()
        wait_replayed(servers.primary, servers.replica)


def test_writes_go_to_the_primary(app, servers, people):
    """Given a conversation, when a turn is appended, then every query of the write ran on the
    primary (the replica is read-only: a write routed there would fail)."""
    person = people["ann"]

    reply = app.call(
        "turn_append_user", username=person.username, conversation_id=person.conversation_id, content="two"
    )

    assert reply.ports == {servers.primary.port}
    assert [s["in_recovery"] for s in reply.servers] == [False]
    rows = servers.primary.query("SELECT count(*) FROM conversations_turn WHERE conversation_id = %s",
                                 (person.conversation_id,))  # fmt: skip
    assert rows == [(2,)]


def test_reads_go_to_the_replica(app, servers, people):
    """Given a conversation written more than the read-your-writes window ago, when its history
    page is read, then the replica answers every query of the read."""
    person = people["ben"]

    reply = app.call("history", username=person.username, conversation_id=person.conversation_id)

    assert reply.value == person.turn_ids
    assert reply.ports == {servers.replica.port}
    assert all(s["in_recovery"] for s in reply.servers)


def test_the_writer_reads_from_the_primary_within_the_window(app, servers, people, lagging_replica):
    """Read-your-writes. Given a replica that lags, when a user appends a turn and at once reads
    the history, then the primary answers and the new turn is there."""
    person = people["cat"]

    new = app.call(
        "turn_append_user", username=person.username, conversation_id=person.conversation_id, content="new"
    ).value
    reply = app.call("history", username=person.username, conversation_id=person.conversation_id)

    assert reply.value == [*person.turn_ids, new]
    assert reply.ports == {servers.primary.port}


def test_the_writer_reads_from_the_replica_again_after_the_window(app, servers, people, lagging_replica):
    """Given a replica that lags, when a user appends a turn and reads the history only after
    the window, then the replica answers, without the new turn (it has not replayed it): the
    read really came from the replica."""
    person = people["dov"]
    app.call("turn_append_user", username=person.username, conversation_id=person.conversation_id, content="new")

    time.sleep(WINDOW_S + 0.3)
    reply = app.call("history", username=person.username, conversation_id=person.conversation_id)

    assert reply.ports == {servers.replica.port}
    assert reply.value == person.turn_ids


def test_read_your_writes_holds_in_another_gateway_process(app, servers, people, lagging_replica):
    """Given two gateway processes sharing Redis and a replica that lags, when a user writes
    through one and at once reads through the other, then the other reads from the primary and
    sees the write (the window is marked in Redis, not only in the writer's memory)."""
    person = people["eve"]
    with AppProcess(app_env(servers)) as other_gateway:
        other_gateway.call("conversation_list", username=person.username)  # started and warm

        new = app.call(
            "turn_append_user", username=person.username, conversation_id=person.conversation_id, content="new"
        ).value
        reply = other_gateway.call("history", username=person.username, conversation_id=person.conversation_id)

    assert reply.value == [*person.turn_ids, new]
    assert reply.ports == {servers.primary.port}


def test_other_users_keep_reading_from_the_replica_while_one_writes(app, servers, people):
    """Given one user who has just written, when another user reads their own conversation,
    then the replica answers (read-your-writes is per user, not a global switch)."""
    writer, reader = people["ann"], people["fay"]
    app.call("turn_append_user", username=writer.username, conversation_id=writer.conversation_id, content="x")

    reply = app.call("history", username=reader.username, conversation_id=reader.conversation_id)

    assert reply.ports == {servers.replica.port}


def test_reads_go_to_the_primary_when_redis_cannot_say_who_wrote(servers, people, tmp_path):
    """Given a gateway whose Redis is unreachable (so it cannot know whether another process
    just wrote for the user), when it reads a history, then the primary answers: consistency
    first, the same as running without replicas."""
    person = people["fay"]
    env = app_env(servers, REDIS_URL=f"unix://{tmp_path}/no-redis.sock?db=0")
    with AppProcess(env) as gateway_without_redis:
        reply = gateway_without_redis.call(
            "history", username=person.username, conversation_id=person.conversation_id
        )

    assert reply.ports == {servers.primary.port}
    assert reply.value[: len(person.turn_ids)] == person.turn_ids
