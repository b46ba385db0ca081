"""Failover without a config change (issue 4, "Replicas and regions").

A real primary and a real standby streaming from it (tests/pgcluster.py), with synchronous
replication (``synchronous_standby_names = '*'``: a commit returns once the standby has it, so a
promotion loses no committed turn). The app runs in its own process with one connection string
naming both hosts, libpq style::

    postgresql://postgres@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/chat?target_session_attrs=read-write

While a conversation is open the primary is killed (``pg_ctl stop -m immediate``: no shutdown
checkpoint, as in a crash) and the standby promoted. The same app process, with the same
settings, then writes the next turns to the promoted server on its own.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import AppProcess, clusters


@pytest.fixture(scope="module")
def failed_over():
    """The app, a conversation with turns written before the failover, then the failover."""
    with clusters() as made:
        primary = made.primary("primary")
        standby = made.replica(primary, "standby")
        primary.require_synchronous_standby()
        url = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/chat"
            "?target_session_attrs=read-write&connect_timeout=5"
        )
        with AppProcess({"DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL}) as app:
            app.call("migrate")
            app.call("user_create", username="ada", region="eu-west")
            conversation_id = app.call("conversation_create", username="ada").value["conversation_id"]
            before = []
            for n in range(3):
                question = app.call(
                    "turn_append_user", username="ada", conversation_id=conversation_id, content=f"q{n}"
                )
                answer = app.call(
                    "turn_append_assistant", conversation_id=conversation_id, reply_to_id=question.value,
                    content=f"a{n}",
                )  # fmt: skip
                assert question.ports == answer.ports == {primary.port}
                before += [question.value, answer.value]

            primary.stop("immediate")
            standby.promote()

            yield SimpleNamespace(
                app=app, primary=primary, standby=standby, conversation_id=conversation_id, before=before
            )


def test_new_turns_are_written_to_the_promoted_standby(failed_over):
    """Given the primary killed and its standby promoted, when the open conversation gets new
    turns through the same app process (no config change, no restart), then they are written,
    to the promoted server."""
    f = failed_over

    question = f.app.call("turn_append_user", username="ada", conversation_id=f.conversation_id, content="after")
    answer = f.app.call(
        "turn_append_assistant", conversation_id=f.conversation_id, reply_to_id=question.value, content="yes"
    )

    assert question.ports == answer.ports == {f.standby.port}
    assert [s["in_recovery"] for s in question.servers + answer.servers] == [False, False]
    stored = f.standby.query("SELECT count(*) FROM conversations_turn WHERE turn_id IN (%s, %s)",
                             (question.value, answer.value))  # fmt: skip
    assert stored == [(2,)]


def test_no_turn_written_before_the_failover_is_missing(failed_over):
    """Given the failover, when the conversation's history is read, then every turn written
    before it is there, in order."""
    f = failed_over

    history = f.app.call("history", username="ada", conversation_id=f.conversation_id)

    assert history.value[: len(f.before)] == f.before
    assert history.ports == {f.standby.port}
