"""Context trimming and running summaries (issue 4, "Context assembly and summarisation"), with
the scripted engine double. The summariser calls the model through the OpenAI-compatible
endpoint; here that endpoint is the real app, served in this process over an httpx transport.
(tests/integration/test_summaries_real.py runs the same with a real Celery worker, the real
uvicorn server and the real engine.)"""

from __future__ import annotations

import uuid

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.handlers.wsgi import WSGIHandler
from django.db import transaction
from django.test import Client

from accounts.forms import SignUpForm
from accounts.models import ApiKey, Organisation
from accounts.services import api_key_authenticate, service_api_key, user_is_service
from conversations import selectors, services, summaries
from conversations.models import Conversation, Turn
from inference import service_client
from tests.chat_support import signed_in
from tests.versions_support import answered, spy_prompts

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = 20  # words per message: the double counts 1 token a word + 3 a message


def words(tag: str) -> str:
    return f"{tag} " + " ".join(["w"] * (WORDS - 1))


def seed(conversation: Conversation, count: int) -> list[Turn]:
    """``count`` answered exchanges of 2 x (3 + 20) = 46 tokens each; the user turns."""
    questions = []
    for i in range(count):
        q = services.turn_append_user(conversation=conversation, content=words(f"q{i}"))
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=words(f"a{i}"), status="complete", prompt_tokens=10, completion_tokens=WORDS,
        )  # fmt: skip
        questions.append(q)
    return questions


@pytest.fixture
def small_context(settings):
    """A 200-token context, 50 of them for the answer: a 150-token prompt budget. The default
    system prompt is 9 tokens for the double; a question of 2 words is 5."""
    # Every pool shrinks to that context (the pools, not the engine, set the prompt budget).
    settings.CHAT_POOLS = [{**p, "max_context": 200, "max_tokens": 150} for p in settings.CHAT_POOLS]
    settings.CHAT_MAX_MODEL_LEN = 200
    settings.CHAT_MAX_TOKENS = 50
    settings.CHAT_SUMMARY_MAX_TOKENS = 40
    settings.CHAT_SUMMARY_KEEP_FRACTION = 0.5
    settings.CHAT_SUMMARY_TRIGGER_FRACTION = 0.75
    return settings


@pytest.fixture
def queued(monkeypatch) -> list[str]:
    """Summary tasks queued (instead of run)."""
    calls: list[str] = []
    monkeypatch.setattr(summaries.conversation_summarise, "delay", lambda cid: calls.append(cid))
    return calls


@pytest.fixture
def in_process_endpoint(monkeypatch):
    """The summariser's HTTP client talks to this process's app (real views, real auth) over
    an in-memory WSGI transport instead of a socket."""

    def client() -> httpx.Client:
        return httpx.Client(
            base_url="http://testserver",
            transport=httpx.WSGITransport(app=WSGIHandler()),
            headers={"Authorization": f"Bearer {service_api_key()}"},
        )

    monkeypatch.setattr(service_client, "http_client", client)


# --- trimming and the trigger -------------------------------------------------------------------


async def test_a_turn_over_budget_keeps_the_newest_whole_exchanges_and_records_the_rest(
    make_user, engine_double, small_context, queued
):
    """Given 6 earlier exchanges of 46 tokens and a 150-token budget, when a new message is
    answered, then its prompt holds the system prompt, the 2 newest whole exchanges and the
    question (14 + 92 tokens; a 3rd would make 152), the answer records 4 exchanges trimmed,
    and the summary task is queued for the conversation."""
    prompts = spy_prompts(engine_double)
    client, user = await signed_in(make_user)
    conversation = await Conversation.objects.acreate(owner=user, model="m", region="eu-west")
    await sync_to_async(seed)(conversation, 6)

    await answered(client, "new question", conversation.pk)

    prompt = prompts[-1]
    assert prompt[0]["role"] == "system"
    assert [m["content"].split()[0] for m in prompt[1:]] == ["q4", "a4", "q5", "a5", "new"]
    answer = await Turn.objects.filter(role="assistant").order_by("-created_at").afirst()
    assert answer.context_trimmed == 4
    assert answer.prompt_tokens == len(engine_double.requests[-1][0]) <= 150
    assert queued == [str(conversation.pk)]


