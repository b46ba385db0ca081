"""Memory extraction (issue 7; memory/extraction.py) with the scripted engine double. The model is
reached through the OpenAI-compatible endpoint, here the real app served in this process over an
httpx transport (as tests/test_summaries.py does); the double answers with scripted JSON.
(tests/integration/test_memory_extraction_real.py runs it against the real engine.)"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta

import pytest
from django.db.models import F

from accounts.models import Organisation
from conversations import services
from conversations.models import Conversation, Turn
from memory import extraction, tasks
from memory.extraction_models import ExtractionMarker
from memory.models import UserMemory
from tests.test_summaries import in_process_endpoint  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)

LYON = "The user lives in Lyon."
CAT = "The user has a grey cat called Pixel."


def answer(*facts: str) -> list[str]:
    """A scripted model answer: the facts as the JSON the schema asks for, in pieces."""
    text = json.dumps({"facts": list(facts)})
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def seed(conversation: Conversation, *questions: str) -> None:
    for content in questions:
        q = services.turn_append_user(conversation=conversation, content=content)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content="Noted.", status="complete", prompt_tokens=10, completion_tokens=2,
        )  # fmt: skip


def idle_after(conversation: Conversation, settings, extra_s: float = 1.0):
    """A moment when ``conversation`` has been idle for CHAT_MEMORY_IDLE_S (+ ``extra_s``)."""
    conversation.refresh_from_db()
    return conversation.last_turn_at + timedelta(seconds=settings.CHAT_MEMORY_IDLE_S + extra_s)


def make_idle(conversation, settings) -> None:
    """Move the conversation and its turns CHAT_MEMORY_IDLE_S + 5 s into the past (for runs
    that read the real clock: the Celery tasks)."""
    shift = timedelta(seconds=settings.CHAT_MEMORY_IDLE_S + 5)
    Turn.objects.filter(conversation_id=conversation.pk).update(created_at=F("created_at") - shift)
    Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=F("last_turn_at") - shift)


def extract(conversation, now):
    return extraction.conversation_memory_extract(conversation_id=conversation.pk, now=now)


def facts_of(user) -> list[str]:
    return sorted(UserMemory.objects.filter(user=user).values_list("text", flat=True))


@pytest.fixture
def talk(make_user):
    """A user's conversation with two stated facts."""
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    seed(conversation, "I moved to Lyon last year.", "My grey cat Pixel sleeps all day.")
    return user, conversation


@pytest.fixture
def held_model_call(monkeypatch):
    """The first model call waits until the test sets the returned event (a slow run); later
    calls go straight through. ``entered`` is set once the first call is waiting."""
    entered, release = threading.Event(), threading.Event()
    original = extraction.chat_complete_json
    calls = []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            assert release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(extraction, "chat_complete_json", call)
    return entered, release


def run_in_thread(fn):
    """Run ``fn`` in a thread (its own database connection); returns (thread, result box)."""
    box: dict = {}

    def target():
        from django.db import connection

        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


# --- one extraction ------------------------------------------------------------------------------


def test_an_idle_conversation_yields_facts_stored_as_extracted_from_it(
    talk, engine_double, in_process_endpoint, settings  # noqa: F811
):
    """Given a conversation idle for CHAT_MEMORY_IDLE_S, when the task runs, then the model is
    asked once, as the service user at the background priority, with the facts JSON schema and
    the user's messages, and its facts are stored as extracted from that conversation."""
    user, conversation = talk
    engine_double.scripts = [answer(LYON, CAT)]

    result = extract(conversation, idle_after(conversation, settings))

    assert result == extraction.Extraction("stored", 2)
    assert facts_of(user) == sorted([LYON, CAT])
    rows = UserMemory.objects.filter(user=user)
    assert {(m.source, m.source_conversation_id) for m in rows} == {("extracted", conversation.pk)}
    [(prompt_ids, options, _)] = engine_double.requests
    assert options.json_schema == extraction.facts_schema()
    assert options.priority == settings.CHAT_BACKGROUND_PRIORITY
    assert options.max_tokens <= settings.CHAT_MEMORY_EXTRACT_MAX_TOKENS
    marker = ExtractionMarker.objects.get(pk=conversation.pk)
    conversation.refresh_from_db()
    assert marker.extracted_through == conversation.last_turn_at and marker.claimed_until is None


