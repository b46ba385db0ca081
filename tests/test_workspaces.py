"""Organisation workspaces (issue 8): who may open and do what on every workspace URL, creating
an organisation, members and roles, sharing a conversation with the workspace and reading it.

People (the ``acme`` fixture): Acme's owner olga, admin adam, members mia and max; otto owns
another organisation (Globex); rita was a member of Acme and was removed; plus an anonymous
visitor. Invitations: tests/test_workspaces_invitations.py; policies taking effect on the next
turn: tests/test_workspaces_policies.py.
"""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from accounts.models import Membership, Organisation
from conversations import services as conversation_services
from conversations.models import Conversation
from workspaces import invitations, selectors, services
from workspaces.models import Invitation

pytestmark = pytest.mark.django_db

PEOPLE = ("owner", "admin", "member", "other_org", "removed", "anonymous")


def by_person(*statuses: int) -> list[tuple[str, int]]:
    """(person, expected status) pairs, in PEOPLE's order (302: sent to sign in)."""
    return list(zip(PEOPLE, statuses, strict=True))


@pytest.fixture
def acme(make_user) -> dict:
    """Acme (slug ``acme``) with olga (owner), adam (admin), mia and max (members); Globex
    owned by otto; rita, removed from Acme; a conversation of mia's shared with Acme."""
    olga, adam, mia, max_, otto, rita = (
        make_user(name, email=f"{name}@example.com")
        for name in ("olga", "adam", "mia", "max", "otto", "rita")
    )
    org = services.organisation_create(creator=olga, name="Acme", slug="acme")
    org.tier = "enterprise"
    org.save(update_fields=["tier"])
    for user, role in ((adam, "admin"), (mia, "member"), (max_, "member"), (rita, "member")):
        Membership.objects.create(organisation=org, user=user, role=role)
    globex = services.organisation_create(creator=otto, name="Globex", slug="globex")
    owner_seat = selectors.seat_get(slug="acme", user=olga)
    services.member_remove(
        seat=owner_seat, membership=Membership.objects.get(organisation=org, user=rita)
    )
    shared = conversation_services.conversation_create(owner=mia, title="Mia's plan")
    services.conversation_share_set(conversation=shared, user=mia, shared=True)
    return {
        "org": org, "globex": globex, "shared": shared,
        "owner": olga, "admin": adam, "member": mia, "max": max_, "other_org": otto,
        "removed": rita, "anonymous": None,
    }  # fmt: skip


def client_for(acme: dict, who: str) -> Client:
    client = Client()
    if acme[who] is not None:
        client.force_login(acme[who])
    return client


def assert_sent_to_sign_in(response) -> None:
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def check(response, expected: int) -> None:
    """``expected``: an HTTP status, or 302 meaning "sent to sign in"."""
    if expected == 302:
        assert_sent_to_sign_in(response)
    else:
        assert response.status_code == expected, response.content.decode()[:500]


# --- the permission matrix: every role, every workspace URL ---------------------------------------

# (page, expected status for owner, admin, member, other_org, removed, anonymous)
READ_PAGES = [
    ("/orgs/acme/", (200, 200, 200, 404, 404, 302)),
    ("/orgs/acme/conversations/", (200, 200, 200, 404, 404, 302)),
    ("/orgs/acme/members/", (200, 200, 200, 404, 404, 302)),
    ("/orgs/acme/invitations/", (200, 200, 403, 404, 404, 302)),
    ("/orgs/acme/policies/", (200, 403, 403, 404, 404, 302)),
    ("/orgs/", (200, 200, 200, 200, 200, 302)),
]


@pytest.mark.parametrize(("path", "expected"), READ_PAGES, ids=[p for p, _ in READ_PAGES])
@pytest.mark.parametrize("who", PEOPLE)
def test_who_may_open_each_workspace_page(acme, path, expected, who):
    response = client_for(acme, who).get(path)
    check(response, expected[PEOPLE.index(who)])


@pytest.mark.parametrize("who", ["owner", "admin", "member", "other_org", "removed"])
def test_an_unknown_organisation_is_the_same_404_as_someone_elses(acme, who):
    """Its existence is not revealed: a non-member cannot tell Acme from a slug nobody uses."""
    client = client_for(acme, who)
    for path in ("/orgs/no-such-org/", "/orgs/no-such-org/members/", "/orgs/no-such-org/policies/"):
        assert client.get(path).status_code == 404


def test_a_member_lacking_the_role_is_told_why(acme):
    response = client_for(acme, "member").get("/orgs/acme/policies/")
    assert response.status_code == 403
    assert (
        "Only this organisation&#x27;s owners change its roles and policies"
        in response.content.decode()
    )


