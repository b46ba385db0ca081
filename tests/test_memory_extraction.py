"""Memory extraction (issues 7 and 28; memory/extraction.py): the idle sweep, the exactly-once
marker, and the deterministic extractor over the user's own messages (memory/statements.py;
tests/test_memory_grounded.py tests what it accepts). No model is asked."""

from __future__ import annotations

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

pytestmark = pytest.mark.django_db(transaction=True)

LYON = "The user lives in Lyon."
CAT = "The user has a grey cat called Pixel."
# The assistant speaks in the first person too: none of it may become a fact about the user.
REPLY = "Noted. I live in Paris and I have a dog called Rex."


def seed(conversation: Conversation, *questions: str) -> None:
    for content in questions:
        q = services.turn_append_user(conversation=conversation, content=content)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=REPLY, status="complete", prompt_tokens=10, completion_tokens=2,
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
    seed(conversation, "I live in Lyon.", "I have a grey cat called Pixel.")
    return user, conversation


@pytest.fixture
def held_reading(monkeypatch):
    """The first run's reading of the messages waits until the test sets the returned event (a
    slow run); later runs go straight through. ``entered`` is set once the first is waiting."""
    entered, release = threading.Event(), threading.Event()
    original = extraction.statements_extract
    calls = []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            assert release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(extraction, "statements_extract", call)
    return entered, release, calls


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


def test_an_idle_conversation_yields_the_users_facts_grounded_in_their_turns(talk, settings):
    """Given a conversation idle for CHAT_MEMORY_IDLE_S, when the extraction runs, then the
    facts the user stated are stored as extracted from it, each with the user turn and the span
    it came from; the assistant's first-person answers ("I live in Paris") store nothing."""
    user, conversation = talk

    result = extract(conversation, idle_after(conversation, settings))

    assert result == extraction.Extraction("stored", 2)
    assert facts_of(user) == sorted([LYON, CAT])
    rows = UserMemory.objects.filter(user=user)
    assert {(m.source, m.source_conversation_id) for m in rows} == {("extracted", conversation.pk)}
    for fact in rows:
        turn = Turn.objects.get(pk=fact.source_turn_id)
        assert turn.role == Turn.Role.USER
        assert turn.content[fact.span_start : fact.span_end] == fact.span_text != ""
    assert {m.slot for m in rows} == {"home", ""}
    marker = ExtractionMarker.objects.get(pk=conversation.pk)
    conversation.refresh_from_db()
    assert marker.extracted_through == conversation.last_turn_at and marker.claimed_until is None


def test_a_later_period_reads_only_the_messages_written_since(talk, settings, monkeypatch):
    """A later idle period extracts facts only from the messages written after the previous one
    (the earlier ones are passed for the role-play state, marked not new)."""
    user, conversation = talk
    seen = []
    original = extraction.statements_extract
    monkeypatch.setattr(extraction, "statements_extract", lambda messages, **kw: seen.append(messages) or original(messages, **kw))
    assert extract(conversation, idle_after(conversation, settings)).status == "stored"
    seed(conversation, "I row on Sundays.", "I play the cello.")

    later = extract(conversation, idle_after(conversation, settings))

    assert later == extraction.Extraction("stored", 1)
    assert [m.new for m in seen[1]] == [False, False, True, True]
    assert facts_of(user) == sorted([LYON, CAT, "The user plays the cello."])


def test_a_conversation_not_idle_yet_is_left_for_later(talk, settings):
    user, conversation = talk
    almost = idle_after(conversation, settings, extra_s=-2)

    assert extract(conversation, almost).status == "not_idle"
    assert facts_of(user) == []
    assert extract(conversation, almost + timedelta(seconds=3)).status == "stored"


async def test_a_turn_never_queues_or_waits_for_an_extraction(make_user, engine_double, monkeypatch):
    """The turn path does not touch memory extraction: the sweep finds idle conversations."""
    from tests.chat_support import signed_in
    from tests.versions_support import answered

    queued = []
    monkeypatch.setattr(tasks.memory_extract, "delay", lambda *a, **k: queued.append(a))
    monkeypatch.setattr(tasks.memory_extract, "apply_async", lambda *a, **k: queued.append(a))
    client, user = await signed_in(make_user)
    conversation = await Conversation.objects.acreate(owner=user, model="m", region="eu-west")

    await answered(client, "I live in Lyon.", conversation.pk)

    assert queued == []
    assert not await ExtractionMarker.objects.filter(pk=conversation.pk).aexists()


