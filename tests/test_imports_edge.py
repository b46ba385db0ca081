"""Importing a file a person made by hand, cut, or got from a buggy exporter (imports/): each
problem is refused with a 400 naming it and nothing written, never a server error, an endless
walk or a row the service cannot read back; odd text is made storable; a long conversation reads
in linear time."""

from __future__ import annotations

import json
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client

from accounts.services import api_key_create
from conversations.models import Conversation, Turn
from imports.formats import ImportFormatError, chats_read
from tests.test_imports import T0, chatgpt_export, chatgpt_node, openwebui_export, signed_in, tree_of

pytestmark = pytest.mark.django_db(transaction=True)


def own_export(*turns: dict, **conversation) -> dict:
    """This service's export of one conversation: ``turns`` given their id, role and what else
    they need; user turns at T0, answers a second later unless given."""
    rows = [
        {"content": f"{t['role']} {t['turn_id']}", "created_at": T0 + (t["role"] != "user"), "status": "complete", **t}
        for t in turns
    ]
    return {"format": "chatsite-export", "kind": "conversation",
            "conversation": {"conversation_id": "c1", "title": "t", "turns": rows, **conversation}}  # fmt: skip


def post(user, raw: bytes):
    """POST /v1/imports with ``raw`` as the file, with a key of ``user``."""
    key = api_key_create(user=user, name="import").raw
    client = Client(headers={"Authorization": f"Bearer {key}"})
    return client.post("/v1/imports", {"file": SimpleUploadedFile("export.json", raw, "application/json")})


def chatgpt_with(change) -> bytes:
    """The ChatGPT export of tests/test_imports.py, with ``change(conversation)`` applied."""
    export = chatgpt_export()
    change(export[0])
    return json.dumps(export).encode()


def openwebui_with(change) -> bytes:
    export = openwebui_export()
    change(export[0]["chat"]["history"]["messages"])
    return json.dumps(export).encode()


def _message(node: str, **fields):
    return lambda conversation: conversation["mapping"][node]["message"].update(fields)


def _parent(node: str, parent):
    return lambda conversation: conversation["mapping"][node].update(parent=parent)


