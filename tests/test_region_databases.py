"""Memory facts and the usage ledger across regions (issue 20 part 1, "Region-scoped stores"): a
user's facts, with their embeddings, and their memory block live in their home region's
database; extraction markers and ledger rows in their conversation's.

Two real PostgreSQL clusters (tests/pgcluster.py): ``default`` (accounts, and the default region
eu-west's data) and us-east's own database, both migrated with ``migrate --database=...`` (so the
memory migrations, pgvector included, run on the region's database). The app runs in a
subprocess configured only by its environment (``CHAT_REGION_DATABASE_URLS``); it runs the
scenario below once (``python -m tests.test_region_databases``) and reports what it read and which
database each memory query ran on; the tests check the report and look at the servers directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import ROOT, clusters

US_EAST = "region_us-east"
MEMORY_TABLES = ("user_memory", "memory_block", "memory_extractionmarker")


@pytest.fixture(scope="module")
def servers():
    with clusters() as made:
        yield SimpleNamespace(
            default=made.primary("global-eu-west"), us_east=made.primary("us-east")
        )


@pytest.fixture(scope="module")
def report(servers) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings.base",
        "DB_POOL_MAX": "4",
        "CELERY_TASK_ALWAYS_EAGER": "1",
        "CHAT_MEMORY_BLOCK_WARM": "0",  # no model endpoint here: the block is built, not warmed
        "HF_HUB_OFFLINE": "1",
        "DATABASE_URL": servers.default.url(),
        "CHAT_REGION_DATABASE_URLS": json.dumps({"us-east": servers.us_east.url()}),
        "CHAT_REGIONS": "eu-west,us-east",
        "CHAT_DEFAULT_REGION": "eu-west",
        "REDIS_URL": settings.REDIS_URL,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_region_databases"],
        check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def facts_of(server, user_id: int) -> list[str]:
    return sorted(
        r[0] for r in server.query("SELECT text FROM user_memory WHERE user_id = %s", (user_id,))
    )


def test_a_us_east_users_facts_and_embeddings_are_only_in_us_east(report, servers):
    """Given a us-east user and a eu-west user who each add facts, then the us-east user's facts
    (text and embedding) are in us-east's database and absent from default's, and the other
    way round."""
    una, eve = report["una"], report["eve"]

    assert len(report["una_facts_stored"]) == 2
    # One of the two was removed later in the scenario (test below).
    assert facts_of(servers.us_east, una) == ["Una keeps bees in Vermont"]
    assert (
        servers.us_east.query(
            "SELECT count(*) FROM user_memory WHERE user_id = %s AND embedding IS NOT NULL", (una,)
        )[0][0]
        == 1
    )
    assert facts_of(servers.default, una) == []
    assert facts_of(servers.default, eve) == ["Eve grows tulips in Utrecht"]
    assert facts_of(servers.us_east, eve) == []


def test_retrieval_and_the_block_work_from_the_region_database(report):
    """Given the us-east user's facts, then listing, similarity search and their memory block
    read them, and every memory query of that user ran on us-east's database alone."""
    assert sorted(report["una_list"]) == sorted(report["una_facts_stored"])
    assert report["una_search_top"] == "Una keeps bees in Vermont"
    assert "- Una keeps bees in Vermont" in report["una_block"]
    assert "- Una drives a red pickup truck" in report["una_block"]
    assert report["una_memory_queries_on"] == [US_EAST]


def test_a_removed_fact_leaves_the_region_database_and_the_block(report, servers):
    """Given a us-east user removes a fact, then it is gone from us-east's table and from their
    rebuilt block, and their block row is in us-east's database only."""
    una = report["una"]

    assert report["removed"] == 1
    assert "red pickup" not in report["una_block_after_remove"]
    assert "red pickup" not in " ".join(facts_of(servers.us_east, una))
    block = servers.us_east.query(
        "SELECT text, built_version = version FROM memory_block WHERE user_id = %s", (una,)
    )
    assert block and block[0][1] and "bees" in block[0][0]
    assert (
        servers.default.query("SELECT count(*) FROM memory_block WHERE user_id = %s", (una,))[0][0]
        == 0
    )