# --- exactly once ------------------------------------------------------------------------------


def test_a_second_delivery_after_the_first_stores_nothing(talk, settings, monkeypatch):
    """The same task delivered twice, one after the other (a redelivery after the first was
    done): read once, one set of facts."""
    user, conversation = talk
    make_idle(conversation, settings)
    reads = []
    original = extraction.statements_extract
    monkeypatch.setattr(extraction, "statements_extract", lambda m, **kw: reads.append(1) or original(m, **kw))

    first = tasks.memory_extract.run(str(conversation.pk))
    second = tasks.memory_extract.run(str(conversation.pk))

    assert first == {"status": "stored", "stored": 2}
    assert second == {"status": "done", "stored": 0}
    assert len(reads) == 1 and facts_of(user) == sorted([LYON, CAT])


def test_two_deliveries_at_once_read_once_and_store_once(talk, settings, held_reading):
    """Two copies at the same time: the one that holds the lease runs; the other ends at once."""
    user, conversation = talk
    entered, release, calls = held_reading
    now = idle_after(conversation, settings)
    thread, box = run_in_thread(lambda: extract(conversation, now))
    assert entered.wait(30)

    second = extract(conversation, now + timedelta(seconds=1))
    release.set()
    thread.join(30)

    assert second.status == "claimed"
    assert box == {"result": extraction.Extraction("stored", 2)}
    assert len(calls) == 1 and facts_of(user) == sorted([LYON, CAT])


def test_a_copy_redelivered_after_the_visibility_timeout_stores_once(talk, settings, held_reading):
    """The first run is so slow that its lease runs out (as when the broker redelivers a task
    still running after its visibility timeout): the copy stores; the first run's store then
    matches no marker and stores nothing. One set of facts."""
    user, conversation = talk
    entered, release, calls = held_reading
    now = idle_after(conversation, settings)
    thread, box = run_in_thread(lambda: extract(conversation, now))
    assert entered.wait(30)

    redelivered = extract(conversation, now + timedelta(seconds=extraction.extract_lease_s() + 1))
    release.set()
    thread.join(30)

    assert redelivered == extraction.Extraction("stored", 2)
    assert box == {"result": extraction.Extraction("lost")}
    assert len(calls) == 2 and facts_of(user) == sorted([LYON, CAT])


def test_two_deliveries_racing_to_store_store_once(talk, settings, monkeypatch):
    """Both copies read the messages (the lease ran out in between) and reach the store at the
    same moment: the marker's compare-and-set lets exactly one store."""
    user, conversation = talk
    barrier = threading.Barrier(2, timeout=30)
    original = extraction.statements_extract

    def read(messages, **kw):
        found = original(messages, **kw)
        barrier.wait()  # both runs have their facts before either stores
        return found

    monkeypatch.setattr(extraction, "statements_extract", read)
    now = idle_after(conversation, settings)
    settings.CHAT_MEMORY_EXTRACT_LEASE_S = 0  # no lease: both copies run
    runs = [run_in_thread(lambda: extract(conversation, now)) for _ in range(2)]
    for thread, _ in runs:
        thread.join(30)

    results = sorted(box["result"].status for _, box in runs)
    assert results == ["lost", "stored"]
    assert facts_of(user) == sorted([LYON, CAT])


def test_a_run_killed_before_its_commit_leaves_the_period_to_a_redelivered_copy(talk, settings, monkeypatch):
    """A failure inside the store's transaction (a worker killed there) stores nothing and moves
    no marker; the copy the broker redelivers after its visibility timeout does the work."""
    import memory.services

    user, conversation = talk
    now = idle_after(conversation, settings)
    real_store = memory.services.memory_facts_store

    def killed(**kwargs):
        real_store(**kwargs)
        raise SystemExit("worker killed")

    monkeypatch.setattr(memory.services, "memory_facts_store", killed)
    with pytest.raises(SystemExit):
        extract(conversation, now)
    marker = ExtractionMarker.objects.get(pk=conversation.pk)
    assert facts_of(user) == [] and marker.extracted_through is None and marker.claimed_until is None
    monkeypatch.setattr(memory.services, "memory_facts_store", real_store)

    redelivered = extract(conversation, now + timedelta(seconds=settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]))

    assert redelivered == extraction.Extraction("stored", 2) and facts_of(user) == sorted([LYON, CAT])