INVITE = ("/orgs/acme/invitations/", {"email": "", "role": "member"})


@pytest.mark.parametrize(("who", "expected"), by_person(201, 201, 403, 404, 404, 302))
def test_who_may_invite(acme, who, expected):
    path, data = INVITE
    before = Invitation.objects.count()
    check(client_for(acme, who).post(path, data), expected)
    assert Invitation.objects.count() == before + (1 if expected == 201 else 0)


@pytest.mark.parametrize(("who", "expected"), by_person(303, 303, 403, 404, 404, 302))
def test_who_may_withdraw_an_invitation(acme, who, expected):
    issued = invitations.invitation_create(seat=selectors.seat_get(slug="acme", user=acme["owner"]))
    path = f"/orgs/acme/invitations/{issued.invitation.pk}/revoke"
    check(client_for(acme, who).post(path), expected)
    issued.invitation.refresh_from_db()
    assert (issued.invitation.revoked_at is not None) == (expected == 303)


@pytest.mark.parametrize(("who", "expected"), by_person(303, 303, 403, 404, 404, 302))
def test_who_may_remove_a_member(acme, who, expected):
    target = acme["max"]
    check(client_for(acme, who).post(f"/orgs/acme/members/{target.pk}/remove"), expected)
    still = Membership.objects.filter(organisation=acme["org"], user=target).exists()
    assert still == (expected != 303)


@pytest.mark.parametrize(("who", "expected"), by_person(303, 403, 403, 404, 404, 302))
def test_who_may_change_a_role(acme, who, expected):
    target = acme["max"]
    path = f"/orgs/acme/members/{target.pk}/role"
    check(client_for(acme, who).post(path, {"role": "admin"}), expected)
    role = Membership.objects.get(organisation=acme["org"], user=target).role
    assert role == ("admin" if expected == 303 else "member")


@pytest.mark.parametrize(("who", "expected"), by_person(303, 403, 403, 404, 404, 302))
def test_who_may_change_the_policies(acme, who, expected):
    data = {"region": "eu-west", "pinned_pool": "", "not_for_training": "on"}
    check(client_for(acme, who).post("/orgs/acme/policies/", data), expected)
    acme["org"].refresh_from_db()
    assert acme["org"].not_for_training == (expected == 303)


# Olga is Acme's only owner: she may not leave it (400); the others leave (303).
@pytest.mark.parametrize(("who", "expected"), by_person(400, 303, 303, 404, 404, 302))
def test_who_may_leave(acme, who, expected):
    check(client_for(acme, who).post("/orgs/acme/leave"), expected)
    if acme[who] is not None:
        member = Membership.objects.filter(organisation=acme["org"], user=acme[who]).exists()
        assert member == (expected == 400)


# The conversation shared with Acme (mia's): who may read it, and who may change its sharing.
@pytest.mark.parametrize(("who", "expected"), by_person(200, 200, 200, 404, 404, 302))
def test_who_may_read_a_conversation_shared_with_the_workspace(acme, who, expected):
    response = client_for(acme, who).get(f"/c/{acme['shared'].pk}/")
    check(response, expected)
    if expected == 200:
        assert "Mia&#x27;s plan" in response.content.decode()


@pytest.mark.parametrize(("who", "expected"), by_person(404, 404, 303, 404, 404, 302))
def test_only_the_owner_may_stop_sharing_a_conversation(acme, who, expected):
    response = client_for(acme, who).post(f"/c/{acme['shared'].pk}/workspace", {"shared": "0"})
    check(response, expected)
    assert Conversation.objects.get(pk=acme["shared"].pk).shared_with_org == (expected != 303)


@pytest.mark.parametrize("who", ["owner", "admin", "max"])
def test_members_cannot_write_to_a_conversation_shared_with_them(acme, who):
    """Read-only for everyone but its owner: sending a message, renaming and deleting are 404."""
    client = client_for(acme, who)
    conversation_id = acme["shared"].pk
    assert client.post(f"/c/{conversation_id}/rename", {"title": "mine now"}).status_code == 404
    assert client.post(f"/c/{conversation_id}/delete").status_code == 404
    assert client.post(f"/c/{conversation_id}/turns", {"content": "hi"}).status_code == 404
    conversation = Conversation.objects.get(pk=conversation_id)
    assert conversation.title == "Mia's plan" and not conversation.turns.exists()


# --- creating an organisation -----------------------------------------------------------------


