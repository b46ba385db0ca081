"""Per-conversation export (issue 18, part 11): Markdown of the branch shown, JSON of the whole
tree, owner only, as attachments (privacy/conversation_export.py)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from accounts.models import Organisation
from conversations import services
from tests.api_support import branched_conversation

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_markdown_is_the_branch_shown_and_says_so(make_user):
    """Given a conversation whose edit of q1 is the branch shown, when its Markdown is
    downloaded, then it is an attachment named after the title holding the edit and its answer,
    not q2 (the other branch), and it says it shows the selected branch of two."""
    user = make_user("owner")
    conversation, _ = branched_conversation(user, title="Tangerine plans")

    response = signed_in(user).get(f"/c/{conversation.pk}/export.md")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    disposition = response["Content-Disposition"]
    assert disposition.startswith("attachment;") and "chat-tangerine-plans-" in disposition
    assert disposition.rstrip('"').endswith(".md")
    text = response.content.decode()
    assert text.startswith("# Tangerine plans\n")
    assert "first question, edited" in text and "answer to the edit" in text
    assert "second question" not in text and "(version 2 of 2)" in text
    assert "the branch selected on the chat page (1 other branch(es) are in the JSON export)" in text


def test_markdown_names_the_json_download_for_earlier_versions_not_the_archives_data_json(make_user):
    """Issue 29 (7): the Markdown download said earlier versions were "in data.json", a file only
    the account archive holds; it names the conversation's own JSON download instead."""
    user = make_user("owner")
    conversation, _ = branched_conversation(user, title="Tangerine plans")
    client = signed_in(user)

    text = client.get(f"/c/{conversation.pk}/export.md").content.decode()
    disposition = client.get(f"/c/{conversation.pk}/export.json")["Content-Disposition"]

    json_name = disposition.split('filename="', 1)[1].rstrip('"')
    assert json_name.startswith("chat-tangerine-plans-") and json_name.endswith(".json")
    assert f"earlier version(s) of messages or answers are in {json_name}." in text
    assert "data.json" not in text


def test_markdown_follows_the_branch_switched_to(make_user):
    user = make_user("owner")
    conversation, t = branched_conversation(user)
    services.branch_select(conversation=conversation, question=t["q1"], parent_id=None)

    text = signed_in(user).get(f"/c/{conversation.pk}/export.md").content.decode()

    assert "second question" in text and "second answer" in text
    assert "first question, edited" not in text and "(version 1 of 2)" in text


def test_json_carries_the_whole_tree_with_parents_and_the_selected_path(make_user):
    """Then the JSON (an attachment, scope "tree") has all six turns with the turn fields of
    the account export, each user turn's parent, each answer's reply_to, and selected_path =
    the edit and its answer."""
    user = make_user("owner")
    conversation, t = branched_conversation(user)

    response = signed_in(user).get(f"/c/{conversation.pk}/export.json")

    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].rstrip('"').endswith(".json")
    assert response["Cache-Control"] == "no-store"
    data = json.loads(response.content)
    assert (data["format"], data["kind"], data["scope"]) == ("chatsite-export", "conversation", "tree")
    item = data["conversation"]
    assert item["conversation_id"] == str(conversation.pk) and item["title"] == "Branches"
    turns = {x["turn_id"]: x for x in item["turns"]}
    assert len(turns) == 6
    assert turns[str(t["q2"].turn_id)]["parent"] == str(t["q1"].turn_id)
    assert turns[str(t["q1e"].turn_id)]["parent"] is None
    assert turns[str(t["q1e"].turn_id)]["replaces"] == str(t["q1"].turn_id)
    assert turns[str(t["a2"].turn_id)]["reply_to"] == str(t["q2"].turn_id)
    assert turns[str(t["a2"].turn_id)]["prompt_tokens"] == 3
    assert item["selected_path"] == [str(t["q1e"].turn_id), str(t["a1e"].turn_id)]
    assert "share_links" not in item


def test_old_rows_get_their_derived_parent_in_the_json(make_user):
    """Given turns written before the tree (no stored parent), then the JSON names the parent
    the tree derives (q2 follows q1)."""
    user = make_user("owner")
    conversation = services.conversation_create(owner=user)
    q1 = services.turn_append_user(conversation=conversation, content="one")
    q2 = services.turn_append_user(conversation=conversation, content="two")  # no parent: old style

    data = json.loads(signed_in(user).get(f"/c/{conversation.pk}/export.json").content)

    parents = {x["turn_id"]: x["parent"] for x in data["conversation"]["turns"]}
    assert q2.parent_id is None and parents[str(q2.turn_id)] == str(q1.turn_id)