def test_the_prompt_carries_the_turns_since_the_last_extraction_only(
    talk, engine_double, in_process_endpoint, settings, monkeypatch  # noqa: F811
):
    """A later idle period sends the model only the exchanges written after the previous one."""
    user, conversation = talk
    sent = []
    original = extraction.chat_complete_json
    monkeypatch.setattr(
        extraction, "chat_complete_json", lambda messages, **kw: sent.append(messages[-1]["content"]) or original(messages, **kw)
    )
    engine_double.scripts = [answer(LYON), answer("The user rows on Sundays.")]
    assert extract(conversation, idle_after(conversation, settings)).status == "stored"
    seed(conversation, "I row on Sundays.")

    later = extract(conversation, idle_after(conversation, settings))

    assert later == extraction.Extraction("stored", 1)
    assert len(sent) == 2
    assert "User: I moved to Lyon last year." in sent[0] and "User: My grey cat Pixel" in sent[0]
    assert "User: I row on Sundays." in sent[1]
    assert "Lyon" not in sent[1] and "Pixel" not in sent[1]
    assert facts_of(user) == sorted([LYON, "The user rows on Sundays."])


def test_a_conversation_not_idle_yet_is_left_for_later(talk, engine_double, in_process_endpoint, settings):  # noqa: F811
    user, conversation = talk
    engine_double.scripts = [answer(LYON)]
    almost = idle_after(conversation, settings, extra_s=-2)

    assert extract(conversation, almost).status == "not_idle"
    assert engine_double.requests == [] and facts_of(user) == []
    assert extract(conversation, almost + timedelta(seconds=3)).status == "stored"


async def test_a_turn_never_queues_or_waits_for_an_extraction(make_user, engine_double, monkeypatch):
    """The turn path does not touch memory extraction: the sweep finds idle conversations."""
    from tests.test_versions import answered
    from tests.test_views import signed_in

    queued = []
    monkeypatch.setattr(tasks.memory_extract, "delay", lambda *a, **k: queued.append(a))
    monkeypatch.setattr(tasks.memory_extract, "apply_async", lambda *a, **k: queued.append(a))
    client, user = await signed_in(make_user)
    conversation = await Conversation.objects.acreate(owner=user, model="m", region="eu-west")

    await answered(client, "I live in Lyon.", conversation.pk)

    assert queued == []
    assert not await ExtractionMarker.objects.filter(pk=conversation.pk).aexists()


# --- exactly once ------------------------------------------------------------------------------


def test_a_second_delivery_after_the_first_stores_nothing_and_asks_nothing(
    talk, engine_double, in_process_endpoint, settings  # noqa: F811
):
    """The same task delivered twice, one after the other (a redelivery after the first was
    done): one model call, one set of facts."""
    user, conversation = talk
    engine_double.scripts = [answer(LYON), answer("The user is someone else.")]
    make_idle(conversation, settings)

    first = tasks.memory_extract.run(str(conversation.pk))
    second = tasks.memory_extract.run(str(conversation.pk))

    assert first == {"status": "stored", "stored": 1}
    assert second == {"status": "done", "stored": 0}
    assert len(engine_double.requests) == 1 and facts_of(user) == [LYON]


def test_two_deliveries_at_once_ask_the_model_once_and_store_once(
    talk, engine_double, in_process_endpoint, settings, held_model_call  # noqa: F811
):
    """Two copies at the same time: the one that holds the lease runs; the other ends at once
    without asking the model."""
    user, conversation = talk
    entered, release = held_model_call
    engine_double.scripts = [answer(LYON), answer("The user is someone else.")]
    now = idle_after(conversation, settings)
    thread, box = run_in_thread(lambda: extract(conversation, now))
    assert entered.wait(30)

    second = extract(conversation, now + timedelta(seconds=1))
    release.set()
    thread.join(30)

    assert second.status == "claimed"
    assert box == {"result": extraction.Extraction("stored", 1)}
    assert len(engine_double.requests) == 1 and facts_of(user) == [LYON]


def test_a_copy_redelivered_after_the_visibility_timeout_stores_once(
    talk, engine_double, in_process_endpoint, settings, held_model_call  # noqa: F811
):
    """The first run is so slow that its lease runs out (as when the broker redelivers a task
    still running after its visibility timeout): the copy asks the model and stores; the first
    run's store then matches no marker and stores nothing. One set of facts."""
    user, conversation = talk
    entered, release = held_model_call
    # The held first run asks the model after the copy: the copy gets the first script.
    engine_double.scripts = [answer(LYON), answer(LYON, "The user is slow.")]
    now = idle_after(conversation, settings)
    thread, box = run_in_thread(lambda: extract(conversation, now))
    assert entered.wait(30)

    redelivered = extract(conversation, now + timedelta(seconds=extraction.extract_lease_s() + 1))
    release.set()
    thread.join(30)

    assert redelivered == extraction.Extraction("stored", 1)
    assert box == {"result": extraction.Extraction("lost")}
    assert len(engine_double.requests) == 2 and facts_of(user) == [LYON]