def test_creating_an_organisation_makes_the_creator_its_owner_with_their_tier(make_user):
    user = make_user("pat", tier="paid")
    client = Client()
    client.force_login(user)
    response = client.post("/orgs/", {"name": "  Pat's   Team ", "slug": "", "region": "us-east"})
    assert response.status_code == 303
    assert response["Location"] == "/orgs/pats-team/"
    org = Organisation.objects.get(slug="pats-team")
    assert (org.name, org.tier, org.region) == ("Pat's Team", "paid", "us-east")
    assert Membership.objects.get(organisation=org).user == user
    assert Membership.objects.get(organisation=org).role == "owner"
    assert "Pat&#x27;s Team" in client.get("/orgs/").content.decode()


def test_a_taken_url_name_is_refused_with_a_message(acme, make_user):
    client = Client()
    client.force_login(make_user("pat"))
    response = client.post("/orgs/", {"name": "Another Acme", "slug": "acme", "region": "eu-west"})
    assert response.status_code == 400
    assert "The URL name &#x27;acme&#x27; is taken" in response.content.decode()
    assert Organisation.objects.filter(slug="acme").count() == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "", "region": "eu-west"}, "This field is required."),
        (
            {"name": "Ok", "slug": "Bad Slug!", "region": "eu-west"},
            "lower-case letters, digits and hyphens",
        ),
        ({"name": "Ok", "region": "mars-north"}, "Select a valid choice"),
    ],
    ids=["no name", "bad slug", "unknown region"],
)
def test_a_bad_organisation_is_refused_with_what_to_fix(make_user, data, message):
    client = Client()
    client.force_login(make_user("pat"))
    response = client.post("/orgs/", data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Organisation.objects.exists()


# --- members and roles ------------------------------------------------------------------------


def test_the_last_owner_can_neither_leave_nor_be_demoted(acme):
    client = client_for(acme, "owner")
    left = client.post("/orgs/acme/leave")
    assert left.status_code == 400
    assert "only owner of Acme" in left.content.decode()
    demoted = client.post(f"/orgs/acme/members/{acme['owner'].pk}/role", {"role": "member"})
    assert demoted.status_code == 400
    assert Membership.objects.get(organisation=acme["org"], user=acme["owner"]).role == "owner"


def test_once_another_member_is_an_owner_the_first_may_leave(acme):
    client = client_for(acme, "owner")
    assert (
        client.post(f"/orgs/acme/members/{acme['max'].pk}/role", {"role": "owner"}).status_code
        == 303
    )
    assert client.post("/orgs/acme/leave").status_code == 303
    assert not Membership.objects.filter(organisation=acme["org"], user=acme["owner"]).exists()
    # The promoted member manages the policies from their next request on.
    assert client_for(acme, "max").get("/orgs/acme/policies/").status_code == 200


def test_an_admin_cannot_remove_another_admin_or_an_owner(acme, make_user):
    other_admin = make_user("ada")
    Membership.objects.create(organisation=acme["org"], user=other_admin, role="admin")
    client = client_for(acme, "admin")
    for target in (other_admin, acme["owner"]):
        response = client.post(f"/orgs/acme/members/{target.pk}/remove")
        assert response.status_code == 403
        assert "Admins can remove members only" in response.content.decode()
        assert Membership.objects.filter(organisation=acme["org"], user=target).exists()


def test_removing_yourself_points_to_leave(acme):
    response = client_for(acme, "owner").post(f"/orgs/acme/members/{acme['owner'].pk}/remove")
    assert response.status_code == 400
    assert "use Leave" in response.content.decode()


def test_an_unknown_role_is_refused(acme):
    response = client_for(acme, "owner").post(
        f"/orgs/acme/members/{acme['max'].pk}/role", {"role": "god"}
    )
    assert response.status_code == 400
    assert "Unknown role" in response.content.decode()


def test_removing_someone_who_is_not_a_member_is_a_404(acme):
    response = client_for(acme, "owner").post(f"/orgs/acme/members/{acme['other_org'].pk}/remove")
    assert response.status_code == 404


def test_members_page_shows_controls_by_role(acme):
    owner_page = client_for(acme, "owner").get("/orgs/acme/members/").content.decode()
    member_page = client_for(acme, "member").get("/orgs/acme/members/").content.decode()
    assert f"/orgs/acme/members/{acme['max'].pk}/remove" in owner_page
    assert f"/orgs/acme/members/{acme['max'].pk}/role" in owner_page
    assert "/remove" not in member_page and "/role" not in member_page
    assert "max" in member_page  # members see who is in the organisation


# --- conversations shared with the workspace ----------------------------------------------------


def test_a_member_reads_a_shared_conversation_without_any_way_to_write(acme):
    conversation = acme["shared"]
    question = conversation_services.turn_append_user(
        conversation=conversation, content="Plan <b>Q3</b>"
    )
    conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="Here is **the plan** <script>alert(1)</script>", status="complete",
        prompt_tokens=3, completion_tokens=5,
    )  # fmt: skip
    page = client_for(acme, "max").get(f"/c/{conversation.pk}/").content.decode()
    assert "Plan &lt;b&gt;Q3&lt;/b&gt;" in page  # PF-X1: the message is escaped
    assert "<strong>the plan</strong>" in page and "<script>alert(1)" not in page  # sanitised
    assert "Read-only: only mia can continue" in page
    assert 'id="composer"' not in page and "/turns" not in page and "Regenerate" not in page


