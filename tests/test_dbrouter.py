"""The database router's and the regions' rules that need no second server (the behaviour
against real primaries, replicas and regions: tests/integration/test_replicas.py,
test_regions.py, test_failover.py)."""

from __future__ import annotations

import uuid

import pytest
from django.test import override_settings

from accounts.models import ApiKey, User
from core import dbrouter
from chatsite.settings.base import database_from_url, database_urls
from core import regions
from conversations.models import Conversation, Turn

TWO_REGIONS = {
    "CHAT_REGION_DATABASES": {"us-east": "region_us-east", "eu-west": "default"},
    "DATABASE_REPLICAS": {"default": ["replica_1"], "region_us-east": ["region_us-east_replica_1"]},
    "CHAT_REGIONS": ("eu-west", "us-east", "ap-south"),
}
router = dbrouter.PrimaryReplicaRouter()


@pytest.fixture(autouse=True)
def _no_recent_writes():
    dbrouter.forget_writes()
    yield
    dbrouter.forget_writes()


def test_a_multi_host_url_names_every_host_for_libpq():
    """Given a libpq multi-host URL (primary and standby), when it is parsed, then HOST and
    PORT list both, in order, and target_session_attrs reaches the connection options."""
    db = database_from_url(
        "postgresql://chat:pw@db-a:5432,db-b:5433/chat?target_session_attrs=read-write"
    )

    assert (db["HOST"], db["PORT"], db["NAME"], db["USER"]) == ("db-a,db-b", "5432,5433", "chat", "chat")
    assert db["OPTIONS"]["target_session_attrs"] == "read-write"


def test_a_list_of_replica_urls_splits_only_where_a_new_url_starts():
    """Given replica URLs of which one is multi-host, when the list is split, then commas inside
    the multi-host URL stay in it."""
    urls = database_urls("postgresql://r1:5432/chat, postgresql://r2:5432,r3:5432/chat?x=1")

    assert urls == ["postgresql://r1:5432/chat", "postgresql://r2:5432,r3:5432/chat?x=1"]


@pytest.mark.parametrize("region", ["eu-west", "us-east", "ap-south"])
def test_a_conversation_id_names_its_region(region):
    """Given an id minted for a region, then the region is read back from the id alone (no
    lookup), and the id is a valid RFC 9562 version-8 UUID."""
    with override_settings(**TWO_REGIONS):
        conversation_id = regions.new_conversation_id(region)

        assert regions.region_of_id(conversation_id) == region
    assert (conversation_id.version, conversation_id.variant) == (8, uuid.RFC_4122)


def test_an_id_without_a_region_tag_names_no_region():
    """Given a random version-4 UUID (ids made before regions), then it names no region."""
    assert regions.region_of_id(uuid.uuid4()) is None


@override_settings(**TWO_REGIONS)
def test_a_region_without_a_database_is_refused():
    """Given regions with databases, when a known region that has none is asked for, then it is
    refused, saying so; a configured region maps to its alias."""
    assert regions.db_for_region("us-east") == "region_us-east"
    with pytest.raises(regions.RegionUnavailable, match="'ap-south' has no database"):
        regions.db_for_region("ap-south")


@override_settings(**TWO_REGIONS)
def test_global_data_is_read_from_the_primary_and_conversations_from_a_replica():
    """Given replicas, when nothing was written, then users and API keys are read from the
    primary (authentication never sees a stale state) and conversations from a replica."""
    assert router.db_for_read(User) == "default"
    assert router.db_for_read(ApiKey) == "default"
    assert router.db_for_read(Conversation) == "replica_1"


@override_settings(**TWO_REGIONS)
def test_a_conversation_loaded_from_a_replica_writes_its_turns_to_the_primary():
    """Given a conversation loaded from a replica, then its turns are read from that cluster's
    replica and written to its primary (where Django would write by default: the replica)."""
    conversation = Conversation(owner_id=1, region="eu-west")
    conversation._state.db = "replica_1"

    assert router.db_for_read(Turn, instance=conversation) == "replica_1"
    assert router.db_for_write(Turn, instance=conversation) == "default"
    assert router.db_for_write(Conversation, instance=conversation) == "default"


@override_settings(**TWO_REGIONS)
def test_migrations_keep_global_apps_out_of_region_databases_and_replicas():
    """Given a region database and replicas, then a region database gets only conversation
    tables, replicas get nothing (they are physical copies) and default gets everything."""
    assert router.allow_migrate("region_us-east", "conversations") is True
    assert router.allow_migrate("region_us-east", "accounts") is False
    assert router.allow_migrate("region_us-east", "auth") is False
    assert router.allow_migrate("replica_1", "conversations") is False
    assert router.allow_migrate("default", "accounts") is True
    assert router.allow_migrate("default", "conversations") is True


@override_settings(**TWO_REGIONS)
def test_rows_of_two_regions_cannot_be_related():
    """Given a turn of a us-east conversation, then relating it to a conversation in default is
    refused, while a conversation may reference its global owner."""
    in_us = Conversation(owner_id=1, region="us-east")
    in_us._state.db = "region_us-east"
    in_eu = Conversation(owner_id=1, region="eu-west")
    in_eu._state.db = "default"
    turn = Turn(conversation_id=in_us.pk)
    turn._state.db = "region_us-east_replica_1"
    owner = User(pk=1)
    owner._state.db = "default"

    assert router.allow_relation(turn, in_us) is True
    assert router.allow_relation(turn, in_eu) is False
    assert router.allow_relation(in_us, owner) is True
