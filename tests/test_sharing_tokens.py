"""Share-link tokens (issue 8, sharing): a token names its region and carries 192 random bits,
its region picks the database without a query, and revoked and unknown tokens are alike.
"""

from __future__ import annotations

import pytest

from sharing import selectors, services, tokens
from tests.sharing_support import people  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


# --- tokens -----------------------------------------------------------------------------------


def test_a_token_names_its_region_and_carries_192_random_bits(settings):
    """Given each configured region, a new token starts with that region's 12-bit tag (three
    hex digits) and resolves back to it; the rest is 32 URL-safe characters (24 random
    bytes), and 1,000 tokens are all different."""
    for region in settings.CHAT_REGIONS:
        token = tokens.token_new(region)
        assert tokens.TOKEN_RE.fullmatch(token)
        assert len(token) == 3 + 32
        assert tokens.region_of_token(token) == region
    assert len({tokens.token_new(settings.CHAT_DEFAULT_REGION) for _ in range(1000)}) == 1000


def test_a_tokens_region_picks_that_regions_database_without_a_query(settings, django_assert_num_queries):
    """Given a deployment where us-east has a database of its own, a us-east token resolves to
    that database and a eu-west one to default, with no query at all (the tag decides)."""
    settings.CHAT_REGIONS = ("eu-west", "us-east")
    settings.CHAT_DEFAULT_REGION = "eu-west"
    settings.CHAT_REGION_DATABASES = {"us-east": "region_us-east", "eu-west": "default"}

    with django_assert_num_queries(0):
        assert tokens.db_for_token(tokens.token_new("us-east")) == "region_us-east"
        assert tokens.db_for_token(tokens.token_new("eu-west")) == "default"


def test_a_token_of_a_region_without_a_database_here_resolves_to_none(settings):
    settings.CHAT_REGIONS = ("eu-west", "us-east", "ap-south")
    settings.CHAT_REGION_DATABASES = {"us-east": "region_us-east", "eu-west": "default"}

    assert tokens.db_for_token(tokens.token_new("ap-south")) is None


def test_links_are_stored_with_their_conversations_region_tag(people):
    _, _, conversation, link = people

    assert tokens.region_of_token(link.token) == conversation.region


def test_snapshot_get_raises_404_alike_for_revoked_and_unknown(people):
    owner, _, conversation, link = people
    services.share_link_revoke(conversation=conversation, link=link, user=owner)

    for token in (link.token, tokens.token_new(conversation.region)):
        with pytest.raises(Exception) as caught:
            selectors.snapshot_get(token=token)
        assert caught.value.__class__.__name__ == "Http404"
        assert str(caught.value) == selectors.NOT_FOUND