def test_the_owner_gets_the_full_page_with_the_sharing_switch(acme):
    page = client_for(acme, "member").get(f"/c/{acme['shared'].pk}/").content.decode()
    assert 'id="composer"' in page
    assert 'id="workspace-share"' in page and "Shared with workspace" in page


def test_a_conversation_that_is_not_shared_stays_private_to_fellow_members(acme):
    private = conversation_services.conversation_create(owner=acme["member"], title="diary")
    for who in ("owner", "admin", "max"):
        assert client_for(acme, who).get(f"/c/{private.pk}/").status_code == 404
    listing = client_for(acme, "owner").get("/orgs/acme/conversations/").content.decode()
    assert "diary" not in listing and "Mia&#x27;s plan" in listing


def test_sharing_from_the_workspace_page_lists_it_for_every_member(acme):
    mine = conversation_services.conversation_create(owner=acme["max"], title="Max's <i>notes</i>")
    client = client_for(acme, "max")
    before = client.get("/orgs/acme/conversations/").content.decode()
    assert f'data-conversation="{mine.pk}"' in before.split('id="unshared-conversations"')[1]
    response = client.post(
        f"/c/{mine.pk}/workspace", {"shared": "1", "next": "/orgs/acme/conversations/"}
    )
    assert response.status_code == 303 and response["Location"] == "/orgs/acme/conversations/"
    listing = client_for(acme, "admin").get("/orgs/acme/conversations/").content.decode()
    shared_part = listing.split('id="unshared-conversations"')[0]
    assert f'data-conversation="{mine.pk}"' in shared_part
    assert "Max&#x27;s &lt;i&gt;notes&lt;/i&gt;" in shared_part  # PF-X1: titles are escaped


def test_a_conversation_outside_any_organisation_cannot_be_shared_with_one(make_user):
    loner = make_user("lou")
    conversation = conversation_services.conversation_create(owner=loner)
    client = Client()
    client.force_login(loner)
    response = client.post(f"/c/{conversation.pk}/workspace", {"shared": "1"})
    assert response.status_code == 400
    assert "not in an organisation&#x27;s workspace" in response.content.decode()
    assert not Conversation.objects.get(pk=conversation.pk).shared_with_org


def test_the_share_redirect_never_leaves_the_site(acme):
    response = client_for(acme, "member").post(
        f"/c/{acme['shared'].pk}/workspace", {"shared": "1", "next": "//evil.example/"}
    )
    assert response["Location"] == f"/c/{acme['shared'].pk}/"


# --- removal revokes access at once ------------------------------------------------------------


def test_removing_a_member_takes_away_the_workspace_and_its_shared_conversations_at_once(acme):
    reader = client_for(acme, "max")
    assert reader.get(f"/c/{acme['shared'].pk}/").status_code == 200
    assert reader.get("/orgs/acme/conversations/").status_code == 200

    removed = client_for(acme, "owner").post(f"/orgs/acme/members/{acme['max'].pk}/remove")
    assert removed.status_code == 303

    # The very next requests of the same session are refused.
    assert reader.get(f"/c/{acme['shared'].pk}/").status_code == 404
    assert reader.get("/orgs/acme/conversations/").status_code == 404
    assert reader.get("/orgs/acme/").status_code == 404


def test_a_member_who_leaves_stops_sharing_their_conversations_with_the_workspace(acme):
    """A conversation is in the workspace while its owner is a member: once mia leaves, Acme's
    members no longer read hers, and neither does she (it is Acme's data: issue 8, leaving or
    removal revokes access to the organisation's conversations)."""
    assert client_for(acme, "member").post("/orgs/acme/leave").status_code == 303
    assert client_for(acme, "max").get(f"/c/{acme['shared'].pk}/").status_code == 404
    assert (
        "Mia&#x27;s plan"
        not in client_for(acme, "owner").get("/orgs/acme/conversations/").content.decode()
    )
    assert client_for(acme, "member").get(f"/c/{acme['shared'].pk}/").status_code == 404