async def test_a_turn_within_budget_trims_nothing_and_queues_no_summary(
    make_user, engine_double, small_context, queued
):
    client, user = await signed_in(make_user)
    conversation = await Conversation.objects.acreate(owner=user, model="m", region="eu-west")
    await sync_to_async(seed)(conversation, 1)

    await answered(client, "new question", conversation.pk)

    answer = await Turn.objects.filter(role="assistant").order_by("-created_at").afirst()
    assert answer.context_trimmed == 0
    assert queued == []


def test_a_summary_requested_in_a_rolled_back_transaction_is_never_queued(make_user, queued):
    """PF-J2: the task is queued on commit only."""
    conversation = services.conversation_create(owner=make_user())

    with pytest.raises(RuntimeError), transaction.atomic():
        summaries.summary_request(conversation_id=conversation.pk)
        raise RuntimeError("rolled back")
    assert queued == []

    with transaction.atomic():
        summaries.summary_request(conversation_id=conversation.pk)
        assert queued == []  # not before the commit
    assert queued == [str(conversation.pk)]


# --- the task -----------------------------------------------------------------------------------


def test_the_task_folds_older_exchanges_into_a_summary_through_the_endpoint(
    make_user, engine_double, small_context, in_process_endpoint
):
    """Given 6 exchanges, when the task runs, then it keeps the newest exchange that fits half
    the budget (75 tokens) verbatim, sends the 5 older ones to /v1/chat/completions as the
    service user in chunks that each fit the context with room for the summary (summaries of
    summaries: each later request carries the previous summary), and stores the last summary
    as covering through the 5th message."""
    engine_double.scripts = [["Summary one."], ["Summary two."], ["Summary three."]]
    prompts = spy_prompts(engine_double)
    conversation = services.conversation_create(owner=make_user())
    questions = seed(conversation, 6)

    assert summaries.conversation_summarise(str(conversation.pk)) is True

    conversation.refresh_from_db()
    assert conversation.summary == "Summary three."
    assert conversation.summary_through == questions[4].created_at
    assert len(engine_double.requests) == 3
    for ids, options, _ in engine_double.requests:
        assert len(ids) <= 200 - 40 and options.max_tokens == 40 and options.temperature == 0
    sent = [p[-1]["content"] for p in prompts]
    assert "q0" in sent[0] and "q4" not in sent[0] and "(none yet)" in sent[0]
    assert "Summary one." in sent[1] and "Summary two." in sent[2] and "q4" in sent[2]
    assert all("q5" not in text for text in sent)
    service_key = ApiKey.objects.get(user__username=small_context.CHAT_SERVICE_USERNAME)
    assert service_key.last_used_at is not None


def test_a_second_run_with_nothing_new_makes_no_model_call(
    make_user, engine_double, small_context, in_process_endpoint
):
    """The task is idempotent: run again (a redelivery, a duplicate trigger), it finds nothing
    beyond the verbatim window and neither calls the model nor changes the summary."""
    conversation = services.conversation_create(owner=make_user())
    seed(conversation, 6)
    assert summaries.conversation_summarise(str(conversation.pk)) is True
    conversation.refresh_from_db()
    calls, summary, through = len(engine_double.requests), conversation.summary, conversation.summary_through

    assert summaries.conversation_summarise(str(conversation.pk)) is False

    conversation.refresh_from_db()
    assert len(engine_double.requests) == calls
    assert (conversation.summary, conversation.summary_through) == (summary, through)


async def test_the_next_prompt_uses_the_summary_and_only_the_later_exchanges(
    make_user, engine_double, small_context, in_process_endpoint
):
    """Given a conversation summarised through its 5th of 6 exchanges, when a new message is
    answered, then the system message carries the summary (after the system prompt), only the
    6th exchange goes in verbatim, and the answer records the 5 summarised exchanges."""
    engine_double.scripts = [["S1."], ["S2."], ["The user counts words."]]
    client, user = await signed_in(make_user)
    conversation = await Conversation.objects.acreate(owner=user, model="m", region="eu-west")
    await sync_to_async(seed)(conversation, 6)
    assert await sync_to_async(summaries.conversation_summarise)(str(conversation.pk)) is True
    prompts = spy_prompts(engine_double)

    await answered(client, "new question", conversation.pk)

    system, *rest = prompts[-1]
    assert system["content"].index("assistant") < system["content"].index("The user counts words.")
    assert [m["content"].split()[0] for m in rest] == ["q5", "a5", "new"]
    answer = await Turn.objects.filter(role="assistant").order_by("-created_at").afirst()
    assert answer.context_trimmed == 5


