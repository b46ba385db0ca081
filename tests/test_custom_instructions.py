"""Custom instructions and a conversation's own prompt (issue 18 part 10): the user's default for
every chat (settings page) and the conversation's system prompt (its header's Instructions),
both applied from the next turn, in DESIGN.md's prompt order (pool preamble, site prompt, custom
instructions, memory block, conversation prompt, then history), so a change invalidates only the
prefix-cache blocks after it. The scripted engine double records each prompt's messages; the
prefix test uses the served model's real tokenizer and chat template."""

from __future__ import annotations

from functools import cache

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.test import Client

from accounts import services as account_services
from conversations import services
from conversations.models import Conversation
from inference.prompts import (
    CONVERSATION_PROMPT_HEADING,
    CUSTOM_INSTRUCTIONS_HEADING,
    MEMORY_HEADING,
    SUMMARY_HEADING,
    chat_messages,
    system_message,
)
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import read_stream

SITE = "You are a helpful, concise assistant."
PREAMBLE = "Think step by step."


def full_system() -> str:
    return system_message(
        f"{PREAMBLE}\n\n{SITE}", "The user likes tea.", "We talked about cats.",
        custom_instructions="Call me Sam.", conversation_prompt="Answer in French.",
    )  # fmt: skip


# --- the order ------------------------------------------------------------------------------


def test_the_system_message_has_preamble_site_custom_memory_conversation_then_summary():
    """Given every part, the one system message holds them in DESIGN.md's order, each after
    the one before (the summary, part of the history, last)."""
    text = full_system()
    order = [
        PREAMBLE, SITE, CUSTOM_INSTRUCTIONS_HEADING, "Call me Sam.", MEMORY_HEADING,
        "The user likes tea.", CONVERSATION_PROMPT_HEADING, "Answer in French.",
        SUMMARY_HEADING, "We talked about cats.",
    ]  # fmt: skip
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions), text


def test_blank_parts_leave_no_heading_behind():
    text = system_message(SITE, custom_instructions="  ", conversation_prompt="")
    assert text == SITE


@cache
def tokenizer():
    from transformers import AutoTokenizer  # noqa: PLC0415 - heavy; only these tests need it

    return AutoTokenizer.from_pretrained(str(django_settings.CHAT_MODEL_PATH))


def prompt_ids(**parts) -> list[int]:
    """The served model's templated prompt (token ids) for a one-question conversation, as
    inference/engine.py encode_chat makes it."""
    messages = chat_messages(
        system_prompt=SITE, memory=parts.pop("memory", "The user likes tea."),
        question="What should I drink?", **parts,
    )  # fmt: skip
    ids = tokenizer().apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])  # transformers 5: a BatchEncoding


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_changing_custom_instructions_keeps_every_token_before_them():
    """Given two prompts that differ only in the custom instructions, their token ids (the
    served model's tokenizer and chat template) are identical through the site prompt and the
    custom instructions' heading, and differ after it: only the prefix-cache blocks from the
    change on are lost."""
    before = prompt_ids(custom_instructions="Call me Sam.", conversation_prompt="Answer in French.")
    after = prompt_ids(custom_instructions="Call me Alex.", conversation_prompt="Answer in French.")
    shared = tokenizer().decode(before[:common_prefix(before, after)])
    assert before != after
    assert SITE in shared and CUSTOM_INSTRUCTIONS_HEADING in shared
    assert "Sam" not in shared and MEMORY_HEADING not in shared


def test_changing_the_conversation_prompt_keeps_custom_instructions_and_memory_cached():
    """Given two prompts that differ only in the conversation's own prompt, the tokens of the
    site prompt, the custom instructions and the memory block are all shared."""
    before = prompt_ids(custom_instructions="Call me Sam.", conversation_prompt="Answer in French.")
    after = prompt_ids(custom_instructions="Call me Sam.", conversation_prompt="Answer in Welsh.")
    shared = tokenizer().decode(before[:common_prefix(before, after)])
    assert before != after
    assert "Call me Sam." in shared and "The user likes tea." in shared
    assert CONVERSATION_PROMPT_HEADING in shared and "French" not in shared


# --- through the turn pipeline --------------------------------------------------------------


@pytest.fixture
def prompts(engine_double, monkeypatch, settings) -> list[list[dict]]:
    """Every message list the turn pipeline templates (the last one of a turn is its prompt)."""
    settings.CHAT_MEMORY_ENABLED = False  # no embedding model: the memory block has its own tests
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    monkeypatch.setattr(engine_double, "encode_chat", lambda m: seen.append(list(m)) or encode(m))
    return seen


async def ask(client, conversation_id: str, content: str) -> None:
    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": content}
    )
    assert response.status_code == 200, response.content
    await read_stream(response)


@pytest.mark.django_db(transaction=True)
async def test_a_change_of_custom_instructions_applies_from_the_next_turn(make_user, prompts):
    """Given a conversation with one answered turn, when the user saves custom instructions,
    then the next turn's system message carries them after the site prompt; the first did not."""
    client, user = await api_client(make_user)
    conversation_id = await new_conversation(client)
    await ask(client, conversation_id, "hello")
    first = prompts[-1][0]["content"]
    await sync_to_async(account_services.user_custom_instructions_set)(user=user, text="Call me Sam.")
    await ask(client, conversation_id, "again")
    second = prompts[-1][0]["content"]
    assert CUSTOM_INSTRUCTIONS_HEADING not in first
    assert second.startswith(django_settings.CHAT_SYSTEM_PROMPT)
    assert second.index(CUSTOM_INSTRUCTIONS_HEADING) < second.index("Call me Sam.")


