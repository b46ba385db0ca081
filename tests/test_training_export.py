"""``manage.py training_export`` (issue 20, part 5; privacy/training.py): JSON Lines in chat
format, one conversation a line, the branch its page shows, only training-eligible turns, tested
both ways (what must be there is, what must not be is not), with its ``--since`` and
``--region`` filters and its errors. Across two real region databases:
tests/test_training_export_regions.py. Setting the flags and their audit:
tests/test_training_optout.py.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, ManagementUtility, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Membership, Organisation
from accounts.services import user_training_opt_out_set
from conversations import services
from conversations.models import Conversation, Turn
from privacy import export_sections, training
from workspaces import services as workspace_services

pytestmark = pytest.mark.django_db


def ask(conversation, question: str, answer: str, *, status: str = "complete", **user_kwargs):
    """A stored question and its answer (``status``), through the services."""
    asked = services.turn_append_user(conversation=conversation, content=question, **user_kwargs)
    reply = services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=asked.turn_id,
        content=answer, status=status, prompt_tokens=1, completion_tokens=1,
    )  # fmt: skip
    conversation.refresh_from_db()
    return asked, reply


def run_export(tmp_path, **options) -> list[dict]:
    """Run the command into a file; returns its lines as JSON (also checks the summary)."""
    path = tmp_path / "train.jsonl"
    out = io.StringIO()
    call_command("training_export", output=str(path), stdout=out, **options)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert f"Wrote {len(lines)} conversations" in out.getvalue()
    return lines


def texts(lines: list[dict]) -> set[str]:
    return {m["content"] for line in lines for m in line["messages"]}


def chat(*pairs: tuple[str, str]) -> list[dict]:
    messages = []
    for question, answer in pairs:
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    return messages


@pytest.fixture
def acme(make_user) -> dict:
    olga, mia = make_user("olga"), make_user("mia")
    org = workspace_services.organisation_create(creator=olga, name="Acme", slug="acme")
    Membership.objects.create(organisation=org, user=mia, role="member")
    return {"org": org, "owner": olga, "member": mia}


# --- both ways ----------------------------------------------------------------------------------


def test_an_eligible_users_conversation_is_one_line_in_chat_format(make_user, tmp_path):
    ann = make_user("ann")
    conversation = services.conversation_create(owner=ann, system_prompt="Answer in French.")
    ask(conversation, "Hello?", "Bonjour.")
    ask(conversation, "How are you?", "Bien, merci.")

    lines = run_export(tmp_path)

    assert lines == [
        {
            "messages": [
                {"role": "system", "content": "Answer in French."},
                *chat(("Hello?", "Bonjour."), ("How are you?", "Bien, merci.")),
            ]
        }
    ]


def test_an_opted_out_users_turns_are_absent(make_user, tmp_path):
    ann, bob = make_user("ann"), make_user("bob", training_opt_out=True)
    ask(services.conversation_create(owner=ann), "ann-question", "ann-answer")
    ask(services.conversation_create(owner=bob), "bob-question", "bob-answer")

    lines = run_export(tmp_path)

    assert texts(lines) == {"ann-question", "ann-answer"}


def test_an_opted_out_organisations_turns_are_absent(acme, make_user, tmp_path):
    """Given Acme opted out, its member's workspace conversation is absent; the same member's
    personal chats are not Acme's and stay eligible; another person's are present."""
    Organisation.objects.filter(pk=acme["org"].pk).update(not_for_training=True)
    ask(services.conversation_create(owner=acme["member"], org=acme["org"]), "acme-q", "acme-a")
    ask(services.conversation_create(owner=make_user("zed")), "zed-q", "zed-a")

    lines = run_export(tmp_path)

    assert texts(lines) == {"zed-q", "zed-a"}


def test_turns_from_before_an_opt_out_stay_as_tagged(make_user, tmp_path):
    """Given an exchange, an opt-out, a second exchange, opting back in and a third: the first
    and third go out, the second never (its tag was decided when it was written)."""
    ann = make_user("ann")
    conversation = services.conversation_create(owner=ann)
    ask(conversation, "before", "answer one")
    user_training_opt_out_set(user=ann, opt_out=True)
    ask(conversation, "during", "answer two")
    user_training_opt_out_set(user=ann, opt_out=False)
    ask(conversation, "after", "answer three")

    (line,) = run_export(tmp_path)

    assert line["messages"] == chat(("before", "answer one"), ("after", "answer three"))


def test_a_conversation_with_no_eligible_turn_writes_nothing(make_user, tmp_path):
    ann = make_user("ann")
    conversation = services.conversation_create(owner=ann, system_prompt="Be brief.")
    user_training_opt_out_set(user=ann, opt_out=True)
    ask(conversation, "secret", "reply")

    assert run_export(tmp_path) == []
    assert (tmp_path / "train.jsonl").read_text() == ""


# --- what a line holds --------------------------------------------------------------------------


def test_only_the_branch_the_page_shows_goes_out(make_user, tmp_path):
    """Given a first message edited (a new branch), the export holds the edited version and
    its answer, not the original's; after switching back, the original's."""
    conversation = services.conversation_create(owner=make_user("ann"))
    original, _ = ask(conversation, "original", "first answer")
    ask(conversation, "edited", "second answer", replaces=original, parent_id=None)

    (shown,) = run_export(tmp_path)
    Conversation.objects.filter(pk=conversation.pk).update(
        branch_choices={"": str(original.turn_id)}
    )
    (switched,) = run_export(tmp_path)

    assert shown["messages"] == chat(("edited", "second answer"))
    assert switched["messages"] == chat(("original", "first answer"))


@pytest.mark.parametrize("status", ["cancelled", "failed", "blocked"])
def test_an_unfinished_answer_leaves_its_exchange_out_whole(make_user, tmp_path, status):
    conversation = services.conversation_create(owner=make_user("ann"))
    ask(conversation, "cut off", "half an ans", status=status)
    ask(conversation, "next", "complete answer")

    (line,) = run_export(tmp_path)

    assert line["messages"] == chat(("next", "complete answer"))


def test_an_ineligible_answer_leaves_its_eligible_question_out(make_user, tmp_path):
    """The owner opts out between the question and its answer (the write-back stores it
    later): the answer is ineligible, so the question goes neither (no user message without
    its answer)."""
    ann = make_user("ann")
    conversation = services.conversation_create(owner=ann)
    question = services.turn_append_user(conversation=conversation, content="asked while in")
    user_training_opt_out_set(user=ann, opt_out=True)
    services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="answered while out", status="complete", prompt_tokens=1, completion_tokens=1,
    )  # fmt: skip

    assert Turn.objects.get(pk=question.pk).training_eligible is True
    assert run_export(tmp_path) == []


# --- filters and errors -------------------------------------------------------------------------


def test_since_leaves_out_older_exchanges(make_user, tmp_path):
    """Given an exchange written 30 days ago and one today, ``--since`` yesterday exports only
    today's; without it, both."""
    conversation = services.conversation_create(owner=make_user("ann"))
    old = timezone.now() - timedelta(days=30)
    question = Turn.objects.create(
        conversation=conversation, role="user", content="old question", created_at=old
    )
    Turn.objects.create(
        conversation=conversation, role="assistant", content="old answer", reply_to_id=question.pk,
        created_at=old + timedelta(seconds=1),
    )  # fmt: skip
    ask(conversation, "new question", "new answer", parent_id=question.pk)
    yesterday = (timezone.now() - timedelta(days=1)).date().isoformat()

    (recent,) = run_export(tmp_path, since=yesterday)
    (everything,) = run_export(tmp_path)

    assert recent["messages"] == chat(("new question", "new answer"))
    assert everything["messages"] == chat(
        ("old question", "old answer"), ("new question", "new answer")
    )


