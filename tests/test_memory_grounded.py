"""Memory holds only what the user said (issue 28 parts 3 and 4): the extractor's targets on a
small fixed labelled set, grounding, what must store nothing, contradiction, and the explicit
"remember / forget / call me" requests with "Memory updated" and Undo in the chat."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from bench.memory_extraction import run_pure, run_real, score
from conversations import services
from conversations.models import Turn
from memory import extraction
from memory.commands import commands_parse
from memory.models import MemoryUpdate, UserMemory
from memory.statements import UserMessage, grounded, statements_extract

# A small fixed labelled set (the bench has the big one, bench/memory_sets/).
FIXED = [
    {"id": "home", "turns": [("Hi, my name is Ada and I live in Lyon.", "Hello Ada! I live in Paris.")], "expect": [["ada"], ["lyon"]]},
    {"id": "diet", "turns": [("I'm vegetarian. Suggest a dinner?", "I love curry: try a chickpea one.")], "expect": [["vegetarian"]]},
    {"id": "cat", "turns": [("I have a grey cat called Pixel.", "Cute!")], "expect": [["cat", "pixel"]]},
    {"id": "job", "turns": [("I'm a teacher and I live in Toronto.", "Nice.")], "expect": [["teacher"], ["toronto"]]},
    {"id": "translate", "turns": [("Translate into Spanish: I live in Madrid and I have three brothers.", "Vivo en Madrid.")], "expect": []},
    {"id": "story", "turns": [("Write a story about a girl named Lila who lives in a lighthouse.", "Lila lived...")], "expect": []},
    {"id": "roleplay", "turns": [("Let's role-play. You are a pirate and I am your first mate.", "Arr!"), ("I have a parrot called Jack.", "Arr.")], "expect": []},
    {"id": "question", "turns": [("What is the tallest mountain in Africa?", "Kilimanjaro. I have climbed it.")], "expect": []},
]


def idle(conversation, settings):
    conversation.refresh_from_db()
    return conversation.last_turn_at + timedelta(seconds=settings.CHAT_MEMORY_IDLE_S + 1)


def say(conversation, *messages, reply="Noted. I live in Paris."):
    for content in messages:
        q = services.turn_append_user(conversation=conversation, content=content)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=reply, status="complete", prompt_tokens=10, completion_tokens=5,
        )  # fmt: skip


def facts_of(user) -> list[str]:
    return sorted(UserMemory.objects.filter(user=user).values_list("text", flat=True))


# --- the targets on a small fixed set -------------------------------------------------------------


def test_the_extractor_meets_the_precision_and_recall_targets_on_a_fixed_set():
    """Precision >= 0.9, recall >= 0.7 and no conversation that states nothing storing anything."""
    result = score(FIXED, run_pure(FIXED))

    assert result.precision >= 0.9, result.wrong
    assert result.recall >= 0.7, result.missed
    assert result.none_sets_storing == 0, result.wrong


@pytest.mark.django_db(transaction=True)
def test_every_fact_stored_by_the_real_path_is_grounded_in_a_user_turn(make_user):
    """Through conversation_memory_extract and PostgreSQL: 0 facts not grounded in a user turn."""
    result = score(FIXED, run_real(FIXED, user_factory=make_user))

    assert result.stored >= 5
    assert result.ungrounded == 0
    assert result.precision >= 0.9 and result.recall >= 0.7


def test_the_grounding_check_refuses_a_fact_that_says_more_than_its_span():
    assert grounded("The user lives in Lyon.", "I live in Lyon")
    assert not grounded("The user lives in Paris.", "I live in Lyon")
    assert not grounded("The user is the Abacus.", "What is your name?")


def test_the_score_counts_a_wrong_and_an_ungrounded_fact():
    result = score(FIXED[:1], {"home": [("The user lives in Lyon.", True), ("The PDP-1", False)]})

    assert (result.stored, result.correct, result.ungrounded) == (2, 1, 1)
    assert result.precision == 0.5 and result.recall == 0.5


# --- what stores nothing ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "messages",
    [
        ["Translate into French: My name is John and I work at a hospital."],
        ["Write a story about Inspector Hale, who lives in Edinburgh and has a dog called Rex."],
        ["Summarise this email: Hi all, I am moving to Singapore next month. Tom"],
        ["How do you say \"I am a doctor\" in German?"],
        ["Let's role-play: you are a wizard and I am your apprentice.", "I live in the tower and I have a wand."],
    ],
    ids=["translation", "story", "summary", "quoted", "role-play"],
)
def test_a_translation_story_or_role_play_stores_nothing(make_user, settings, messages):
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    say(conversation, *messages)

    result = extraction.conversation_memory_extract(conversation_id=conversation.pk, now=idle(conversation, settings))

    assert result.status == "stored" and facts_of(user) == []


def test_the_assistants_answers_are_never_read():
    """Only user messages reach the extractor; a first-person user statement does."""
    found = statements_extract([UserMessage(1, "I'm from Kenya, what should I wear in winter?")])

    assert [s.text for s in found] == ["The user is from Kenya."]
    assert found[0].span == "I'm from Kenya"


@pytest.mark.parametrize(
    "text",
    ["name", "The user", "What is your name?", "If I lived on Mars, how long is a year?", "My friend said I'm stupid.", "I need a recipe for bread."],
)
def test_fragments_questions_and_requests_are_not_facts(text):
    assert statements_extract([UserMessage(1, text)]) == []


# --- contradiction ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_new_home_and_a_new_name_replace_the_old_ones(make_user, settings):
    user = make_user("ada")
    first = services.conversation_create(owner=user)
    say(first, "My name is Ada and I live in Lyon.", "I play the cello.")
    extraction.conversation_memory_extract(conversation_id=first.pk, now=idle(first, settings))
    second = services.conversation_create(owner=user)
    say(second, "My name is Adeline. I live in Paris now.")

    extraction.conversation_memory_extract(conversation_id=second.pk, now=idle(second, settings))

    assert facts_of(user) == sorted(["The user's name is Adeline.", "The user lives in Paris now.", "The user plays the cello."])


# --- explicit requests ------------------------------------------------------------------------------


def test_remember_forget_and_call_me_are_recognised_at_a_sentence_start_only():
    kinds = [c.kind for c in commands_parse("Please remember that I'm vegetarian. Also, call me Sam. Forget that I live in Lyon.")]

    assert kinds == ["remember", "call_me", "forget"]
    assert commands_parse('Translate: "remember that I am here"') == []
    assert commands_parse("Do you remember the plot of Hamlet?") == []


@pytest.mark.django_db(transaction=True)
async def test_remember_then_forget_vegetarian_leaves_no_fact_and_shows_memory_updated_twice(make_user, engine_double):
    """Given the chat page, when the user sends "remember that I'm vegetarian" and then "forget
    that I'm vegetarian", then each is applied as it is sent (no idle wait), no vegetarian fact
    is left, and the conversation shows "Memory updated" under both answers."""
    from tests.chat_support import signed_in
    from tests.versions_support import answered

    client, user = await signed_in(make_user)
    conversation_id, _ = await answered(client, "Remember that I'm vegetarian.")
    stored = await sync_to_async(facts_of)(user)
    assert stored == ["The user is vegetarian."]
    await answered(client, "Please forget that I'm vegetarian.", conversation_id)

    assert await sync_to_async(facts_of)(user) == []
    page = (await client.get(f"/c/{conversation_id}/")).content.decode()
    assert page.count("Memory updated") == 2
    assert "Remembered: The user is vegetarian." in page and "Forgot: The user is vegetarian." in page


@pytest.mark.django_db(transaction=True)
def test_undo_restores_what_an_update_replaced(make_user, client):
    """"call me Sam" then "call me Alex": Alex replaces Sam; Undo of the second brings Sam back."""
    from memory.updates import memory_commands_apply

    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    updates = []
    for content in ("Call me Sam.", "Call me Alex."):
        turn = services.turn_append_user(conversation=conversation, content=content)
        updates.append(memory_commands_apply(user=user, conversation_id=conversation.pk, turn=turn))
    assert facts_of(user) == ["The user wants to be called Alex."]
    fact = UserMemory.objects.get(user=user)
    assert fact.source == "explicit" and fact.slot == "address"
    assert Turn.objects.get(pk=fact.source_turn_id).content[fact.span_start : fact.span_end] == fact.span_text == "Alex"
    client.force_login(user)

    response = client.post(f"/memory/updates/{updates[1].update_id}/undo", headers={"HX-Request": "true"})

    assert response.status_code == 200 and "Memory update undone." in response.content.decode()
    assert facts_of(user) == ["The user wants to be called Sam."]
    assert MemoryUpdate.objects.get(pk=updates[1].update_id).undone_at is not None
    other = make_user("bob")
    client.force_login(other)
    assert client.post(f"/memory/updates/{updates[0].update_id}/undo").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_forgotten_fact_is_not_extracted_again_at_idle(make_user, settings):
    """"I'm vegetarian" then "forget that I'm vegetarian" in one idle period: nothing stored."""
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    say(conversation, "I'm vegetarian and I live in Lyon.", "Actually, forget that I'm vegetarian.")

    extraction.conversation_memory_extract(conversation_id=conversation.pk, now=idle(conversation, settings))

    assert facts_of(user) == ["The user lives in Lyon."]


@pytest.mark.django_db(transaction=True)
async def test_a_request_in_a_temporary_chat_changes_no_memory(make_user, engine_double):
    """Nothing of a temporary chat is kept: "remember that ..." there stores nothing."""
    from conversations.models import Conversation
    from tests.chat_support import signed_in
    from tests.versions_support import answered

    client, user = await signed_in(make_user)
    conversation = await Conversation.objects.acreate(owner=user, model="m", region="eu-west", temporary=True)

    await answered(client, "Remember that I'm vegan.", conversation.pk)

    assert await sync_to_async(facts_of)(user) == []
    assert not await MemoryUpdate.objects.filter(user=user).aexists()
