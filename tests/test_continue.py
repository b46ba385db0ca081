"""Continue a cut-off answer (issue 18, part 4): a continuation turn in the log
(``continues`` = the cut-off answer, same question) through the one turn pipeline
(conversations/submit.py ``answer_continue``), shown as one answer."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations import versions
from conversations.models import Turn
from tests.chat_support import HTMX, signed_in
from tests.versions_support import answered, make_turn, read_answer, spy_prompts

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_continued_answer_is_no_version_of_its_own():
    """Given a question, its cut-off answer and a continuation of it, when positions are built,
    then the position has one answer (the continuation), so the page shows no `< 1/2 >` and
    prompts use the whole text; answer_versions lists the continuation alone."""
    t0 = timezone.now()
    question = make_turn("user", "Explain", t0)
    cut = make_turn("assistant", "They help", t0 + timedelta(seconds=1), reply_to_id=question.turn_id,
                    finish_reason="length")  # fmt: skip
    more = make_turn("assistant", "They helps a lot.", t0 + timedelta(seconds=2),
                     reply_to_id=question.turn_id, continues_id=cut.turn_id)  # fmt: skip
    for turn in (question, cut, more):
        turn.conversation_id = question.conversation_id

    [position] = versions.positions_build([question, cut, more])

    assert position.answers == [more]
    assert versions.prompt_exchanges([position]) == [("Explain", "They helps a lot.")]
    assert versions.answer_versions([question, cut, more], more) == [more]


async def test_continue_appends_to_the_cut_off_answer(make_user, engine_double, settings):
    """Given an answer cut off at its 3-token budget, when Continue is posted for it, then the
    engine is prompted with the question's prompt plus the cut-off text (so it goes on
    mid-word), only the new text streams, and a new turn is stored that continues the cut-off
    one with the whole text; the page shows one answer with the whole text, no cut-off note
    and no versions."""
    settings.CHAT_MAX_TOKENS = 3
    engine_double.scripts = [["They ", "help", "s ", "never"], [" a", " lot."]]
    prompts = spy_prompts(engine_double)
    client, _ = await signed_in(make_user)
    conversation_id, question_id = await answered(client, "Explain")
    cut = await Turn.objects.aget(role="assistant")
    assert (cut.content, cut.finish_reason) == ("They helps ", "length")

    response = await client.post(f"/c/{conversation_id}/turns/{cut.turn_id}/continue", headers=HTMX)

    assert response.status_code == 200
    assert 'data-stream-prefix="They helps "' in response.content.decode()
    events = await read_answer(client, response)
    assert "".join(d["text"] for n, d, _ in events if n == "token") == " a lot."
    more = await Turn.objects.exclude(turn_id=cut.turn_id).aget(role="assistant")
    assert events[-1][0] == "done" and events[-1][1]["turn_id"] == str(more.turn_id)
    assert more.continues_id == cut.turn_id and more.reply_to_id == uuid.UUID(question_id)
    assert (more.content, more.finish_reason) == ("They helps  a lot.", "stop")
    first_ids, second_ids = engine_double.requests[0][0], engine_double.requests[1][0]
    prefix_ids = engine_double.encode_text(cut.content)
    assert second_ids == first_ids + prefix_ids
    assert prompts[0] == prompts[1]  # the same question's prompt, then the text so far

    page = (await client.get(f"/c/{conversation_id}/")).content.decode()
    assert page.count('class="turn assistant') == 1
    assert "They helps  a lot." in page
    assert "Cut off" not in page and "version-index" not in page


async def test_only_a_cut_off_answer_can_be_continued(make_user, engine_double):
    """Given an answer the model ended itself, when Continue is posted for it, then 400 with a
    message, and nothing is stored or generated."""
    engine_double.scripts = [["Done."]]
    client, _ = await signed_in(make_user)
    conversation_id, _ = await answered(client, "Explain")
    answer = await Turn.objects.aget(role="assistant")

    response = await client.post(f"/c/{conversation_id}/turns/{answer.turn_id}/continue", headers=HTMX)

    assert response.status_code == 400
    assert "cut off" in response.content.decode()
    assert await Turn.objects.filter(role="assistant").acount() == 1
    assert len(engine_double.requests) == 1


async def test_continue_reserves_the_text_so_far_as_prompt_tokens(make_user, engine_double, settings, monkeypatch):
    """Given an answer cut off at its 3-token budget, when Continue is posted for it, then the
    rate limits are taken for the whole prompt the engine gets (the question's prompt plus the
    cut-off text), not for the question's prompt alone: a user near their TPM limit cannot
    overrun it by continuing a long answer."""
    from conversations import plan as plan_module

    settings.CHAT_MAX_TOKENS = 3
    engine_double.scripts = [["They ", "help", "s ", "never"], [" a", " lot."]]
    taken: list[tuple[int, int]] = []
    original = plan_module.gate.rate_limit

    async def spy(caller, *, prompt_tokens, max_tokens):
        taken.append((prompt_tokens, max_tokens))
        return await original(caller, prompt_tokens=prompt_tokens, max_tokens=max_tokens)

    monkeypatch.setattr(plan_module.gate, "rate_limit", spy)
    client, _ = await signed_in(make_user)
    conversation_id, _ = await answered(client, "Explain")
    cut = await Turn.objects.aget(role="assistant")

    response = await client.post(f"/c/{conversation_id}/turns/{cut.turn_id}/continue", headers=HTMX)
    await read_answer(client, response)

    first_ids, second_ids = engine_double.requests[0][0], engine_double.requests[1][0]
    assert len(second_ids) > len(first_ids)
    assert taken == [(len(first_ids), 3), (len(second_ids), 3)]