# --- who is never mined --------------------------------------------------------------------------


def test_an_owner_with_memory_off_is_never_mined(talk, settings):
    user, conversation = talk
    user.memory_enabled = False
    user.save(update_fields=["memory_enabled"])

    assert extract(conversation, idle_after(conversation, settings)).status == "disabled"
    assert facts_of(user) == []
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=idle_after(conversation, settings)) == []


def test_memory_off_for_the_deployment_mines_nothing(talk, settings):
    user, conversation = talk
    settings.CHAT_MEMORY_ENABLED = False

    assert extract(conversation, idle_after(conversation, settings)).status == "disabled"
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=idle_after(conversation, settings)) == []
    assert facts_of(user) == []


def test_zero_retention_conversations_are_never_mined(talk, settings):
    """Nothing of a zero-retention conversation may be kept: no facts, not queued."""
    user, conversation = talk
    org = Organisation.objects.create(name="ZDR", slug="zdr", zero_retention=True)
    Conversation.objects.filter(pk=conversation.pk).update(org=org)

    assert extract(conversation, idle_after(conversation, settings)).status == "zero_retention"
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=idle_after(conversation, settings)) == []
    assert facts_of(user) == []


# --- what is stored ------------------------------------------------------------------------------


def test_facts_are_capped_in_number_per_run(make_user, settings):
    settings.CHAT_MEMORY_EXTRACT_MAX_FACTS = 2
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    seed(conversation, "I live in Lyon. I play the cello. I speak Portuguese.")

    assert extract(conversation, idle_after(conversation, settings)) == extraction.Extraction("stored", 2)
    assert facts_of(user) == sorted([LYON, "The user plays the cello."])


def test_a_conversation_stating_nothing_closes_the_period_with_no_facts(make_user, settings):
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    seed(conversation, "What is the tallest mountain in Africa?")
    now = idle_after(conversation, settings)

    assert extract(conversation, now) == extraction.Extraction("stored", 0)
    assert facts_of(user) == [] and extraction.memory_sweep(queue=tasks.memory_extract.delay, now=now) == []


def test_facts_already_known_are_not_stored_twice(talk, settings):
    from memory.services import memory_add

    user, conversation = talk
    memory_add(user=user, texts=[CAT])

    assert extract(conversation, idle_after(conversation, settings)) == extraction.Extraction("stored", 1)
    assert facts_of(user) == sorted([LYON, CAT])


def test_a_failing_store_frees_the_conversation_for_the_next_sweep(talk, settings, monkeypatch):
    import memory.services
    from django.db import DatabaseError

    user, conversation = talk
    make_idle(conversation, settings)
    now = idle_after(conversation, settings)

    def broken(**kwargs):
        raise DatabaseError("the region database went away")

    monkeypatch.setattr(memory.services, "memory_facts_store", broken)
    with pytest.raises(DatabaseError):
        extraction.conversation_memory_extract(conversation_id=conversation.pk)

    marker = ExtractionMarker.objects.get(pk=conversation.pk)
    assert marker.extracted_through is None and marker.claimed_until is None
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=now) == [conversation.pk]


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

    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=now) == [idle.pk]
    assert queued == [str(idle.pk)]
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=now + timedelta(seconds=settings.CHAT_MEMORY_SWEEP_S)) == []
    settings.CHAT_MEMORY_REQUEUE_AFTER_S = 120
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=now + timedelta(seconds=121)) == [idle.pk]


def test_the_sweep_task_queues_through_the_broker_and_the_extraction_runs(talk, settings):
    """Eager Celery (the test settings): the beat task's queued extraction runs and stores."""
    user, conversation = talk
    make_idle(conversation, settings)

    assert tasks.memory_sweep.run() == 1
    assert facts_of(user) == sorted([LYON, CAT])
    assert tasks.memory_sweep.run() == 0