def test_two_deliveries_racing_to_store_store_once(talk, settings, monkeypatch):
    """Both copies asked the model (the lease ran out in between) and reach the store at the
    same moment: the marker's compare-and-set lets exactly one store."""
    user, conversation = talk
    barrier = threading.Barrier(2, timeout=30)

    def facts(exchanges, **kwargs):
        barrier.wait()  # both runs have their facts before either stores
        return [LYON]

    monkeypatch.setattr(extraction, "model_facts", facts)
    monkeypatch.setattr(extraction, "_chunks", lambda exchanges: [exchanges])
    now = idle_after(conversation, settings)
    settings.CHAT_MEMORY_EXTRACT_LEASE_S = 0  # no lease: both copies ask the model
    runs = [run_in_thread(lambda: extract(conversation, now)) for _ in range(2)]
    for thread, _ in runs:
        thread.join(30)

    results = sorted(box["result"].status for _, box in runs)
    assert results == ["lost", "stored"]
    assert facts_of(user) == [LYON]


def test_a_run_killed_before_its_commit_leaves_the_period_to_a_redelivered_copy(
    talk, engine_double, in_process_endpoint, settings, monkeypatch  # noqa: F811
):
    """A failure inside the store's transaction (a worker killed there) stores nothing and moves
    no marker; the copy the broker redelivers after its visibility timeout does the work."""
    import memory.services

    user, conversation = talk
    engine_double.scripts = [answer(LYON), answer(LYON)]
    now = idle_after(conversation, settings)
    real_add = memory.services.memory_add

    def killed(**kwargs):
        real_add(**kwargs)
        raise SystemExit("worker killed")

    monkeypatch.setattr(memory.services, "memory_add", killed)
    with pytest.raises(SystemExit):
        extract(conversation, now)
    assert facts_of(user) == [] and ExtractionMarker.objects.get(pk=conversation.pk).extracted_through is None
    monkeypatch.setattr(memory.services, "memory_add", real_add)

    redelivered = extract(conversation, now + timedelta(seconds=settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]))

    assert redelivered == extraction.Extraction("stored", 1) and facts_of(user) == [LYON]


# --- who is never mined --------------------------------------------------------------------------


def test_an_owner_with_memory_off_is_never_mined(talk, engine_double, in_process_endpoint, settings):  # noqa: F811
    user, conversation = talk
    user.memory_enabled = False
    user.save(update_fields=["memory_enabled"])

    assert extract(conversation, idle_after(conversation, settings)).status == "disabled"
    assert engine_double.requests == [] and facts_of(user) == []
    assert extraction.memory_sweep(now=idle_after(conversation, settings)) == []


def test_memory_off_for_the_deployment_mines_nothing(talk, engine_double, in_process_endpoint, settings):  # noqa: F811
    user, conversation = talk
    settings.CHAT_MEMORY_ENABLED = False

    assert extract(conversation, idle_after(conversation, settings)).status == "disabled"
    assert extraction.memory_sweep(now=idle_after(conversation, settings)) == []
    assert engine_double.requests == []


def test_zero_retention_conversations_are_never_mined(talk, engine_double, in_process_endpoint, settings):  # noqa: F811
    """Nothing of a zero-retention conversation may be kept: no facts, no model call, not queued."""
    user, conversation = talk
    org = Organisation.objects.create(name="ZDR", slug="zdr", zero_retention=True)
    Conversation.objects.filter(pk=conversation.pk).update(org=org)

    assert extract(conversation, idle_after(conversation, settings)).status == "zero_retention"
    assert extraction.memory_sweep(now=idle_after(conversation, settings)) == []
    assert engine_double.requests == [] and facts_of(user) == []


