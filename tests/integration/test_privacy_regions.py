"""Account deletion across regions (issue 10): a person with conversations in two region
databases deletes their account; afterwards no row of theirs is left in either database (nor in
the default one), their attachment files are gone, another person's rows in the same regions
stay, and the usage ledger's totals are the same with no row naming them.

Two real PostgreSQL clusters (tests/pgcluster.py): ``default`` (accounts, usage, memory, and the
default region eu-west's conversations) and us-east's own database. The app runs in a subprocess
configured only by its environment (``CHAT_REGION_DATABASE_URLS``), as a deployment is; it runs
the scenario below once (``python -m tests.integration.test_privacy_regions``): alice (us-east)
has a personal conversation in us-east and one in her organisation's workspace in eu-west, each
with turns, a file, a share link and a rating, plus memory, an API key and usage; bob has a
conversation in us-east. Alice deletes her account through the page (password). The tests then
look at the servers and the storage folder directly, not through the app.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import ROOT, clusters

US_EAST = "region_us-east"
PASSWORD = "correct-horse-battery-staple-42"

# (table, column naming the person or their conversation) of every regional row kind.
REGIONAL = {
    "conversations": ("conversations_conversation", "owner_id", "person"),
    "turns": ("conversations_turn", "conversation_id", "conversations"),
    "attachments": ("attachments_attachment", "conversation_id", "conversations"),
    "share_links": ("sharing_sharelink", "created_by_id", "person"),
    "feedback": ("feedback_feedback", "user_id", "person"),
}
USAGE_TOTALS = (
    "SELECT sum(prompt_tokens), sum(completion_tokens), sum(cost_usd)::text, count(*) "
    "FROM usage_usagerecord"
)
GLOBAL = {
    "account": ("accounts_user", "id"),
    "memory": ("user_memory", "user_id"),
    "api_keys": ("accounts_apikey", "user_id"),
    "sessions": ("accounts_usersession", "user_id"),
    "memberships": ("accounts_membership", "user_id"),
    "usage": ("usage_usagerecord", "user_id"),
}


@pytest.fixture(scope="module")
def servers():
    with clusters() as made:
        yield SimpleNamespace(
            default=made.primary("global-eu-west"), us_east=made.primary("us-east")
        )


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("privacy-regions-media")


@pytest.fixture(scope="module")
def report(servers, media) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings.base",
        "DB_POOL_MAX": "4",
        "CELERY_TASK_ALWAYS_EAGER": "1",
        "DATABASE_URL": servers.default.url(),
        "CHAT_REGION_DATABASE_URLS": json.dumps({"us-east": servers.us_east.url()}),
        "CHAT_REGIONS": "eu-west,us-east",
        "CHAT_DEFAULT_REGION": "eu-west",
        "REDIS_URL": settings.REDIS_URL,
        "CHAT_ATTACHMENT_ROOT": str(media),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_privacy_regions"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def count(server, table: str, column: str, values: list) -> int:
    if not values:
        return 0
    return server.query(
        f"SELECT count(*) FROM {table} WHERE {column}::text = ANY(%s)", ([str(v) for v in values],)
    )[0][0]


def regional_rows(servers, person: dict) -> dict[str, dict[str, int]]:
    """Rows of ``person`` (their id and conversation ids) per kind, in each region database."""
    found = {}
    for name, server in (("eu-west", servers.default), ("us-east", servers.us_east)):
        found[name] = {
            kind: count(
                server, table, column, [person["id"]] if by == "person" else person["conversations"]
            )
            for kind, (table, column, by) in REGIONAL.items()
        }
    return found


def test_the_deletion_went_through_the_page(report):
    assert report["response"] == [302, "/account-deleted/"]


def test_before_it_the_person_had_rows_of_every_kind_in_both_regions(report):
    """The scenario is what the other tests need: alice's data was in both databases (so
    finding none afterwards means it was deleted, not that it was never there)."""
    before = report["alice_before"]

    assert all(n >= 1 for n in before["eu-west"].values()), before
    assert all(n >= 1 for n in before["us-east"].values()), before


def test_no_row_of_the_person_is_left_in_any_region_database(report, servers):
    after = regional_rows(servers, report["alice"])

    assert after == {region: dict.fromkeys(REGIONAL, 0) for region in ("eu-west", "us-east")}


def test_no_row_of_the_person_is_left_in_the_default_database(report, servers):
    alice = report["alice"]["id"]

    assert {
        kind: count(servers.default, table, column, [alice])
        for kind, (table, column) in GLOBAL.items()
    } == dict.fromkeys(GLOBAL, 0)
    assert (
        count(
            servers.default,
            "usage_usagerecord",
            "conversation_id",
            report["alice"]["conversations"],
        )
        == 0
    )


def test_another_persons_rows_in_the_same_region_stay(report, servers):
    after = regional_rows(servers, report["bob"])

    assert after["us-east"] == report["bob_before"]["us-east"] and after["us-east"]["turns"] == 2
    assert count(servers.default, "accounts_user", "id", [report["bob"]["id"]]) == 1


def test_the_attachment_files_are_gone_and_the_other_persons_stays(report, media):
    left = sorted(str(p.relative_to(media)) for p in media.rglob("*") if p.is_file())

    assert left == report["bob"]["files"]
    assert len(report["alice"]["files"]) == 2


def test_usage_totals_sum_the_same_with_no_row_naming_the_person(report, servers):
    totals = servers.default.query(USAGE_TOTALS)[0]
    anonymous = servers.default.query(
        "SELECT count(*) FROM usage_usagerecord WHERE user_id IS NULL"
    )[0][0]

    assert list(totals) == report["usage_before"]
    assert anonymous == 2  # alice's two answers, kept for billing


def test_the_audit_log_has_the_deletion_and_no_name(report, servers):
    rows = servers.default.query(
        "SELECT action, actor_id, details::text FROM audit_auditentry "
        "WHERE action = 'account.delete'"
    )
    everything = servers.default.query(
        "SELECT string_agg(row_to_json(a)::text, ' ') FROM audit_auditentry a"
    )[0][0]

    assert [(a, actor) for a, actor, _ in rows] == [("account.delete", report["alice"]["id"])]
    assert json.loads(rows[0][2])["conversations"] == 2
    assert report["alice"]["username"] not in everything


# --- the scenario, run inside the app process ---------------------------------------------------


def _scenario() -> dict:
    import uuid  # noqa: PLC0415

    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415
    from django.test import Client  # noqa: PLC0415
    from django.test.utils import setup_test_environment  # noqa: PLC0415

    from accounts.models import Membership, Organisation, User  # noqa: PLC0415
    from accounts.services import api_key_create  # noqa: PLC0415
    from inference.embeddings import embedding_dimension  # noqa: PLC0415
    from memory.models import UserMemory  # noqa: PLC0415
    from tests.test_privacy import conversation_with_data  # noqa: PLC0415

    setup_test_environment()
    call_command("migrate", database="default", verbosity=0)
    call_command("migrate", database=US_EAST, verbosity=0)

    def rows(person: dict) -> dict:
        found = {}
        for name, alias in (("eu-west", "default"), ("us-east", US_EAST)):
            with connections[alias].cursor() as cursor:
                found[name] = {}
                for kind, (table, column, by) in REGIONAL.items():
                    values = [str(person["id"])] if by == "person" else person["conversations"]
                    cursor.execute(
                        f"SELECT count(*) FROM {table} WHERE {column}::text = ANY(%s)", [values]
                    )
                    found[name][kind] = cursor.fetchone()[0]
        return found

    def person(user, datas) -> dict:
        return {
            "id": user.pk,
            "username": user.username,
            "conversations": [str(d.conversation.pk) for d in datas],
            "files": sorted(d.attachment.storage_name for d in datas),
        }

    suffix = uuid.uuid4().hex[:8]
    olga = User.objects.create_user(username=f"olga-{suffix}", password=PASSWORD, region="eu-west")
    org = Organisation.objects.create(name="Euro", slug=f"euro-{suffix}", region="eu-west")
    Membership.objects.create(organisation=org, user=olga, role="owner")
    alice = User.objects.create_user(
        username=f"alice-{suffix}",
        password=PASSWORD,
        region="us-east",
        email=f"alice-{suffix}@example.com",
    )
    personal = conversation_with_data(alice, "tangerine-us")  # before joining: alice's own region
    Membership.objects.create(organisation=org, user=alice, role="member")
    in_org = conversation_with_data(alice, "tangerine-eu", org=org)  # the organisation's region
    UserMemory.objects.create(
        user=alice, text="likes tangerines", embedding=[0.0] * embedding_dimension()
    )
    api_key_create(user=alice, name="script")
    bob = User.objects.create_user(username=f"bob-{suffix}", password=PASSWORD, region="us-east")
    bobs = conversation_with_data(bob, "plum-us")

    assert personal.conversation._state.db == US_EAST and in_org.conversation._state.db == "default"
    alice_info, bob_info = person(alice, [personal, in_org]), person(bob, [bobs])
    alice_before, bob_before = rows(alice_info), rows(bob_info)
    with connections["default"].cursor() as cursor:
        cursor.execute(USAGE_TOTALS)
        usage_before = list(cursor.fetchone())

    client = Client()
    client.force_login(alice)
    response = client.post("/settings/delete-account/", {"password": PASSWORD})

    return {
        "alice": alice_info,
        "bob": bob_info,
        "alice_before": alice_before,
        "bob_before": bob_before,
        "usage_before": usage_before,
        "response": [response.status_code, response.get("Location")],
    }


if __name__ == "__main__":
    result = _scenario()
    sys.stdout.write(json.dumps(result) + "\n")
