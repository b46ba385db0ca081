"""Training opt-out (issue 20, part 5): a person's flag (``User.training_opt_out``, set on the
settings page) beside their organisation's (``not_for_training``, its policies page). Either
opt-out wins when a turn is written (accounts/selectors.py ``turn_training_eligible``); turns
already stored keep their tag; every change of either flag is in the audit log with who, which
flag, old and new value, and a save that changes nothing records nothing.

The training export that reads the tags: tests/test_training_export.py.
"""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async
from django.contrib.admin.sites import site as admin_site
from django.test import AsyncClient, Client, RequestFactory

from accounts.models import Membership, Organisation, User
from audit.models import AuditEntry
from conversations import services as conversation_services
from conversations.models import Turn
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import read_stream
from workspaces import services as workspace_services

pytestmark = pytest.mark.django_db

POLICY_DEFAULTS = {"region": "eu-west", "pinned_pool": ""}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def exchange(conversation, question: str = "Where is the office?") -> tuple[Turn, Turn]:
    """One stored question and complete answer in ``conversation``, through the services."""
    asked = conversation_services.turn_append_user(conversation=conversation, content=question)
    answer = conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=asked.turn_id,
        content="On the second floor.", status="complete", prompt_tokens=1, completion_tokens=1,
    )  # fmt: skip
    return asked, answer


def opt_out(user: User, value: bool = True, *, htmx: bool = False):
    """``user`` saves the settings page's checkbox (ticked: ``value``); returns the response."""
    data = {"training_opt_out": "on"} if value else {}
    headers = {"HX-Request": "true"} if htmx else {}
    return signed_in(user).post("/settings/training", data, headers=headers)


def entries(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("id"))


@pytest.fixture
def acme(make_user) -> dict:
    olga, mia = make_user("olga"), make_user("mia")
    org = workspace_services.organisation_create(creator=olga, name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=mia, role="member")
    return {"org": org, "owner": olga, "member": mia}


def policies_save(acme, **fields):
    data = dict(POLICY_DEFAULTS)
    data.update({name: "on" for name, on in fields.items() if on})
    return signed_in(acme["owner"]).post("/orgs/acme/policies/", data)


# --- at ingest ----------------------------------------------------------------------------------


def test_a_users_opt_out_marks_their_turns_from_the_next_one(make_user):
    """Given an exchange, when the owner opts out and another exchange is written, then the new
    turns are not training-eligible and the earlier ones keep their tag."""
    ann = make_user("ann")
    conversation = conversation_services.conversation_create(owner=ann)
    before = exchange(conversation, "first")

    assert opt_out(ann).status_code == 302
    after = exchange(conversation, "second")

    assert [Turn.objects.get(pk=t.pk).training_eligible for t in (*before, *after)] == [
        True, True, False, False,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("user_out", "org_out", "eligible"),
    [(False, False, True), (True, False, False), (False, True, False), (True, True, False)],
)
def test_either_opt_out_wins(acme, user_out, org_out, eligible):
    """A member's turn in the organisation's workspace is eligible only if neither the member
    nor the organisation opted out."""
    User.objects.filter(pk=acme["member"].pk).update(training_opt_out=user_out)
    Organisation.objects.filter(pk=acme["org"].pk).update(not_for_training=org_out)
    conversation = conversation_services.conversation_create(owner=acme["member"], org=acme["org"])

    asked, answer = exchange(conversation)

    assert (asked.training_eligible, answer.training_eligible) == (eligible, eligible)


def test_one_persons_opt_out_leaves_another_members_turns_eligible(acme):
    User.objects.filter(pk=acme["owner"].pk).update(training_opt_out=True)
    conversation = conversation_services.conversation_create(owner=acme["member"], org=acme["org"])

    asked, answer = exchange(conversation)

    assert asked.training_eligible and answer.training_eligible


@pytest.mark.django_db(transaction=True)
async def test_the_checkbox_applies_to_the_next_turn_on_v1(make_user, engine_double):
    """Through the whole request path (/v1 turns, the scripted engine, the write-back): a turn
    before ticking the box is eligible, the next question and its answer are not."""
    api, carl = await api_client(make_user, username="carl")
    conversation_id = await new_conversation(api)
    url = f"/v1/conversations/{conversation_id}/turns"
    await read_stream(await post_json(api, url, {"role": "user", "content": "first"}))

    page = AsyncClient()
    await page.aforce_login(carl)
    assert (await page.post("/settings/training", {"training_opt_out": "on"})).status_code == 302
    await read_stream(await post_json(api, url, {"role": "user", "content": "second"}))

    turns = await sync_to_async(list)(
        Turn.objects.filter(conversation_id=conversation_id).order_by("created_at", "turn_id")
    )
    assert [(t.role, t.training_eligible) for t in turns] == [
        ("user", True), ("assistant", True), ("user", False), ("assistant", False),
    ]  # fmt: skip


# --- the settings page --------------------------------------------------------------------------


def test_the_settings_page_shows_the_checkbox_as_stored(make_user):
    ann = make_user("ann")
    unticked = signed_in(ann).get("/settings/").content.decode()
    User.objects.filter(pk=ann.pk).update(training_opt_out=True)

    ticked = signed_in(ann).get("/settings/").content.decode()

    assert 'name="training_opt_out"' in unticked
    assert 'id="training-opt-out" name="training_opt_out" value="on" aria' in unticked
    assert 'value="on" checked aria-describedby="training-opt-out-note"' in ticked