def test_an_edit_of_a_summarised_message_is_answered_without_the_summary(
    make_user, small_context
):
    """The summary speaks of turns after an old message too: answering an edit of a message
    it covers uses the raw history before that message instead."""
    conversation = services.conversation_create(owner=make_user())
    questions = seed(conversation, 4)
    services.conversation_summary_store(
        conversation_id=conversation.pk, summary="old summary", through=questions[2].created_at,
        expected_through=None,
    )  # fmt: skip
    edit = services.turn_append_user(conversation=conversation, content="q1 edited", replaces=questions[1])

    context = selectors.prompt_context(conversation_id=conversation.pk, question=edit)

    assert context.summary == "" and context.summarised == 0
    assert [q.split()[0] for q, _ in context.exchanges] == ["q0"]


def test_a_late_run_never_replaces_a_newer_summary(make_user):
    """Compare-and-set on summary_through: a run that started from an older state stores
    nothing, and no run moves the summary backwards."""
    conversation = services.conversation_create(owner=make_user())
    questions = seed(conversation, 3)
    assert services.conversation_summary_store(
        conversation_id=conversation.pk, summary="newer", through=questions[1].created_at,
        expected_through=None,
    )  # fmt: skip

    stale = services.conversation_summary_store(
        conversation_id=conversation.pk, summary="stale", through=questions[2].created_at,
        expected_through=None,
    )  # fmt: skip
    backwards = services.conversation_summary_store(
        conversation_id=conversation.pk, summary="older", through=questions[0].created_at,
        expected_through=questions[1].created_at,
    )  # fmt: skip

    conversation.refresh_from_db()
    assert (stale, backwards) == (False, False)
    assert (conversation.summary, conversation.summary_through) == ("newer", questions[1].created_at)


def test_zero_retention_conversations_are_never_summarised(
    make_user, engine_double, small_context, in_process_endpoint
):
    """A summary is stored in PostgreSQL: a zero-retention organisation's conversation gets
    none (and the model is not asked)."""
    org = Organisation.objects.create(name="ZDR", slug="zdr", zero_retention=True)
    conversation = services.conversation_create(owner=make_user())
    seed(conversation, 6)
    Conversation.objects.filter(pk=conversation.pk).update(org=org)

    assert summaries.conversation_summarise(str(conversation.pk)) is False

    conversation.refresh_from_db()
    assert conversation.summary == "" and engine_double.requests == []


def test_an_unreachable_endpoint_leaves_the_summary_and_the_task_ends(make_user, small_context):
    """The model endpoint down: the task logs it and ends (a later turn queues it again); the
    stored summary is untouched."""
    small_context.CHAT_INTERNAL_API_URL = "http://127.0.0.1:9"
    conversation = services.conversation_create(owner=make_user())
    seed(conversation, 6)

    assert summaries.conversation_summarise(str(conversation.pk)) is False

    conversation.refresh_from_db()
    assert conversation.summary == "" and conversation.summary_through is None


# --- the service credential ---------------------------------------------------------------------


def test_the_service_key_authenticates_the_service_user_who_cannot_sign_in(settings):
    """The derived key is the same on every call (every process computes it from SECRET_KEY),
    is stored hashed once, authenticates the service user, and that user has no password and a
    name the sign-up form refuses."""
    raw = service_api_key()

    assert service_api_key() == raw
    assert ApiKey.objects.count() == 1
    assert raw.split(".", 1)[1] not in ApiKey.objects.get().key_hash
    user = api_key_authenticate(raw)
    assert user is not None and user_is_service(user)
    assert not user.has_usable_password()
    assert not Client().login(username=user.username, password="")
    form = SignUpForm(data={"username": settings.CHAT_SERVICE_USERNAME, "password1": "A-long-pass-9x", "password2": "A-long-pass-9x"})
    assert not form.is_valid()