def test_an_extraction_marker_lives_with_its_conversation(report, servers):
    """Given the memory sweep queues a us-east conversation's extraction, then its marker row is
    in us-east's database, not default's."""
    conversation_id = report["una_conversation"]

    assert report["swept"] == [conversation_id]
    sql = "SELECT count(*) FROM memory_extractionmarker WHERE conversation_id = %s"
    assert servers.us_east.query(sql, (conversation_id,))[0][0] == 1
    assert servers.default.query(sql, (conversation_id,))[0][0] == 0


def test_deleting_an_account_removes_its_facts_in_its_region(report, servers):
    """Given a us-east user with facts and a block, when their account is deleted, then none of
    their facts, block or markers is left in us-east's database, and the count is recorded."""
    ula = report["ula"]

    assert report["ula_deleted_counts"]["memory_facts"] == 1
    for table in MEMORY_TABLES:
        assert (
            servers.us_east.query(f"SELECT count(*) FROM {table} WHERE user_id = %s", (ula,))[0][0]
            == 0
        )  # noqa: S608


def test_the_region_database_has_pgvector_and_no_constraint_to_users(servers):
    """Given us-east's database migrated, then it has the vector extension and its memory tables
    reference users without a foreign-key constraint (users live in default)."""
    assert (
        servers.us_east.query("SELECT count(*) FROM pg_extension WHERE extname = 'vector'")[0][0]
        == 1
    )
    constraints = servers.us_east.query(
        "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid::regclass::text = ANY(%s)",
        (list(MEMORY_TABLES),),
    )
    assert constraints == []


def ledger_rows(server, conversation_id: str) -> int:
    return server.query(
        "SELECT count(*) FROM usage_usagerecord WHERE conversation_id = %s", (conversation_id,)
    )[0][0]


def test_a_conversations_ledger_rows_are_in_its_region_only(report, servers):
    """Given a charged turn in a us-east conversation and one in a eu-west conversation, then
    each ledger row (with its turn and conversation ids) is in its conversation's region's
    database only."""
    una_conversation, eve_conversation = report["una_conversation"], report["eve_conversation"]

    assert ledger_rows(servers.us_east, una_conversation) == 1
    assert ledger_rows(servers.default, una_conversation) == 0
    assert ledger_rows(servers.default, eve_conversation) == 1
    assert ledger_rows(servers.us_east, eve_conversation) == 0


def test_usage_readers_add_up_every_region(report):
    """Given a us-east user charged once in their us-east conversation and once for a completion
    without a conversation (default's ledger), then their totals and their day count both, and
    their organisation's usage page counts both against them."""
    assert report["una_totals"] == {"requests": 2, "prompt_tokens": 30, "completion_tokens": 12}
    assert report["una_today_tokens"] == 42
    assert report["org_usage"] == [["una", 2, 42]]


def test_deleting_an_account_anonymises_its_ledger_rows_in_its_region(report, servers):
    """Given a us-east user charged in a us-east conversation, when their account is deleted,
    then their ledger row there keeps its tokens but loses their user and conversation id."""
    assert report["ula_deleted_counts"]["usage_records_anonymised"] == 1
    rows = servers.us_east.query(
        "SELECT user_id, conversation_id, completion_tokens FROM usage_usagerecord WHERE turn_id = %s",
        (report["ula_turn"],),
    )
    assert rows == [(None, None, 5)]


# --- the child process ------------------------------------------------------------------------