def test_the_settings_page_names_the_organisations_that_opted_out(acme):
    Organisation.objects.filter(pk=acme["org"].pk).update(not_for_training=True)

    html = signed_in(acme["member"]).get("/settings/").content.decode()

    assert 'id="training-orgs-note"' in html and "<strong>Acme</strong> has opted out" in html


def test_unticking_the_box_opts_back_in(make_user):
    ann = make_user("ann", training_opt_out=True)

    response = opt_out(ann, False, htmx=True)

    assert response.status_code == 200 and "may be used for training" in response.content.decode()
    assert User.objects.get(pk=ann.pk).training_opt_out is False


def test_htmx_gets_the_status_line(make_user):
    response = opt_out(make_user("ann"), htmx=True)

    assert response.status_code == 200
    assert response.content.decode() == (
        "Saved: your messages and answers from now on are not used for training."
    )


@pytest.mark.parametrize("value", ["maybe", "yes please", "2"])
def test_a_value_that_is_no_checkbox_value_is_a_400(make_user, value):
    ann = make_user("ann")

    response = signed_in(ann).post("/settings/training", {"training_opt_out": value})

    assert response.status_code == 400 and b"checkbox" in response.content
    assert User.objects.get(pk=ann.pk).training_opt_out is False


def test_the_setting_needs_a_csrf_token(make_user):
    ann = make_user("ann")
    client = Client(enforce_csrf_checks=True)
    client.force_login(ann)

    response = client.post("/settings/training", {"training_opt_out": "on"})

    assert response.status_code == 403
    assert User.objects.get(pk=ann.pk).training_opt_out is False


def test_a_get_is_refused_and_signed_out_people_are_sent_to_sign_in(make_user):
    assert signed_in(make_user("ann")).get("/settings/training").status_code == 405
    response = Client().post("/settings/training", {"training_opt_out": "on"})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


# --- the audit log ------------------------------------------------------------------------------


def test_each_change_of_a_users_flag_is_audited_with_old_and_new_value(make_user):
    ann = make_user("ann")

    opt_out(ann, True)
    opt_out(ann, False)

    first, second = entries("account.training_opt_out")
    assert [(e.actor_id, e.target_type, e.target_id, e.org_id) for e in (first, second)] == [
        (ann.pk, "accounts.user", str(ann.pk), None)
    ] * 2
    assert first.details == {"flag": "training_opt_out", "from": False, "to": True}
    assert second.details == {"flag": "training_opt_out", "from": True, "to": False}
    assert first.created_at <= second.created_at


def test_saving_a_users_flag_unchanged_writes_no_entry(make_user):
    ann = make_user("ann")
    opt_out(ann, True)

    response = opt_out(ann, True, htmx=True)
    opt_out(make_user("bob"), False)

    assert response.content.decode() == "No change."
    assert len(entries("account.training_opt_out")) == 1


def test_each_change_of_an_organisations_flag_is_audited_with_old_and_new_value(acme):
    """Given the owner's policies page, when they switch not-for-training on and off, then two
    ``org.training_opt_out`` entries name the owner, the organisation, the flag and the values,
    and the organisation's audit page lists them."""
    assert policies_save(acme, not_for_training=True).status_code == 303
    assert policies_save(acme, not_for_training=False).status_code == 303

    on, off = entries("org.training_opt_out")
    assert (on.actor_id, on.org_id, on.target_id) == (
        acme["owner"].pk, acme["org"].pk, str(acme["org"].pk),
    )  # fmt: skip
    assert on.details == {"flag": "not_for_training", "from": False, "to": True}
    assert off.details == {"flag": "not_for_training", "from": True, "to": False}
    page = signed_in(acme["owner"]).get("/orgs/acme/audit/").content.decode()
    assert page.count("changed the organisation&#x27;s training opt-out") == 2


def test_saving_the_policies_unchanged_writes_no_entry(acme):
    policies_save(acme, not_for_training=True)

    assert policies_save(acme, not_for_training=True).status_code == 303

    assert len(entries("org.training_opt_out")) == 1
    assert len(entries("org.policy_change")) == 1  # the first save's, nothing for the second


def test_another_policy_change_records_no_training_entry(acme):
    policies_save(acme, zero_retention=True)

    (change,) = entries("org.policy_change")
    assert change.details == {"changes": {"zero_retention": True}}
    assert entries("org.training_opt_out") == []


@pytest.mark.parametrize(
    ("model", "field", "action"),
    [
        (User, "training_opt_out", "account.training_opt_out"),
        (Organisation, "not_for_training", "org.training_opt_out"),
    ],
)
def test_a_change_in_the_admin_is_audited_by_the_staff_member(
    acme, make_user, model, field, action
):
    """The admin's save of a user or an organisation records a flag change (staff as actor)
    and nothing when the flag stays as it was."""
    staff = make_user("root", is_staff=True, is_superuser=True)
    request = RequestFactory().post("/admin/")
    request.user = staff
    obj = acme["member"] if model is User else acme["org"]
    model_admin = admin_site._registry[model]

    model_admin.save_model(request, model.objects.get(pk=obj.pk), None, True)  # unchanged
    row = model.objects.get(pk=obj.pk)
    setattr(row, field, True)
    model_admin.save_model(request, row, None, True)

    (entry,) = entries(action)
    assert (entry.actor_id, entry.target_id) == (staff.pk, str(obj.pk))
    assert entry.details == {"flag": field, "from": False, "to": True}
    assert getattr(model.objects.get(pk=obj.pk), field) is True