def test_a_configured_service_key_is_used_as_given(settings):
    settings.CHAT_SERVICE_API_KEY = "sk-remote.pool-key"

    assert service_api_key() == "sk-remote.pool-key"
    assert not ApiKey.objects.exists()


async def test_background_jobs_run_at_the_lowest_engine_priority(make_user, engine_double, settings):
    """DESIGN.md, "How background jobs reach the model": requests made with the service key run
    at settings.CHAT_BACKGROUND_PRIORITY in the engine; a user's requests at their pool's
    priority (inference/pools.py)."""
    from asgiref.sync import sync_to_async

    from accounts.services import api_key_create
    from tests.api_support import BearerClient, post_json

    settings.CHAT_BACKGROUND_PRIORITY = 7
    engine_double.scripts = [["job"], ["user"]]
    body = {"model": settings.CHAT_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
    job = BearerClient(await sync_to_async(service_api_key)())
    assert (await post_json(job, "/v1/chat/completions", body)).status_code == 200
    user = await sync_to_async(make_user)("person")
    issued = await sync_to_async(api_key_create)(user=user, name="k")
    assert (await post_json(BearerClient(issued.raw), "/v1/chat/completions", body)).status_code == 200
    # The free user's turn runs at its pool's priority (mini: 1), the job after it.
    assert [options.priority for _, options, _ in engine_double.requests] == [7, 1]


def seed_branch(conversation: Conversation, count: int) -> list[Turn]:
    """Like :func:`seed`, each message stored with its parent (the one before it)."""
    questions: list[Turn] = []
    for i in range(count):
        parent = questions[-1].turn_id if questions else None
        q = services.turn_append_user(conversation=conversation, content=words(f"q{i}"), parent_id=parent)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=words(f"a{i}"), status="complete", prompt_tokens=10, completion_tokens=WORDS,
        )  # fmt: skip
        questions.append(q)
    return questions


def test_the_summary_is_used_only_on_the_branch_it_summarises(make_user, small_context):
    """Given q0 -> q1 -> q2 -> q3 summarised through q2, when q3 is edited (a branch below q2),
    then its prompt uses the summary; when q2 is edited (a branch below q1, beside what the
    summary covers), then the summary is left out and the raw history q0, q1 is used, and so it
    is for a message after that edit (its branch is not the one summarised)."""
    conversation = services.conversation_create(owner=make_user())
    questions = seed_branch(conversation, 4)
    services.conversation_summary_store(
        conversation_id=conversation.pk, summary="old summary", through=questions[2].created_at,
        expected_through=None,
    )  # fmt: skip
    below_summary = services.turn_append_user(
        conversation=conversation, content="q3 edited", replaces=questions[3], parent_id=questions[2].turn_id
    )
    beside_summary = services.turn_append_user(
        conversation=conversation, content="q2 edited", replaces=questions[2], parent_id=questions[1].turn_id
    )

    services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=beside_summary.turn_id,
        content=words("b2"), status="complete", prompt_tokens=10, completion_tokens=WORDS,
    )  # fmt: skip
    on_that_branch = services.turn_append_user(
        conversation=conversation, content="q3 there", parent_id=beside_summary.turn_id
    )

    used = selectors.prompt_context(conversation_id=conversation.pk, question=below_summary)
    unused = selectors.prompt_context(conversation_id=conversation.pk, question=beside_summary)
    later = selectors.prompt_context(conversation_id=conversation.pk, question=on_that_branch)

    assert used.summary == "old summary" and used.exchanges == []
    assert unused.summary == ""
    assert [q.split()[0] for q, _ in unused.exchanges] == ["q0", "q1"]
    # A message after the edit: the summary (of q0..q2) is not its history either.
    assert later.summary == ""
    assert [q.split()[0] for q, _ in later.exchanges] == ["q0", "q1", "q2"]
    assert later.exchanges[-1][1].split()[0] == "b2"
