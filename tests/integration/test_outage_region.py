"""Outage region: a region whose primary is down (issue 20 part 4; core/db_breaker.py).

Real clusters (tests/pgcluster.py): ``default`` (global data), eu-west's primary with a streaming
replica, and us-east's primary; failover regions eu-west <-> us-east. The app runs in its own
process configured only by its environment, and answers ``/v1`` requests through Django's
handler. eu-west's primary is then stopped as in a crash (``pg_ctl stop -m immediate``): no test
tells the app; its circuit breaker opens on failed connects (N = 2 here).
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import AppProcess, clusters, wait_replayed

FAILURES = 2
OPEN_S = 3


@pytest.fixture(scope="module")
def outage():
    with clusters() as made:
        everyone = made.primary("global")
        eu, us = made.primary("eu-west"), made.primary("us-east")
        eu_replica = made.replica(eu, "eu-west-replica")
        env = {
            "DATABASE_URL": everyone.url(),
            "CHAT_REGION_DATABASE_URLS": json.dumps(
                {"eu-west": [eu.url(), eu_replica.url()], "us-east": us.url()}
            ),
            "CHAT_DEFAULT_REGION": "eu-west",
            "CHAT_REGION_FAILOVER": json.dumps({"eu-west": "us-east", "us-east": "eu-west"}),
            "CHAT_REGION_BREAKER_FAILURES": str(FAILURES),
            "CHAT_REGION_BREAKER_OPEN_S": str(OPEN_S),
            "DB_POOL_MAX": "0",  # a refused connect fails at once (docs/operations.md "Failover")
            "REDIS_URL": settings.REDIS_URL,
        }
        with AppProcess(env, module="tests.ha_load") as app:
            for database in ("default", "region_eu-west", "region_us-east"):
                app.call("migrate", database=database)
            app.call("user_create", username="una", region="eu-west")  # no organisation
            app.call("user_create", username="eve", region="eu-west")
            org_id = app.call("org_join", username="eve", slug="acme-eu", region="eu-west").value
            existing = app.call(
                "api", username="una", method="POST", path="/v1/conversations", body={}
            )
            assert existing.value["status"] == 201 and existing.value["json"]["region"] == "eu-west"
            conversation_id = existing.value["json"]["conversation_id"]
            before = []
            for n in range(2):
                question = app.call("turn_append_user", username="una", conversation_id=conversation_id,
                                    content=f"q{n}").value  # fmt: skip
                answer = app.call("turn_append_assistant", conversation_id=conversation_id,
                                  reply_to_id=question, content=f"a{n}").value  # fmt: skip
                before += [question, answer]
            wait_replayed(eu, eu_replica)

            eu.stop("immediate")
            creates = [
                app.call(
                    "api", username="una", method="POST", path="/v1/conversations", body={}
                ).value
                for _ in range(FAILURES + 1)
            ]
            yield SimpleNamespace(
                app=app, eu=eu, us=us, eu_replica=eu_replica, conversation_id=conversation_id,
                before=before, creates=creates, org_id=org_id,
            )  # fmt: skip


def test_new_conversations_land_in_the_failover_region_after_n_failed_connects(outage):
    """Given eu-west's primary down, when a user without an organisation starts conversations,
    then the first N - 1 get 503 + Retry-After while the breaker counts failed connects, and
    from the Nth on they are created in us-east, which /v1 says in ``region``; the rows are on
    us-east's server."""
    refused, *created = outage.creates
    assert refused["status"] == 503 and int(refused["retry_after"]) >= 1
    assert [c["status"] for c in created] == [201] * FAILURES
    assert {c["json"]["region"] for c in created} == {"us-east"}
    ids = [c["json"]["conversation_id"] for c in created]
    assert outage.us.query(
        "SELECT count(*) FROM conversations_conversation WHERE conversation_id::text = ANY(%s)", (ids,)
    ) == [(FAILURES,)]  # fmt: skip


def test_a_write_to_an_existing_conversation_gets_503_with_retry_after(outage):
    """Given the breaker open, when the user writes to their eu-west conversation, then the
    write is refused with a 503 a person can act on and an integer Retry-After (PF-R3)."""
    refused = outage.app.call(
        "api", username="una", method="POST", path=f"/v1/conversations/{outage.conversation_id}/turns",
        body={"role": "user", "content": "are you there?"},
    ).value  # fmt: skip

    assert refused["status"] == 503
    assert 1 <= int(refused["retry_after"]) <= OPEN_S
    assert refused["json"]["error"]["type"] == "unavailable"
    assert refused["json"]["error"]["region"] == "eu-west"
    assert "history can still be read" in refused["json"]["error"]["message"]


def test_history_is_served_from_the_replica(outage):
    """Given the primary down, when the conversation's history is read (by the user who wrote
    it a moment ago: read-your-writes would pick the primary), then every turn comes back, read
    on eu-west's replica; /v1 serves it too."""
    history = outage.app.call("history", username="una", conversation_id=outage.conversation_id)
    page = outage.app.call("api", username="una", method="GET",
                           path=f"/v1/conversations/{outage.conversation_id}").value  # fmt: skip

    assert history.value == outage.before
    assert history.ports == {outage.eu_replica.port}
    assert all(s["in_recovery"] for s in history.servers)
    assert page["status"] == 200
    assert [t["turn_id"] for t in page["json"]["turns"]] == outage.before


def test_an_eu_only_organisation_gets_503_never_a_us_conversation(outage):
    """Given the breaker open and a failover region in another residency zone, when a member
    of an eu-west organisation starts a conversation, then 503 + Retry-After, and us-east holds
    no conversation of that organisation."""
    refused = outage.app.call(
        "api", username="eve", method="POST", path="/v1/conversations", body={}
    ).value

    assert refused["status"] == 503 and int(refused["retry_after"]) >= 1
    assert "EU" in refused["json"]["error"]["message"]
    assert outage.us.query(
        "SELECT count(*) FROM conversations_conversation WHERE org_id = %s", (outage.org_id,)
    ) == [(0,)]  # fmt: skip


def test_the_breaker_closes_when_the_primary_is_back(outage):
    """Given eu-west's primary started again, when the cool-down has passed, then the probe
    connects and new conversations are created in eu-west again. (Runs last: it ends the
    outage.)"""
    outage.eu.start()
    time.sleep(OPEN_S + 0.5)

    created = outage.app.call(
        "api", username="una", method="POST", path="/v1/conversations", body={}
    ).value

    assert created["status"] == 201 and created["json"]["region"] == "eu-west"