@pytest.mark.parametrize("since", ["yesterday", "2026-13-40", "01/05/2026", ""])
def test_a_bad_since_is_a_command_error(tmp_path, since):
    with pytest.raises(CommandError, match="is not a date"):
        call_command("training_export", output=str(tmp_path / "x.jsonl"), since=since)
    assert not (tmp_path / "x.jsonl").exists()


def test_a_bad_since_on_the_command_line_prints_no_traceback(tmp_path, capsys):
    """As run from a shell: exit status 1 and one line saying what is wrong."""
    argv = ["manage.py", "training_export", "--output", str(tmp_path / "x"), "--since", "soon"]
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(argv).execute()

    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert "CommandError: --since 'soon' is not a date" in err and "Traceback" not in err


def test_region_exports_only_that_regions_conversations(make_user, tmp_path):
    ask(services.conversation_create(owner=make_user("eu", region="eu-west")), "eu-q", "eu-a")
    ask(services.conversation_create(owner=make_user("us", region="us-east")), "us-q", "us-a")

    assert texts(run_export(tmp_path, region="us-east")) == {"us-q", "us-a"}
    assert texts(run_export(tmp_path)) == {"eu-q", "eu-a", "us-q", "us-a"}


def test_an_unknown_region_is_a_command_error(tmp_path):
    with pytest.raises(CommandError, match="Unknown region 'mars'"):
        call_command("training_export", output=str(tmp_path / "x.jsonl"), region="mars")
    assert list(tmp_path.iterdir()) == []  # no half-written file left behind


def test_a_missing_output_folder_is_a_command_error(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        call_command("training_export", output=str(tmp_path / "nowhere" / "x.jsonl"))


def test_records_are_read_batch_by_batch_as_they_are_asked_for(make_user, monkeypatch):
    """Streaming: with batches of 2 conversations, the first record costs one batch of
    conversations and one query of its turns, not all five conversations."""
    monkeypatch.setattr(export_sections, "BATCH", 2)
    for n in range(5):
        ask(services.conversation_create(owner=make_user(f"u{n}")), f"q{n}", f"a{n}")

    records = training.training_records()
    with CaptureQueriesContext(connection) as first:
        head = next(records)
    rest = list(records)

    conversation_reads = [q for q in first if 'FROM "conversations_conversation"' in q["sql"]]
    assert len(conversation_reads) == 1 and "LIMIT 2" in conversation_reads[0]["sql"]
    assert sorted(r["messages"][0]["content"] for r in [head, *rest]) == [f"q{n}" for n in range(5)]