def test_a_removed_member_loses_their_own_conversations_in_the_organisation(acme):
    """Issue 8: removing a member revokes their access to org conversations at once: their own
    conversations made in the workspace included (page, sidebar, search, /v1); personal ones
    (made outside any organisation) stay theirs."""
    from conversations.models import Conversation  # noqa: PLC0415

    max_ = acme["max"]
    own = conversation_services.conversation_create(owner=max_, title="Acme roadmap notes")
    assert own.org_id == acme["org"].pk
    personal = conversation_services.conversation_create(owner=max_, title="Holiday notes")
    Conversation.objects.filter(pk=personal.pk).update(org=None)
    reader = client_for(acme, "max")
    assert reader.get(f"/c/{own.pk}/").status_code == 200
    services.member_remove(
        seat=selectors.seat_get(slug="acme", user=acme["owner"]),
        membership=Membership.objects.get(organisation=acme["org"], user=max_),
    )
    assert reader.get(f"/c/{own.pk}/").status_code == 404
    assert reader.get(f"/c/{personal.pk}/").status_code == 200
    home = reader.get("/").content.decode()
    assert "Holiday notes" in home and "Acme roadmap notes" not in home
    assert "Acme roadmap notes" not in reader.get("/search", {"q": "roadmap"}).content.decode()


def test_a_removed_member_cannot_share_into_the_workspace_again(acme):
    own = conversation_services.conversation_create(owner=acme["max"], title="later")
    services.member_remove(
        seat=selectors.seat_get(slug="acme", user=acme["owner"]),
        membership=Membership.objects.get(organisation=acme["org"], user=acme["max"]),
    )
    response = client_for(acme, "max").post(f"/c/{own.pk}/workspace", {"shared": "1"})
    assert response.status_code == 404  # the organisation's conversation is out of reach


def test_rejoining_restores_access(acme):
    """Access follows membership, nothing else: invited back, rita reads the shared
    conversation again."""
    rita = acme["removed"]
    assert client_for(acme, "removed").get(f"/c/{acme['shared'].pk}/").status_code == 404
    issued = invitations.invitation_create(seat=selectors.seat_get(slug="acme", user=acme["owner"]))
    invitations.invitation_accept(token=issued.token, user=rita)
    assert client_for(acme, "removed").get(f"/c/{acme['shared'].pk}/").status_code == 200


def test_removing_a_member_revokes_their_links_to_the_organisations_conversations(
    acme, django_capture_on_commit_callbacks
):
    """Links max made to his Acme conversation stop at once and stay revoked after he is
    invited back (sharing.services.share_links_revoke_for, called once the removal commits)."""
    from sharing.models import ShareLink  # noqa: PLC0415
    from sharing.services import share_link_create  # noqa: PLC0415

    conversation = conversation_services.conversation_create(owner=acme["max"], title="roadmap")
    conversation_services.turn_append_user(conversation=conversation, content="what next?")
    link = share_link_create(conversation=conversation, user=acme["max"])
    anyone = Client()
    assert anyone.get(f"/s/{link.token}/").status_code == 200

    with django_capture_on_commit_callbacks(execute=True):
        removed = client_for(acme, "owner").post(f"/orgs/acme/members/{acme['max'].pk}/remove")
    assert removed.status_code == 303

    assert anyone.get(f"/s/{link.token}/").status_code == 404
    assert ShareLink.objects.get(pk=link.pk).revoked_at is not None
    issued = invitations.invitation_create(seat=selectors.seat_get(slug="acme", user=acme["owner"]))
    invitations.invitation_accept(token=issued.token, user=acme["max"])
    assert anyone.get(f"/s/{link.token}/").status_code == 404


def test_every_member_sees_the_policies_in_force_on_the_overview(acme, settings):
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": 1200, "tpm": 400_000}}
    client_for(acme, "owner").post(
        "/orgs/acme/policies/",
        {"region": "eu-west", "pinned_pool": "", "not_for_training": "on", "rate_limit_rpm": "7"},
    )
    page = client_for(acme, "member").get("/orgs/acme/").content.decode()
    assert '<span id="limit-rpm">7</span>' in page  # its own
    assert '<span id="limit-tpm">400,000</span>' in page  # the tier's
    assert "not for training" in page
    assert "/orgs/acme/policies/" not in page  # members do not get the link to change them