# --- the model's answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "The user lives in Lyon.",
        '["The user lives in Lyon."]',
        '{"facts": "The user lives in Lyon."}',
        '{"facts": [1, 2]}',
        '{"facts": [], "note": "x"}',
        '{"fact": []}',
        '{"facts": ["The user lives in Lyon."]',
    ],
)
def test_an_answer_not_of_the_schema_is_refused(text):
    with pytest.raises(ValueError):
        extraction.facts_parse(text)


def test_facts_are_capped_in_number_and_length_and_cleaned(settings):
    settings.CHAT_MEMORY_FACT_CHARS = 40
    settings.CHAT_MEMORY_EXTRACT_MAX_FACTS = 3
    text = json.dumps({"facts": [
        "  The user\nlives in   Lyon. ", "the user lives in lyon.", "", "x" * 41, "A", "B", "C",
    ]})  # fmt: skip

    assert extraction.facts_parse(text) == ["The user lives in Lyon.", "A", "B"]
    schema = extraction.facts_schema()["properties"]["facts"]
    assert schema["maxItems"] == 3 and schema["items"]["maxLength"] == 40


def test_an_answer_that_is_not_the_json_closes_the_period_with_no_facts(
    talk, engine_double, in_process_endpoint, settings  # noqa: F811
):
    """Greedy decoding would repeat a malformed answer: the period counts as mined, nothing
    stored, and the task is not asked again for it."""
    user, conversation = talk
    engine_double.scripts = [["The user lives in Lyon."]]
    now = idle_after(conversation, settings)

    assert extract(conversation, now) == extraction.Extraction("stored", 0)
    assert facts_of(user) == [] and extraction.memory_sweep(now=now) == []


def test_facts_already_known_are_not_stored_twice(talk, engine_double, in_process_endpoint, settings):  # noqa: F811
    from memory.services import memory_add

    user, conversation = talk
    memory_add(user=user, texts=[LYON])
    engine_double.scripts = [answer(LYON, CAT)]

    assert extract(conversation, idle_after(conversation, settings)) == extraction.Extraction("stored", 1)
    assert facts_of(user) == sorted([LYON, CAT])


def test_an_unreachable_endpoint_frees_the_conversation_for_the_next_sweep(talk, settings):
    user, conversation = talk
    settings.CHAT_INTERNAL_API_URL = "http://127.0.0.1:9"
    make_idle(conversation, settings)
    now = idle_after(conversation, settings)

    assert tasks.memory_extract.run(str(conversation.pk)) == {"status": "failed", "stored": 0}

    marker = ExtractionMarker.objects.get(pk=conversation.pk)
    assert marker.extracted_through is None and marker.claimed_until is None
    assert extraction.memory_sweep(now=now) == [conversation.pk]


# --- the sweep -----------------------------------------------------------------------------------


@pytest.fixture
def queued(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(tasks.memory_extract, "delay", lambda cid: calls.append(cid))
    return calls


def test_the_sweep_queues_idle_conversations_not_yet_mined_once(make_user, settings, queued):
    """Idle and unmined: queued, once (not again while the copy may still be in the broker,
    again after CHAT_MEMORY_REQUEUE_AFTER_S). Not idle yet, or mined through its last turn:
    not queued."""
    user = make_user("ada")
    idle, busy, mined = (services.conversation_create(owner=user) for _ in range(3))
    for conversation in (idle, busy, mined):
        seed(conversation, "I live in Lyon.")
    now = idle_after(idle, settings)
    Conversation.objects.filter(pk=busy.pk).update(last_turn_at=now - timedelta(seconds=5))
    mined.refresh_from_db()
    ExtractionMarker.objects.create(conversation_id=mined.pk, user=user, extracted_through=mined.last_turn_at)

    assert extraction.memory_sweep(now=now) == [idle.pk]
    assert queued == [str(idle.pk)]
    assert extraction.memory_sweep(now=now + timedelta(seconds=settings.CHAT_MEMORY_SWEEP_S)) == []
    settings.CHAT_MEMORY_REQUEUE_AFTER_S = 120
    assert extraction.memory_sweep(now=now + timedelta(seconds=121)) == [idle.pk]


def test_the_sweep_task_queues_through_the_broker_and_the_extraction_runs(
    talk, engine_double, in_process_endpoint, settings  # noqa: F811
):
    """Eager Celery (the test settings): the beat task's queued extraction runs and stores."""
    user, conversation = talk
    engine_double.scripts = [answer(CAT)]
    make_idle(conversation, settings)

    assert tasks.memory_sweep.run() == 1
    assert facts_of(user) == [CAT]
    assert tasks.memory_sweep.run() == 0