REFUSED = {
    "nested too deeply": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "a parent that is a list": (chatgpt_with(_parent("u1", ["sys"])), "mapping['u1'].parent: ['sys'] is not a node"),
    "a parentId that is an object": (
        openwebui_with(lambda m: m["m2"].update(parentId={"id": "m1"})), "messages['m2'].parentId: {'id': 'm1'} is not"
    ),
    "a time before year 1 in UTC": (
        chatgpt_with(_message("u1", create_time="0001-01-01T00:00:00+05:00")), "create_time: not a time"
    ),
    "a time after year 9999 in UTC": (
        chatgpt_with(_message("u1", create_time="9999-12-31T23:59:59-05:00")), "create_time: not a time"
    ),
    "a time in the future": (chatgpt_with(lambda c: c.update(update_time=4_102_444_800)), "update_time: 4102444800 is in the future"),
    "two turns with one id": (
        json.dumps(own_export({"turn_id": "q", "role": "user"}, {"turn_id": "q", "role": "user"})).encode(),
        "turns[1].turn_id: 'q' is the id of an earlier turn too",
    ),
    "a number of 5,000 digits": (b'{"mapping": ' + b"1" * 5000 + b"}", "a number of more than 4,300 digits"),
    "an archive of no conversations": (
        json.dumps({"format": "chatsite-export", "conversations": []}).encode(), "The file holds no conversations."
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_malformed_file_is_a_400_naming_the_problem_and_writes_nothing(make_user, case):
    """Given a file with ``case`` (each was a server error, or imported rows the service could
    not read back, or imported nothing with a 201), then /v1/imports answers 400 saying what
    is wrong, and the user has no conversation."""
    raw, says = REFUSED[case]
    user = make_user("careful")

    response = post(user, raw)

    assert response.status_code == 400, response.content
    assert says in response.json()["error"]["message"]
    assert not Conversation.objects.filter(owner=user).exists()


@pytest.mark.parametrize("link", ["parent", "self"])
def test_parents_in_a_loop_in_this_services_export_are_refused(link):
    """Given an export whose user turns are each other's parent (or one its own), then reading
    refuses it (the import used to walk up the loop for ever to find the branch shown)."""
    turns = [{"turn_id": "q", "role": "user", "parent": "p" if link == "parent" else "q"}]
    if link == "parent":
        turns.append({"turn_id": "p", "role": "user", "parent": "q"})

    with pytest.raises(ImportFormatError, match="parents form a cycle"):
        chats_read(own_export(*turns, selected_path=["q"]))


def test_unpaired_surrogates_and_nul_in_names_are_made_storable(make_user):
    """Given JSON text with unpaired UTF-16 surrogates (an emoji cut in half) in a title, a
    message, an id and a model name, and a NUL in a model name, then the file imports (was a
    server error): each surrogate becomes U+FFFD, the NUL is dropped, and the page shows it."""

    def change(conversation):
        conversation["title"] = "Trip \ud83d"
        conversation["mapping"]["u1"]["message"]["content"]["parts"] = ["Plan \ude00 a trip"]
        conversation["mapping"]["a1"]["message"]["metadata"]["model_slug"] = "gpt-4o\x00\ud800"
        conversation["conversation_id"] = "id-\udc00"

    user = make_user("emoji")

    response = post(user, chatgpt_with(change))

    assert response.status_code == 201, response.content
    conversation = Conversation.objects.get(owner=user)
    assert conversation.title == "Trip \ufffd"
    assert Turn.objects.filter(content="Plan \ufffd a trip").exists()
    assert Turn.objects.filter(model_version="gpt-4o\ufffd").exists()
    assert signed_in(user).get(f"/c/{conversation.pk}/").status_code == 200


def test_a_long_chain_of_nodes_reads_in_linear_time():
    """Given a ChatGPT conversation of 30,000 nodes in one chain, most of them without a
    message or a time (within the file size limit: ~45 bytes a node), then it reads in seconds
    (each node used to walk the whole chain above it: minutes here, hours at the limit), and
    a long answer in parts joins into one."""
    count = 30_000
    mapping = {f"n{i}": {"message": None, "parent": f"n{i - 1}" if i else None} for i in range(count)}
    mapping["u"] = chatgpt_node("u", f"n{count - 1}", "user", "Hi", None)
    above = "u"
    for i in range(count):
        mapping[f"a{i}"] = chatgpt_node(f"a{i}", above, "assistant", "x", None)
        above = f"a{i}"
    started = time.monotonic()

    [chat] = chats_read([{"title": "Long", "id": "long", "create_time": T0, "mapping": mapping}])

    assert time.monotonic() - started < 10
    assert [(m.role, len(m.content)) for m in chat.messages] == [("user", 2), ("assistant", 3 * count - 2)]


def test_many_tool_results_without_their_calls_read_in_linear_time():
    """Given this service's export with 30,000 tool results each naming a different answer the
    file lacks, and 30,000 results to one calling answer that lists none of their calls, then
    it reads in seconds (~1 s here; each stand-in used to scan the whole file for its question,
    and each added call to rebuild its answer's calls: ~45 s here, and the time grew with the
    square of the count), every result answering a call."""
    count = 30_000
    turns = [
        {"turn_id": "q", "role": "user", "created_at": T0},
        {"turn_id": "c", "role": "assistant", "reply_to": "q", "created_at": T0 + 1, "finish_reason": "tool_calls"},
        *({"turn_id": f"g{i}", "role": "tool", "reply_to": f"gone{i}", "tool_call_id": "x", "created_at": T0 + 2 + i}
          for i in range(count)),
        *({"turn_id": f"r{i}", "role": "tool", "reply_to": "c", "tool_call_id": f"y{i}", "created_at": T0 + 2 + i}
          for i in range(count)),
    ]  # fmt: skip
    started = time.monotonic()

    [chat] = chats_read(own_export(*turns))

    assert time.monotonic() - started < 15
    by_key = {m.key: m for m in chat.messages}
    assert (chat.stand_ins, chat.added_calls, len(by_key["c"].tool_calls)) == (count, count, count)
    assert {by_key[f"gone{i}"].reply_to for i in range(count)} == {"q"}


def test_a_message_without_a_time_comes_after_the_one_it_follows():
    """Given ChatGPT messages without a time (each takes its parent's), whose answer's id sorts
    before its question's, then the answer is still placed under its question (it was ordered
    first by id, found no question above it and was left out)."""
    mapping = {
        "q": chatgpt_node("q", None, "user", "Hi", None),
        "a": chatgpt_node("a", "q", "assistant", "Hello", None),
    }

    [chat] = chats_read([{"title": "No times", "id": "nt", "create_time": T0, "mapping": mapping}])

    assert [(m.role, m.reply_to) for m in chat.messages] == [("user", None), ("assistant", "q")]
    assert chat.skipped == 0


def test_an_imported_chatgpt_conversation_exported_and_imported_again_keeps_its_tree(make_user):
    """Round trip from another product: ChatGPT's file imported by one account, exported as this
    service's JSON, imported by another: the same tree, branch shown and answer versions."""
    alice, bob = make_user("alice"), make_user("bob")
    post(alice, json.dumps(chatgpt_export()).encode())
    first = Conversation.objects.get(owner=alice)
    exported = signed_in(alice).get(f"/c/{first.pk}/export.json").content

    assert post(bob, exported).status_code == 201

    assert tree_of(Conversation.objects.get(owner=bob)) == tree_of(first)


def test_a_conversation_listed_twice_in_one_file_is_imported_once_and_said_so(make_user):
    """Given an Open WebUI file listing one chat twice, when it is imported, then one
    conversation is created and the reply counts the second as ``repeated``, not as one
    already here from an earlier import; the page says it was in the file more than once."""
    user = make_user("twice")
    raw = json.dumps([*openwebui_export(), *openwebui_export()]).encode()

    body = post(user, raw).json()

    assert (len(body["created"]), body["already"], body["repeated"]) == (1, 0, 1)
    page = signed_in(make_user("twice-page"))
    done = page.get(page.post("/settings/import", {"file": SimpleUploadedFile("c.json", raw)})["Location"])
    assert "1 conversation was in the file more than once and imported once." in done.content.decode()
    assert "already here" not in done.content.decode()


def test_imports_give_their_database_connections_back_to_the_pool(make_user):
    """Given three imports through /v1 and the page (each read and written on a worker thread
    of its own), then afterwards the process's pool has as many connections in use as before
    (each import's worker thread held one until the pool ran dry and every later query
    waited 30 s: a whole test run failed that way)."""
    user = make_user("pooled")
    pool = connection.pool
    connection.ensure_connection()

    def in_use() -> int:
        stats = pool.get_stats()
        return stats["pool_size"] - stats["pool_available"]

    before = in_use()
    for _ in range(2):
        assert post(user, json.dumps(openwebui_export()).encode()).status_code == 201
    page = signed_in(user)
    assert page.post("/settings/import", {"file": SimpleUploadedFile("c.json", json.dumps(openwebui_export()).encode())}).status_code == 302

    assert in_use() == before