@pytest.mark.parametrize("extension", ["md", "json"])
def test_only_the_owner_can_export(make_user, extension):
    """Another user, an anonymous visitor and an unknown id get no export (404, sign-in)."""
    owner = make_user("owner")
    conversation, _ = branched_conversation(owner)
    other = make_user("other")

    assert signed_in(other).get(f"/c/{conversation.pk}/export.{extension}").status_code == 404
    assert Client().get(f"/c/{conversation.pk}/export.{extension}").status_code == 302
    missing = "00000000-0000-4000-8000-000000000000"
    assert signed_in(owner).get(f"/c/{missing}/export.{extension}").status_code == 404


def test_an_unknown_format_is_404_and_the_menu_links_both(make_user):
    user = make_user("owner")
    conversation, _ = branched_conversation(user)
    client = signed_in(user)

    assert client.get(f"/c/{conversation.pk}/export.pdf").status_code == 404
    page = client.get(f"/c/{conversation.pk}/").content.decode()
    assert f'href="/c/{conversation.pk}/export.md" download' in page
    assert f'href="/c/{conversation.pk}/export.json" download' in page


def test_a_removed_members_org_conversation_is_not_exported(make_user):
    """An organisation's conversation is the organisation's: its owner exports it only while
    a member (conversation_get_for_user)."""
    user = make_user("owner")
    org = Organisation.objects.create(name="Acme", slug="acme")
    conversation = services.conversation_create(owner=user, org=None)
    type(conversation).objects.filter(pk=conversation.pk).update(org=org)

    assert signed_in(user).get(f"/c/{conversation.pk}/export.json").status_code == 404


def test_the_selected_path_carries_the_answer_version_chosen(make_user):
    """Given a question with two answers whose first is chosen again with `<`
    (Conversation.answer_choices), the JSON's selected_path and the Markdown hold that first
    answer, as the page shows it, not the newest."""
    import uuid  # noqa: PLC0415

    user = make_user("owner")
    conversation = services.conversation_create(owner=user, title="Versions")
    question = services.turn_append_user(conversation=conversation, content="q")
    answers = [
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
            content=text, status="complete", prompt_tokens=1, completion_tokens=1,
        )  # fmt: skip
        for text in ("first", "second")
    ]
    services.answer_select(conversation=conversation, question_id=question.turn_id, answer_id=answers[0].turn_id)

    client = signed_in(user)
    item = json.loads(client.get(f"/c/{conversation.pk}/export.json").content)["conversation"]
    markdown = client.get(f"/c/{conversation.pk}/export.md").content.decode()

    assert item["selected_path"] == [str(question.turn_id), str(answers[0].turn_id)]
    assert "first" in markdown.split("## Assistant", 1)[1] and "second" not in markdown


def test_markdown_shows_the_tool_calls_and_results_before_the_answer(make_user):
    """Given an answer written after two tool calls, when the Markdown is downloaded, then under
    the assistant's heading it says "Used 2 tools", lists each call as code with its result in a
    code block, and then the answer's text."""
    from tests.tool_rounds import conversation_with_round  # noqa: PLC0415

    user = make_user("owner")
    conversation, _ = conversation_with_round(user, calls=(
        ("get_weather", '{"city": "Paris"}', '{"temp_c": 21}'),
        ("shell", '{"cmd": "echo ```"}', "line one\n```\nline three"),
    ))  # fmt: skip

    text = signed_in(user).get(f"/c/{conversation.pk}/export.md").content.decode()

    used = text.index("**Used 2 tools:**")
    assert used < text.index("It is 21 degrees and clear.")
    assert '1. `get_weather({"city": "Paris"})`' in text
    assert '   ```\n   {"temp_c": 21}\n   ```' in text
    assert '2. ````shell({"cmd": "echo ```"})````' in text  # a longer run of backticks around it
    # A result holding a fence is fenced with a longer one, so it stays one block.
    assert "   ````\n   line one\n   ```\n   line three\n   ````" in text
    assert text.count("## Assistant") == 1  # the calling answer is no answer of its own


def test_json_gives_each_project_answer_its_sources(make_user):
    """Given a project chat whose answer had two passages as sources, when the JSON is
    downloaded, then that answer's turn carries them in order (file name and passage text) and
    the question carries none."""
    from tests.projects_support import project_chat_with_sources  # noqa: PLC0415

    user = make_user("owner")
    _project, chat, answer = project_chat_with_sources(user, passages=("Launch at 06:00.", "Pad 39A, weather permitting."))

    document = json.loads(signed_in(user).get(f"/c/{chat.pk}/export.json").content)

    turns = {t["turn_id"]: t for t in document["conversation"]["turns"]}
    sources = turns[str(answer.turn_id)]["sources"]
    assert [(s["file_name"], s["text"]) for s in sources] == [
        ("mission.md", "Launch at 06:00."), ("mission.md", "Pad 39A, weather permitting.")
    ]
    assert all("sources" not in t for t in turns.values() if t["role"] == "user")