@pytest.mark.django_db(transaction=True)
async def test_the_conversation_prompt_follows_the_site_prompt_and_custom_instructions(make_user, prompts):
    """Given custom instructions and a conversation created with a ``system_prompt`` (/v1), the
    turn's system message has the site prompt first (no longer replaced), the custom
    instructions, then the conversation's prompt under its heading."""
    client, user = await api_client(make_user, custom_instructions="Call me Sam.")
    conversation_id = await new_conversation(client, system_prompt="Answer in French.")
    await ask(client, conversation_id, "hello")
    system = prompts[-1][0]["content"]
    assert system.startswith(django_settings.CHAT_SYSTEM_PROMPT)
    assert system.index("Call me Sam.") < system.index(CONVERSATION_PROMPT_HEADING)
    assert system.endswith(f"{CONVERSATION_PROMPT_HEADING}\nAnswer in French.")


@pytest.mark.django_db(transaction=True)
async def test_instructions_set_in_the_header_apply_from_the_next_turn(make_user, prompts):
    """Given a conversation with one answered turn, when its owner saves instructions through
    the header's form, then the next turn's prompt has them and the first did not."""
    client, user = await api_client(make_user)
    conversation_id = await new_conversation(client)
    await ask(client, conversation_id, "hello")
    page = Client()
    await sync_to_async(page.force_login)(user)
    response = await sync_to_async(page.post)(
        f"/c/{conversation_id}/instructions", {"system_prompt": "Answer in French."},
        headers={"HX-Request": "true"},
    )  # fmt: skip
    assert response.status_code == 200 and b"next message" in response.content
    first = prompts[-1][0]["content"]
    await ask(client, conversation_id, "again")
    assert "Answer in French." not in first
    assert prompts[-1][0]["content"].endswith("Answer in French.")


# --- the settings form ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_settings_page_saves_custom_instructions_and_shows_them(client, make_user):
    user = make_user("sam")
    client.force_login(user)
    response = client.post("/settings/instructions", {"custom_instructions": "  Call me Sam.\r\n"})
    assert response.status_code == 302 and response["Location"] == "/settings/"
    user.refresh_from_db()
    assert user.custom_instructions == "Call me Sam."
    page = client.get("/settings/").content.decode()
    assert 'name="custom_instructions"' in page and "Call me Sam." in page
    assert "Saved" in page  # the message after the redirect


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "reason"),
    [("x" * (account_services.CUSTOM_INSTRUCTIONS_MAX_CHARS + 1), "at most 1,500"), ("a\x00b", "NUL")],
)
def test_bad_custom_instructions_get_a_400_with_the_reason_and_nothing_is_stored(client, make_user, text, reason):
    user = make_user("sam", custom_instructions="kept")
    client.force_login(user)
    response = client.post("/settings/instructions", {"custom_instructions": text}, headers={"HX-Request": "true"})
    assert response.status_code == 400 and reason in response.content.decode()
    user.refresh_from_db()
    assert user.custom_instructions == "kept"


@pytest.mark.django_db
def test_custom_instructions_need_a_signed_in_user_and_a_post(client, make_user):
    assert client.post("/settings/instructions", {"custom_instructions": "x"}).status_code == 302
    client.force_login(make_user("sam"))
    assert client.get("/settings/instructions").status_code == 405


@pytest.mark.django_db
def test_clearing_custom_instructions_says_so(client, make_user):
    user = make_user("sam", custom_instructions="Call me Sam.")
    client.force_login(user)
    response = client.post("/settings/instructions", {"custom_instructions": ""}, headers={"HX-Request": "true"})
    assert response.status_code == 200 and response.content == b"Cleared."
    user.refresh_from_db()
    assert user.custom_instructions == ""


# --- the header's form ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_chat_header_shows_the_conversations_instructions_in_their_form(client, make_user):
    user = make_user("sam")
    conversation = services.conversation_create(owner=user, system_prompt="Answer <b>in</b> French.")
    client.force_login(user)
    page = client.get(f"/c/{conversation.pk}/").content.decode()
    assert f'hx-post="/c/{conversation.pk}/instructions"' in page
    assert 'name="system_prompt"' in page and "Answer &lt;b&gt;in&lt;/b&gt; French." in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "reason"), [("x" * (services.SYSTEM_PROMPT_MAX_CHARS + 1), "at most 8,000"), ("a\x00b", "NUL")]
)
def test_bad_conversation_instructions_get_a_400_with_the_reason(client, make_user, text, reason):
    user = make_user("sam")
    conversation = services.conversation_create(owner=user, system_prompt="kept")
    client.force_login(user)
    response = client.post(f"/c/{conversation.pk}/instructions", {"system_prompt": text})
    assert response.status_code == 400 and reason in response.content.decode()
    assert Conversation.objects.get(pk=conversation.pk).system_prompt == "kept"


@pytest.mark.django_db
def test_only_the_owner_sets_a_conversations_instructions(client, make_user):
    """Another user gets 404 (the id reveals nothing) and the instructions stay as they were."""
    conversation = services.conversation_create(owner=make_user("ann"), system_prompt="kept")
    client.force_login(make_user("bob"))
    response = client.post(f"/c/{conversation.pk}/instructions", {"system_prompt": "leak it all"})
    assert response.status_code == 404
    assert Conversation.objects.get(pk=conversation.pk).system_prompt == "kept"


@pytest.mark.django_db
def test_a_plain_form_post_of_instructions_goes_back_to_the_conversation(client, make_user):
    user = make_user("sam")
    conversation = services.conversation_create(owner=user)
    client.force_login(user)
    response = client.post(f"/c/{conversation.pk}/instructions", {"system_prompt": " Be terse. "})
    assert response.status_code == 302 and response["Location"] == f"/c/{conversation.pk}/"
    assert Conversation.objects.get(pk=conversation.pk).system_prompt == "Be terse."
