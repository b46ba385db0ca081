"""Share links across regions (issue 8): a link lives in its conversation's region database,
and an anonymous viewer, who has nothing but the token, is served from that database alone.

Two real PostgreSQL clusters (tests/pgcluster.py): ``default`` (accounts, and the default
region eu-west's conversations) and us-east's own database. The app runs in a subprocess
configured only by its environment (``CHAT_REGION_DATABASE_URLS``), as a deployment is; it
runs the scenario below once (this module, ``python -m tests.test_sharing_regions``) and
reports what happened and which database each sharing query ran on; the tests check the
report and look at the servers directly.
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


@pytest.fixture(scope="module")
def servers():
    with clusters() as made:
        yield SimpleNamespace(default=made.primary("global-eu-west"), us_east=made.primary("us-east"))


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
        [sys.executable, "-m", "tests.test_sharing_regions"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(server, sql: str, params=()) -> int:
    return server.query(sql, params)[0][0]


def test_a_link_is_stored_in_its_conversations_region_only(report, servers):
    """Given a us-east user's conversation, when they share it, then the link's row is in
    us-east's database and not in default's, and its token carries us-east's tag."""
    token = report["token"]

    assert rows(servers.us_east, "SELECT count(*) FROM sharing_sharelink WHERE token = %s", (token,)) == 1
    assert rows(servers.default, "SELECT count(*) FROM sharing_sharelink WHERE token = %s", (token,)) == 0
    assert report["token_region"] == "us-east"


def test_an_anonymous_viewer_is_served_from_the_links_region_alone(report):
    """Given only the token, when an anonymous viewer opens the shared page, then 200 with the
    conversation, and every query of links and turns ran on us-east's database (the default
    database is asked only about the creator's account)."""
    view = report["anonymous_view"]

    assert view["status"] == 200 and view["shows_answer"]
    assert view["sharing_and_turn_queries_on"] == [US_EAST]
    assert set(view["all_queries_on"]) <= {US_EAST, "default"}


def test_a_viewer_in_another_region_continues_into_their_own_region(report, servers):
    """Given a eu-west viewer, when they continue the us-east snapshot, then the copy and its
    turns are stored in eu-west's database (default), none in us-east's, and the original in
    us-east keeps its turns."""
    copy_id = report["copy_id"]

    assert rows(servers.default, "SELECT count(*) FROM conversations_turn WHERE conversation_id = %s", (copy_id,)) == 2
    assert rows(servers.us_east, "SELECT count(*) FROM conversations_conversation WHERE conversation_id = %s", (copy_id,)) == 0
    assert rows(
        servers.us_east, "SELECT count(*) FROM conversations_turn WHERE conversation_id = %s", (report["conversation_id"],)
    ) == 2  # fmt: skip


def test_a_revoked_link_answers_404_across_regions(report):
    assert report["after_revoke_status"] == 404


def test_revoking_a_removed_members_links_reaches_their_organisations_region(report, servers):
    """Given a member's link to their us-east organisation's conversation, when
    share_links_revoke_for(user, org) runs, then it revokes that link in us-east's database."""
    assert report["revoked_for_org"] == 1
    assert rows(
        servers.us_east, "SELECT count(*) FROM sharing_sharelink WHERE token = %s AND revoked_at IS NOT NULL",
        (report["org_token"],),
    ) == 1  # fmt: skip


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
    from conversations import services as conversation_services  # noqa: PLC0415
    from conversations.models import Conversation  # noqa: PLC0415
    from sharing import services, tokens  # noqa: PLC0415

    setup_test_environment()  # the test client's host, "testserver", is allowed
    call_command("migrate", database="default", verbosity=0)
    call_command("migrate", database=US_EAST, verbosity=0)

    def converse(owner, org=None):
        conversation = conversation_services.conversation_create(owner=owner, org=org)
        question = conversation_services.turn_append_user(conversation=conversation, content="Where is the office?")
        conversation_services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
            content="On the second floor.", status="complete", prompt_tokens=1, completion_tokens=1,
        )  # fmt: skip
        conversation.refresh_from_db()
        return conversation

    suffix = uuid.uuid4().hex[:8]
    owner = User.objects.create_user(username=f"us-{suffix}", password="x", region="us-east")
    conversation = converse(owner)
    link = services.share_link_create(conversation=conversation, user=owner)

    queries: list[tuple[str, str]] = []

    def recorder(alias):
        def record(execute, sql, params, many, context):
            queries.append((alias, sql))
            return execute(sql, params, many, context)

        return record

    with contextlib.ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(recorder(alias)))
        response = Client().get(f"/s/{link.token}/")
    regional = sorted({a for a, sql in queries if "sharing_sharelink" in sql or "conversations_turn" in sql})

    viewer = User.objects.create_user(username=f"eu-{suffix}", password="x", region="eu-west")
    client = Client()
    client.force_login(viewer)
    continued = client.post(f"/s/{link.token}/continue")
    copy = Conversation.objects.using("default").get(owner_id=viewer.pk)
    assert continued.status_code == 302, continued.status_code

    services.share_link_revoke(conversation=conversation, link=link, user=owner)
    after_revoke = Client().get(f"/s/{link.token}/")

    org = Organisation.objects.create(name="Acme US", slug=f"acme-{suffix}", region="us-east")
    member = User.objects.create_user(username=f"m-{suffix}", password="x", region="eu-west")
    Membership.objects.create(organisation=org, user=member)
    org_link = services.share_link_create(conversation=converse(member, org=org), user=member)

    return {
        "token": link.token,
        "token_region": tokens.region_of_token(link.token),
        "conversation_id": str(conversation.pk),
        "anonymous_view": {
            "status": response.status_code,
            "shows_answer": "On the second floor." in response.content.decode(),
            "sharing_and_turn_queries_on": regional,
            "all_queries_on": sorted({a for a, _ in queries}),
        },
        "copy_id": str(copy.pk),
        "after_revoke_status": after_revoke.status_code,
        "org_token": org_link.token,
        "revoked_for_org": services.share_links_revoke_for(user=member, org=org),
    }


if __name__ == "__main__":
    result = _scenario()
    sys.stdout.write(json.dumps(result) + "\n")
