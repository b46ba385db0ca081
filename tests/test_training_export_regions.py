"""``manage.py training_export`` across region databases (issue 20, part 5): the export reads
every region's database, and ``--region`` only that region's.

Two real PostgreSQL clusters (tests/pgcluster.py): ``default`` (accounts, and the default region
eu-west's conversations) and us-east's own database. The app runs in a subprocess configured only
by its environment (``CHAT_REGION_DATABASE_URLS``), as a deployment is; it runs the scenario below
once (``python -m tests.test_training_export_regions``) and reports the exports; the tests check
the report and look at the servers directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import ROOT, clusters

US_EAST = "region_us-east"


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
        "DATABASE_URL": servers.default.url(),
        "CHAT_REGION_DATABASE_URLS": json.dumps({"us-east": servers.us_east.url()}),
        "CHAT_REGIONS": "eu-west,us-east",
        "CHAT_DEFAULT_REGION": "eu-west",
        "REDIS_URL": settings.REDIS_URL,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_training_export_regions"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def questions(lines: list[dict]) -> set[str]:
    return {m["content"] for line in lines for m in line["messages"] if m["role"] == "user"}


def test_the_export_reads_every_regions_database(report, servers):
    """Given eligible conversations in eu-west's database and in us-east's, and opted-out
    ones (a person's, an organisation's) in us-east's, then the export holds both eligible
    ones and neither opted-out one."""
    us_rows = servers.us_east.query(
        "SELECT count(*) FROM conversations_turn WHERE content = 'us question'"
    )[0][0]
    eu_rows = servers.default.query(
        "SELECT count(*) FROM conversations_turn WHERE content = 'eu question'"
    )[0][0]

    assert (us_rows, eu_rows) == (1, 1)  # each lives in its own region's database
    assert questions(report["all"]) == {"eu question", "us question"}


def test_region_reads_only_that_regions_database(report):
    assert questions(report["us_east"]) == {"us question"}
    assert questions(report["eu_west"]) == {"eu question"}


# --- the scenario, run inside the app process ---------------------------------------------------


def _scenario() -> dict:
    import tempfile  # noqa: PLC0415
    import uuid  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    from accounts.models import Membership, Organisation, User  # noqa: PLC0415
    from conversations import services  # noqa: PLC0415

    call_command("migrate", database="default", verbosity=0)
    call_command("migrate", database=US_EAST, verbosity=0)

    def converse(owner, question, org=None):
        conversation = services.conversation_create(owner=owner, org=org)
        asked = services.turn_append_user(conversation=conversation, content=question)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=asked.turn_id,
            content=f"answer to {question}", status="complete", prompt_tokens=1,
            completion_tokens=1,
        )  # fmt: skip

    suffix = uuid.uuid4().hex[:8]

    def person(name, region, **fields):
        return User.objects.create_user(
            username=f"{name}-{suffix}", password="x", region=region, **fields
        )

    converse(person("eu", "eu-west"), "eu question")
    converse(person("us", "us-east"), "us question")
    converse(person("usout", "us-east", training_opt_out=True), "us opted-out question")
    org = Organisation.objects.create(
        name="Acme US", slug=f"acme-{suffix}", region="us-east", not_for_training=True
    )
    member = person("m", "eu-west")
    Membership.objects.create(organisation=org, user=member)
    converse(member, "us organisation question", org=org)

    def export(**options) -> list[dict]:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "train.jsonl"
            call_command("training_export", output=str(path), verbosity=0, **options)
            return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    return {
        "all": export(),
        "us_east": export(region="us-east"),
        "eu_west": export(region="eu-west"),
    }


if __name__ == "__main__":
    result = _scenario()
    sys.stdout.write(json.dumps(result) + "\n")
