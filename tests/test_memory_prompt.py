"""User memory in the turn's prompt (issues 7 and 19): the owner's stored memory block - all
their facts - goes into the prompt's memory block after the system prompt; for an *overflow*
user (facts over CHAT_MEMORY_MAX_TOKENS) the facts most like the message instead, with the
message embedded as the request arrives. Never another user's; none when memory is off. Real
embedding model and real PostgreSQL with pgvector; the scripted engine double records the
prompt (and counts a token per word, so small budgets make overflow users)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from inference.prompts import MEMORY_HEADING
from memory import services as memory_services
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import read_stream

pytestmark = pytest.mark.django_db(transaction=True)

FACTS = ["prefers metric units", "is learning Rust", "has a grey cat called Pixel", "lives in Lyon", "is vegetarian"]

def add_pinned(user, texts):
    """Store ``texts`` as pinned facts (a standing preference: memory/statements.py
    PINNED_SLOTS), the ones the memory block carries (issue 28); returns the new facts."""
    from memory.services import FactIn

    return memory_services.memory_facts_store(user=user, facts=[FactIn(t, slot="preference") for t in texts]).added



@pytest.fixture
def overflow(settings):
    """A memory block budget (tokens: words, for the engine double) that FACTS exceed, so their
    owner is an overflow user: each turn retrieves."""
    settings.CHAT_MEMORY_MAX_TOKENS = 12
    return settings


@pytest.fixture
def prompts(engine_double, monkeypatch) -> list[list[dict]]:
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    monkeypatch.setattr(engine_double, "encode_chat", lambda m: seen.append(list(m)) or encode(m))
    return seen


async def ask(client, content: str) -> None:
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": content})
    assert response.status_code == 200, response.content
    await read_stream(response)


async def test_every_pinned_fact_goes_into_the_memory_block_after_the_system_prompt(make_user, prompts):
    client, user = await api_client(make_user)
    await sync_to_async(add_pinned)(user, [f"The user {f}." for f in FACTS])
    await ask(client, "How many kilometres is a marathon?")
    system = prompts[-1][0]
    head, _, block = system["content"].partition(MEMORY_HEADING)
    assert head.startswith("You are")  # the system prompt first, then the memory block
    lines = block.strip().splitlines()
    # Oldest first; no KV-block filler after them: this block is already past the 40 tokens
    # memory may add to a turn (issue 28; CHAT_MEMORY_PROMPT_MAX_TOKENS).
    assert lines == [f"- The user {f}." for f in FACTS]


async def test_an_overflow_users_most_relevant_fact_goes_into_the_memory_block(make_user, prompts, overflow):
    client, user = await api_client(make_user)
    await sync_to_async(add_pinned)(user, [f"The user {f}." for f in FACTS])
    await ask(client, "How many kilometres is a marathon?")
    system = prompts[-1][0]
    assert system["role"] == "system"
    head, _, block = system["content"].partition(MEMORY_HEADING)
    assert block, system["content"]
    assert "metric units" in block
    assert len(block.strip().splitlines()) < len(FACTS)  # retrieved, not the whole block
    assert head.startswith("You are")  # the system prompt first, then the memory block


async def test_another_users_facts_never_reach_the_prompt(make_user, prompts):
    client, _ = await api_client(make_user, username="ann")
    _, bob = await api_client(make_user, username="bob")
    await sync_to_async(add_pinned)(bob, ["The user is secretly a spy called Nightjar."])
    await ask(client, "Who is the spy called Nightjar?")
    assert all("Nightjar" not in m["content"] or m["role"] == "user" for m in prompts[-1])
    assert MEMORY_HEADING not in prompts[-1][0]["content"]


async def test_memory_off_puts_nothing_in_the_prompt(make_user, prompts):
    client, user = await api_client(make_user)
    await sync_to_async(add_pinned)(user, ["The user prefers metric units."])
    await sync_to_async(memory_services.memory_set_enabled)(user=user, enabled=False)
    await ask(client, "How many kilometres is a marathon?")
    assert MEMORY_HEADING not in prompts[-1][0]["content"]


async def test_a_deleted_fact_is_gone_from_the_next_prompt(make_user, prompts):
    client, user = await api_client(make_user)
    (fact,) = await sync_to_async(add_pinned)(user, ["The user prefers metric units."])
    await sync_to_async(memory_services.memory_remove)(user=user, fact_ids=[fact.fact_id])
    await ask(client, "How many kilometres is a marathon?")
    assert "metric" not in prompts[-1][0]["content"]


async def test_the_same_facts_give_the_same_block_whatever_their_similarity_order(make_user, prompts, settings):
    """An overflow user's block lists the retrieved facts in a fixed order (oldest first), so
    turns that retrieve the same facts share the prompt prefix (the prefix cache hits). The
    long third fact never fits the 14-token budget; with it the facts overflow it."""
    from memory.selectors import memory_search  # noqa: PLC0415

    settings.CHAT_MEMORY_MAX_TOKENS = 14
    client, user = await api_client(make_user)
    long_fact = "The user once " + " ".join(["walked"] * 20) + " along the coast."
    await sync_to_async(add_pinned)(user, ["The user prefers metric units.", "The user is learning Rust.", long_fact]
    )
    questions = ["Metric units or imperial? Also any Rust tips?", "How do I write a for loop in Rust, in metric?"]
    rankings = [
        [f.text for f, _ in await sync_to_async(memory_search)(user=user, query=q) if f.text != long_fact]
        for q in questions
    ]
    assert rankings[0] != rankings[1] and sorted(rankings[0]) == sorted(rankings[1])  # the premise
    for question in questions:
        await ask(client, question)
    first, second = (p[0]["content"] for p in prompts[-2:])
    assert first.partition(MEMORY_HEADING)[2] == second.partition(MEMORY_HEADING)[2] != ""


async def test_the_turn_uses_the_query_embedding_started_when_the_request_arrived(make_user, prompts, monkeypatch, overflow):
    """An overflow user's message embedding is started before admission (plan.memory_query_start) and
    retrieval uses that result, not a second embedding made during prompt assembly: here the
    started embedding is the vector of 'has a grey cat', so that fact is retrieved for a
    message about something else entirely."""
    from concurrent.futures import Future  # noqa: PLC0415

    from conversations import plan  # noqa: PLC0415
    from inference.embeddings import embed_one  # noqa: PLC0415

    client, user = await api_client(make_user)
    await sync_to_async(add_pinned)(user, [f"The user {f}." for f in FACTS])
    started: list[str] = []

    def early(text: str) -> Future:
        started.append(text)
        future: Future = Future()
        future.set_result(embed_one("The user has a grey cat called Pixel."))
        return future

    monkeypatch.setattr(plan, "memory_query_start", early)
    await ask(client, "Explain the offside rule in football.")
    assert started == ["Explain the offside rule in football."]
    _, _, block = prompts[-1][0]["content"].partition(MEMORY_HEADING)
    assert "grey cat called Pixel" in block.splitlines()[1]


async def test_a_started_query_embedding_is_cancelled_when_memory_is_off(make_user, prompts, monkeypatch, overflow):
    from concurrent.futures import Future  # noqa: PLC0415

    from conversations import plan  # noqa: PLC0415

    client, user = await api_client(make_user)
    await sync_to_async(add_pinned)(user, [f"The user {f}." for f in FACTS])
    await sync_to_async(memory_services.memory_set_enabled)(user=user, enabled=False)
    futures: list[Future] = []
    monkeypatch.setattr(plan, "memory_query_start", lambda text: futures.append(Future()) or futures[-1])
    await ask(client, "How many kilometres is a marathon?")
    assert len(futures) == 1 and futures[0].cancelled()


async def test_a_user_within_the_budget_embeds_no_message(make_user, prompts, monkeypatch):
    """Issue 19: a user whose facts fit the block gets them all from the stored block; the turn
    starts no query embedding and runs no vector search."""
    from conversations import plan  # noqa: PLC0415
    from memory import selectors  # noqa: PLC0415

    client, user = await api_client(make_user)
    await sync_to_async(add_pinned)(user, [f"The user {f}." for f in FACTS])
    started: list[str] = []
    monkeypatch.setattr(plan, "memory_query_start", lambda text: started.append(text))
    monkeypatch.setattr(selectors, "memory_nearest", lambda **kw: pytest.fail("searched"))
    await ask(client, "How many kilometres is a marathon?")
    assert started == []
    assert "grey cat called Pixel" in prompts[-1][0]["content"].partition(MEMORY_HEADING)[2]


# --- relevance (issue 28) -----------------------------------------------------------------------


async def test_a_fact_outside_the_profile_enters_only_a_turn_it_is_relevant_to(make_user, prompts):
    """Given a pinned name and an unpinned "grows tomatoes and basil", when the user asks
    something unrelated, then only the profile is in the prompt; when they ask about their
    garden, the fact goes before the question (not into the system message, whose bytes stay
    the same, so the cached prefix holds)."""
    from conversations.plan import RELEVANT_MEMORY_HEADING
    from memory.services import FactIn

    client, user = await api_client(make_user)
    await sync_to_async(memory_services.memory_facts_store)(user=user, facts=[FactIn("The user's name is Ada.", slot="name")])
    await sync_to_async(memory_services.memory_add)(user=user, texts=["The user grows tomatoes and basil."])

    await ask(client, "Say the word yes.")
    unrelated = prompts[-1]
    await ask(client, "How do I keep the tomatoes in my garden healthy?")
    related = prompts[-1]

    assert "Ada" in unrelated[0]["content"] and "tomatoes" not in unrelated[0]["content"]
    assert unrelated[-1]["content"] == "Say the word yes."
    assert related[0]["content"] == unrelated[0]["content"]
    assert related[-1]["content"].startswith(f"{RELEVANT_MEMORY_HEADING}\n- The user grows tomatoes and basil.\n\n")


@pytest.mark.django_db(transaction=True)
def test_memory_adds_at_most_40_tokens_to_an_irrelevant_turn(make_user):
    """The issue's target on a small fixed set: 20 facts plus a name and a diet; requests about
    the world get the profile only (tokens counted by the pool's tokenizer: the double's)."""
    from bench.memory_bench import FACTS as BENCH_FACTS
    from bench.memory_prompt import memory_prompt_tokens
    from memory.services import FactIn

    user = make_user("ada")
    memory_services.memory_add(user=user, texts=[f"The user {f}." for f in BENCH_FACTS])
    memory_services.memory_facts_store(user=user, facts=[
        FactIn("The user's name is Ada.", slot="name"), FactIn("The user is vegetarian.", slot="diet"),
    ])  # fmt: skip

    for question in ("Say the word yes.", "What is 17 times 23?", "Explain the causes of World War I."):
        added, _filler, relevant = memory_prompt_tokens(user=user, question=question)
        assert relevant == "" and 0 < added <= 40, (question, added)


async def test_per_turn_retrieval_off_embeds_nothing_and_adds_no_fact(make_user, prompts, settings, monkeypatch):
    """CHAT_MEMORY_RELEVANT_K = 0 (the operator's switch for the per-turn embedding's cost):
    a user with facts outside the profile gets no message embedding and no relevant facts."""
    import inference.embeddings

    settings.CHAT_MEMORY_RELEVANT_K = 0
    embedded = []
    original = inference.embeddings.embed_one_start
    monkeypatch.setattr(inference.embeddings, "embed_one_start", lambda text: embedded.append(text) or original(text))
    client, user = await api_client(make_user)
    await sync_to_async(memory_services.memory_add)(user=user, texts=["The user grows tomatoes and basil."])

    await ask(client, "How do I keep the tomatoes in my garden healthy?")

    assert embedded == []
    assert prompts[-1][-1]["content"] == "How do I keep the tomatoes in my garden healthy?"