def _drive() -> dict:
    import django  # noqa: PLC0415

    django.setup()
    from datetime import timedelta  # noqa: PLC0415

    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415
    from django.utils import timezone  # noqa: PLC0415

    call_command("migrate", database="default", verbosity=0)
    call_command("migrate", database=US_EAST, verbosity=0)

    from django.contrib.auth import get_user_model  # noqa: PLC0415

    from conversations import services as conversation_services  # noqa: PLC0415
    from conversations.models import Conversation  # noqa: PLC0415
    from memory import blocks, extraction, services, tasks  # noqa: PLC0415
    from privacy import services as privacy_services  # noqa: PLC0415

    User = get_user_model()  # noqa: N806
    una = User.objects.create_user(
        "una", "una@us.example", "x", region="us-east", memory_enabled=True
    )
    eve = User.objects.create_user(
        "eve", "eve@eu.example", "x", region="eu-west", memory_enabled=True
    )
    ula = User.objects.create_user(
        "ula", "ula@us.example", "x", region="us-east", memory_enabled=True
    )

    used: list[str] = []

    def record(alias: str):
        def wrapper(execute, sql, params, many, context):
            if any(t in sql for t in MEMORY_TABLES) and alias not in used:
                used.append(alias)
            return execute(sql, params, many, context)

        return wrapper

    out: dict = {"una": una.pk, "eve": eve.pk, "ula": ula.pk}
    with contextlib.ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(record(alias)))
        pinned = ("Una keeps bees in Vermont", "Una drives a red pickup truck")  # the block carries them
        stored = services.memory_facts_store(
            user=una, facts=[services.FactIn(t, slot="preference") for t in pinned]
        ).added
        out["una_facts_stored"] = [fact.text for fact in stored]
        out["una_list"] = [fact.text for fact in services.memory_list(user=una)]
        found = services.memory_search(user=una, query="honey bees and hives", min_similarity=-1.0)
        out["una_search_top"] = found[0][0].text
        out["una_block"] = blocks.memory_block_current(user_id=una.pk).text
        pickup = next(fact for fact in stored if "pickup" in fact.text)
        out["removed"] = services.memory_remove(user=una, fact_ids=[pickup.fact_id])
        out["una_block_after_remove"] = blocks.memory_block_current(user_id=una.pk).text
    out["una_memory_queries_on"] = used

    services.memory_add(user=eve, texts=["Eve grows tulips in Utrecht"])
    services.memory_add(user=ula, texts=["Ula sails on Lake Champlain"])

    from decimal import Decimal  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415
    from uuid import uuid4  # noqa: PLC0415

    from accounts.models import Membership, Organisation  # noqa: PLC0415
    from usage import selectors as usage_selectors  # noqa: PLC0415
    from usage.services import usage_record  # noqa: PLC0415

    pool = SimpleNamespace(name="mini", version="v1", charge=lambda **tokens: Decimal("0.001"))
    org = Organisation.objects.create(name="Hive", slug="hive", region="us-east")
    Membership.objects.create(organisation=org, user=una, role=Membership.Role.OWNER)

    def charge(user, conversation_id, prompt: int, completion: int):
        turn_id = uuid4()
        usage_record(
            user=user, org=org if user == una else None, turn_id=turn_id, conversation_id=conversation_id,
            route_pool=pool, tier="free", prompt_tokens=prompt, cached_tokens=0,
            completion_tokens=completion, status="complete",
        )  # fmt: skip
        return turn_id

    conversation = conversation_services.conversation_create(owner=una, title="bees")
    eve_conversation = conversation_services.conversation_create(owner=eve, title="tulips")
    ula_conversation = conversation_services.conversation_create(owner=ula, title="sails")
    out["eve_conversation"] = str(eve_conversation.pk)
    charge(una, conversation.pk, 20, 8)
    charge(una, None, 10, 4)
    charge(eve, eve_conversation.pk, 7, 7)
    out["ula_turn"] = str(charge(ula, ula_conversation.pk, 3, 5))
    totals = usage_selectors.usage_totals(user=una, days=1)
    out["una_totals"] = {
        "requests": totals.requests, "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
    }  # fmt: skip
    out["una_today_tokens"] = usage_selectors.usage_daily(user=una, days=1)[-1].tokens
    out["org_usage"] = [
        [m.username, m.requests, m.tokens] for m in usage_selectors.usage_by_member(org=org, days=1)
    ]
    conversation_services.turn_append_user(conversation=conversation, content="I keep bees.")
    idle = timezone.now() - timedelta(hours=1)
    Conversation.objects.using(US_EAST).filter(pk=conversation.pk).update(last_turn_at=idle)
    tasks.memory_extract.delay = lambda conversation_id: (
        None
    )  # queue nothing: the marker is the point
    out["una_conversation"] = str(conversation.pk)
    out["swept"] = [str(c) for c in extraction.memory_sweep(queue=tasks.memory_extract.delay)]

    privacy_services.account_close(user=ula)
    out["ula_deleted_counts"] = privacy_services.account_deletion_run(user_id=ula.pk)
    return out


if __name__ == "__main__":
    print(json.dumps(_drive(), default=str))  # noqa: T201 - the report to the test
