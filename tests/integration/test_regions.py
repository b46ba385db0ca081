"""Home regions: each conversation, with its turns, lives only in its region's database
(issue 4, "Replicas and regions").

Two real PostgreSQL clusters (tests/pgcluster.py): ``default`` (accounts, organisations, keys,
and the default region eu-west's conversations) and us-east's own database. The app runs in its
own process configured only by its environment (``CHAT_REGION_DATABASE_URLS``), and both
databases are migrated with ``migrate --database=...``. Where rows are stored is checked on the
servers directly, not through the app.
"""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest
from django.conf import settings

from tests.pgcluster import AppError, AppProcess, clusters


@pytest.fixture(scope="module")
def servers():
    with clusters() as made:
        yield SimpleNamespace(default=made.primary("global-eu-west"), us_east=made.primary("us-east"))


@pytest.fixture(scope="module")
def app(servers):
    env = {
        "DATABASE_URL": servers.default.url(),
        "CHAT_REGION_DATABASE_URLS": json.dumps({"us-east": servers.us_east.url()}),
        # ap-south is a region users may be in, but this deployment has no database for it.
        "CHAT_REGIONS": "eu-west,us-east,ap-south",
        "CHAT_DEFAULT_REGION": "eu-west",
        "REDIS_URL": settings.REDIS_URL,
    }
    with AppProcess(env) as app:
        app.call("migrate", database="default")
        app.call("migrate", database="region_us-east")
        yield app


def person(app, region: str) -> str:
    username = f"{region}-{uuid.uuid4().hex[:8]}"
    app.call("user_create", username=username, region=region)
    return username


def chat(app, username: str, messages: int = 2) -> tuple[str, list[str]]:
    """A new conversation of ``username`` with ``messages`` user turns, each answered."""
    created = app.call("conversation_create", username=username).value
    turns = []
    for n in range(messages):
        question = app.call(
            "turn_append_user", username=username, conversation_id=created["conversation_id"], content=f"q{n}"
        ).value
        answer = app.call(
            "turn_append_assistant", conversation_id=created["conversation_id"], reply_to_id=question, content=f"a{n}"
        ).value
        turns += [question, answer]
    return created["conversation_id"], turns


def stored(server, conversation_id: str) -> tuple[int, int]:
    """(conversation rows, turn rows) for ``conversation_id`` on ``server``."""
    conversations = server.query(
        "SELECT count(*) FROM conversations_conversation WHERE conversation_id = %s", (conversation_id,)
    )[0][0]
    turns = server.query(
        "SELECT count(*) FROM conversations_turn WHERE conversation_id = %s", (conversation_id,)
    )[0][0]
    return conversations, turns


def test_a_regions_database_holds_only_conversation_data(app, servers):
    """Given both databases migrated, then us-east's has the conversation tables and none of
    the global ones (accounts, API keys, sessions live in default only)."""
    tables = {row[0] for row in servers.us_east.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}

    assert {"conversations_conversation", "conversations_turn"} <= tables
    assert not {t for t in tables if t.startswith(("accounts_", "auth_", "django_session"))}
    assert "accounts_user" in {row[0] for row in servers.default.query("SELECT tablename FROM pg_tables")}


def test_a_conversation_and_its_turns_are_stored_only_in_its_home_region(app, servers):
    """Given a user in us-east and one in eu-west, when each has a conversation, then each
    conversation and all its turns are in its own region's database and not in the other."""
    us_conversation, _ = chat(app, person(app, "us-east"))
    eu_conversation, _ = chat(app, person(app, "eu-west"))

    assert stored(servers.us_east, us_conversation) == (1, 4)
    assert stored(servers.default, us_conversation) == (0, 0)
    assert stored(servers.default, eu_conversation) == (1, 4)
    assert stored(servers.us_east, eu_conversation) == (0, 0)


def test_reads_and_writes_of_a_conversation_go_to_its_region(app, servers):
    """Given a us-east user's conversation, when a turn is appended and the history read, then
    every conversation query of both ran on us-east's server."""
    username = person(app, "us-east")
    conversation_id, turns = chat(app, username, messages=1)

    write = app.call("turn_append_user", username=username, conversation_id=conversation_id, content="more")
    read = app.call("history", username=username, conversation_id=conversation_id)

    assert write.ports == {servers.us_east.port}
    assert read.ports == {servers.us_east.port}
    assert read.value == [*turns, write.value]


def test_an_organisations_region_pins_its_members_conversations(app, servers):
    """Given a eu-west user in an organisation whose residency is us-east, when they start a
    conversation, then it is the organisation's region's and stored there."""
    username = person(app, "eu-west")
    app.call("org_join", username=username, slug=f"acme-{uuid.uuid4().hex[:6]}", region="us-east")

    created = app.call("conversation_create", username=username).value

    assert created["region"] == "us-east"
    assert stored(servers.us_east, created["conversation_id"]) == (1, 0)
    assert stored(servers.default, created["conversation_id"]) == (0, 0)


def test_a_users_list_merges_their_conversations_from_every_region(app, servers):
    """Given a user with a conversation in eu-west (before joining a us-east organisation) and
    one in us-east (after), when the older one gets a new turn, then their list has both, the
    most recently active first, read from both regions' servers."""
    username = person(app, "eu-west")
    eu_conversation, _ = chat(app, username, messages=1)
    app.call("org_join", username=username, slug=f"corp-{uuid.uuid4().hex[:6]}", region="us-east")
    us_conversation, _ = chat(app, username, messages=1)
    app.call("turn_append_user", username=username, conversation_id=eu_conversation, content="back again")

    listed = app.call("conversation_list", username=username)
    page = app.call("conversation_page", username=username, limit=10)

    assert listed.value == [eu_conversation, us_conversation]
    assert listed.ports == {servers.default.port, servers.us_east.port}
    assert page.value == [us_conversation, eu_conversation]  # the page is newest created first


def test_a_region_without_a_database_is_refused_with_a_clear_error(app, servers):
    """Given a user in ap-south, a region this deployment has no database for, when they start a
    conversation, then it is refused, saying so, and nothing is stored anywhere."""
    username = person(app, "ap-south")
    before = [s.query("SELECT count(*) FROM conversations_conversation")[0][0] for s in (servers.default, servers.us_east)]

    with pytest.raises(AppError) as refused:
        app.call("conversation_create", username=username)

    assert refused.value.kind == "RegionUnavailable"
    assert "'ap-south' has no database" in refused.value.message
    after = [s.query("SELECT count(*) FROM conversations_conversation")[0][0] for s in (servers.default, servers.us_east)]
    assert after == before
