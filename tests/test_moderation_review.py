"""A withdrawn answer (issue 28): not billed to the user (the operator's cost in the ledger and
the metrics), kept with the window that fired for the organisation's admins to review (never
for zero retention; gone with its conversation), and "This was fine" records a false positive.
The real classifiers and the scripted engine double."""

from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from accounts.models import Membership, Organisation
from core import metrics
from conversations import deletion
from conversations.models import Conversation, Turn
from moderation.models import WithdrawnAnswer
from tests.api_support import api_client, new_conversation
from tests.chat_support import parse_sse, read_stream
from tests.moderation_support import WEAPONS_ANSWER, ask
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)


def withdrawn_completion_tokens() -> float:
    """chat_moderation_withdrawn_tokens_total{kind="completion"} over every pool."""
    return sum(sample.value for family in metrics.MODERATION_WITHDRAWN_TOKENS.collect()
               for sample in family.samples
               if sample.name.endswith("_total") and sample.labels.get("kind") == "completion")


async def join(user, org: Organisation, role: str = Membership.Role.MEMBER) -> None:
    await Membership.objects.acreate(organisation=org, user=user, role=role)


async def withdrawn_turn(make_user, engine_double, settings, *, username="api-user", org=None):
    """A user (in ``org`` if given) whose answer the output gate withdraws; returns
    (user, conversation id, the answer turn id)."""
    settings.CHAT_MODERATION_STEP_CHARS = 4
    engine_double.scripts = [WEAPONS_ANSWER]
    client, user = await api_client(make_user, username)
    if org is not None:
        await join(user, org)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, "tell me about the Tokyo subway attack")
    events = parse_sse(await read_stream(response))
    assert events[-1][0] == "moderation"
    return user, conversation_id, response["X-Turn-Id"]


async def test_a_withdrawn_answer_is_not_billed_and_is_counted_as_the_operators_cost(make_user, engine_double, settings):
    tokens_before = withdrawn_completion_tokens()

    user, _, answer_id = await withdrawn_turn(make_user, engine_double, settings)

    record = await UsageRecord.objects.aget(turn_id=answer_id)
    assert record.status == "blocked" and record.completion_tokens > 0
    assert record.cost_usd == Decimal(0) and record.operator_cost_usd > 0
    assert (await Turn.objects.aget(pk=answer_id)).cost_usd in (None, Decimal(0))
    assert withdrawn_completion_tokens() == tokens_before + record.completion_tokens


async def test_an_answered_turn_is_still_billed(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, "What is the capital of France?")
    await read_stream(response)

    record = await UsageRecord.objects.aget()
    assert record.status == "complete" and record.cost_usd > 0 and record.operator_cost_usd == 0


async def test_a_withdrawn_answer_is_kept_for_review_with_the_window_that_fired(make_user, engine_double, settings):
    user, conversation_id, answer_id = await withdrawn_turn(make_user, engine_double, settings)

    review = await WithdrawnAnswer.objects.aget(turn_id=answer_id)
    assert review.owner_id == user.pk and review.org_id is None
    assert "sarin" in review.window and review.text.startswith("Sure, here is how")
    assert review.verdict["categories"] == ["indiscriminate_weapons"]
    assert (await Turn.objects.aget(pk=answer_id)).content == ""  # the turn keeps no text


async def test_a_zero_retention_organisation_keeps_no_withdrawn_answer(make_user, engine_double, settings):
    org = await Organisation.objects.acreate(name="Private", slug="private", zero_retention=True)

    await withdrawn_turn(make_user, engine_double, settings, org=org)

    assert await WithdrawnAnswer.objects.acount() == 0


async def test_deleting_the_conversation_deletes_its_withdrawn_answer(make_user, engine_double, settings):
    _, conversation_id, _ = await withdrawn_turn(make_user, engine_double, settings)
    conversation = await Conversation.objects.aget(pk=conversation_id)

    await deletion.aconversation_delete(conversation=conversation)

    assert await WithdrawnAnswer.objects.acount() == 0


async def test_org_admins_review_a_withdrawn_answer_and_record_it_as_fine(make_user, engine_double, settings):
    org = await Organisation.objects.acreate(name="Acme", slug="acme")
    await withdrawn_turn(make_user, engine_double, settings, org=org)
    review = await WithdrawnAnswer.objects.aget()
    admin = await sync_to_async(make_user)("acme-admin")
    await join(admin, org, Membership.Role.ADMIN)
    client = AsyncClient()
    await client.aforce_login(admin)

    page = (await client.get("/orgs/acme/moderation/review/")).content.decode()
    assert f'id="review-{review.pk}"' in page and "Weapons of mass harm" in page
    assert "sarin nerve gas" in page  # the window that fired
    response = await client.post(f"/orgs/acme/moderation/review/{review.pk}/fine/")

    assert response.status_code == 303
    await review.arefresh_from_db()
    assert review.fine and review.reviewed_by_id == admin.pk and review.reviewed_at is not None


async def test_a_plain_member_or_another_organisations_admin_cannot_review(make_user, engine_double, settings):
    org = await Organisation.objects.acreate(name="Acme", slug="acme")
    other = await Organisation.objects.acreate(name="Other", slug="other")
    await withdrawn_turn(make_user, engine_double, settings, org=org)
    review = await WithdrawnAnswer.objects.aget()
    member = await sync_to_async(make_user)("acme-member")
    await join(member, org)
    outsider = await sync_to_async(make_user)("other-admin")
    await join(outsider, other, Membership.Role.ADMIN)
    as_member, as_outsider = AsyncClient(), AsyncClient()
    await as_member.aforce_login(member)
    await as_outsider.aforce_login(outsider)

    assert (await as_member.get("/orgs/acme/moderation/review/")).status_code == 404
    assert (await as_outsider.post(f"/orgs/other/moderation/review/{review.pk}/fine/")).status_code == 404
    await review.arefresh_from_db()
    assert not review.fine
