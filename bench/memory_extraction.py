"""The memory bench's extraction part (issue 28 part 4): labelled conversations
(bench/memory_sets/) through the real extraction path, scored.

:func:`score` is pure (stored facts per conversation -> precision, recall, ungrounded);
:func:`run_real` stores each conversation as a user's real turns in PostgreSQL, runs
``memory.extraction.conversation_memory_extract`` on it as the Celery task does, and reads the
stored facts back with their spans (bench/memory_bench.py prints it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta


@dataclass
class Score:
    """Counts over a set: ``stored`` facts, ``correct`` (matched an expected fact), ``expected``
    facts, ``found`` (expected facts matched), ``ungrounded`` (a stored fact whose span is not
    the text at its offsets of a user message of that conversation, or says more than it),
    ``none_sets`` / ``none_sets_storing`` (conversations that must yield nothing / did not),
    ``wrong``: (conversation id, fact) of each stored fact that matched nothing."""

    stored: int = 0
    correct: int = 0
    expected: int = 0
    found: int = 0
    ungrounded: int = 0
    none_sets: int = 0
    none_sets_storing: int = 0
    wrong: list = field(default_factory=list)
    missed: list = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.correct / self.stored if self.stored else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.expected if self.expected else 1.0


def score(conversations, stored_by_id) -> Score:
    """Score ``stored_by_id`` (conversation id -> [(fact text, grounded: bool)]) against the
    labelled ``conversations`` (bench/memory_sets/__init__.py's shape)."""
    result = Score()
    for conversation in conversations:
        expected = [list(map(str.lower, e)) for e in conversation["expect"]]
        facts = stored_by_id.get(conversation["id"], [])
        result.expected += len(expected)
        result.stored += len(facts)
        if not expected:
            result.none_sets += 1
            result.none_sets_storing += bool(facts)
        matched: set[int] = set()
        for text, is_grounded in facts:
            result.ungrounded += not is_grounded
            low = text.lower()
            hit = next((i for i, keys in enumerate(expected) if i not in matched and all(k in low for k in keys)), None)
            if hit is None:
                result.wrong.append((conversation["id"], text))
            else:
                matched.add(hit)
        result.correct += len(matched)
        result.found += len(matched)
        result.missed += [(conversation["id"], e) for i, e in enumerate(expected) if i not in matched]
    return result


def run_pure(conversations) -> dict:
    """The extractor alone (memory.statements), no database: conversation id -> facts."""
    from memory.statements import UserMessage, grounded, statements_extract  # noqa: PLC0415

    out = {}
    for conversation in conversations:
        messages = [UserMessage(turn_id=i, text=q) for i, (q, _a) in enumerate(conversation["turns"])]
        found = statements_extract(messages)
        out[conversation["id"]] = [
            (s.text, s.span == messages[s.turn_id].text[s.start : s.end] and grounded(s.text, s.span))
            for s in found
        ]
    return out


def run_real(conversations, *, user_factory) -> dict:
    """Each conversation stored as real turns of a fresh user (``user_factory(name)``), made
    idle, extracted by ``memory.extraction.conversation_memory_extract`` (each message's explicit
    requests applied when it is stored, as a sent message's are); returns conversation
    id -> [(fact text, grounded)] where grounded means: the fact's ``source_turn_id`` is a
    *user* turn of that conversation, ``span_text`` is that turn's text at
    ``span_start:span_end``, and the fact says nothing the span does not (memory.statements
    ``grounded``). Deletes the users it made (their facts go with them)."""
    from django.conf import settings  # noqa: PLC0415

    from conversations import services  # noqa: PLC0415
    from conversations.models import Turn  # noqa: PLC0415
    from memory import extraction  # noqa: PLC0415
    from memory.models import UserMemory  # noqa: PLC0415
    from memory.statements import grounded  # noqa: PLC0415
    from memory.updates import memory_commands_apply  # noqa: PLC0415

    out, users = {}, []
    try:
        for conversation in conversations:
            user = user_factory(f"mx-{conversation['id']}-{uuid.uuid4().hex[:6]}")
            users.append(user)
            chat = services.conversation_create(owner=user)
            for question, answer in conversation["turns"]:
                q = services.turn_append_user(conversation=chat, content=question)
                # As conversations/submit.py does when a message is sent: its explicit requests.
                memory_commands_apply(user=user, conversation_id=chat.pk, turn=q)
                services.turn_append_assistant(
                    conversation_id=chat.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
                    content=answer, status="complete", prompt_tokens=10, completion_tokens=10,
                )  # fmt: skip
            chat.refresh_from_db()
            now = chat.last_turn_at + timedelta(seconds=settings.CHAT_MEMORY_IDLE_S + 1)
            extraction.conversation_memory_extract(conversation_id=chat.pk, now=now)
            facts = []
            for fact in UserMemory.objects.filter(user=user):
                turn = Turn.objects.filter(pk=fact.source_turn_id, conversation_id=chat.pk).first()
                ok = (
                    turn is not None and turn.role == Turn.Role.USER and fact.span_end > fact.span_start
                    and turn.content[fact.span_start : fact.span_end] == fact.span_text
                    and grounded(fact.text, fact.span_text)
                )
                facts.append((fact.text, ok))
            out[conversation["id"]] = facts
    finally:
        from django.contrib.auth import get_user_model  # noqa: PLC0415

        get_user_model().objects.filter(pk__in=[u.pk for u in users]).delete()
    return out
