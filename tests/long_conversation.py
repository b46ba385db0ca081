"""A long conversation in a few bulk inserts (issue 29, "Long conversations"): the seeder the
long-conversation tests and ``bench/browser_long.py`` open.

:func:`long_conversation_seed` writes real rows (conversations/models.py ``Conversation`` and
``Turn``) shaped as the product writes them (conversations/services.py): each user turn names
its ``parent`` (the user message before it on its branch), each answer its question
(``reply_to``), an edit is a sibling of the message it edits (same parent, ``replaces`` = it;
conversations/versions.py). 3,000 turns take one ``bulk_create`` of 1,000-row batches, about
a second, where 3,000 ``turn_append_*`` calls would take minutes.

The shape: a main branch of question/answer exchanges, and ``branches`` forks spread evenly
along it, each an edit of a main-branch question with its answer and one follow-up exchange
(4 turns). Every turn gets its own second of ``created_at`` inside a 10-second slot per main
exchange (question +0 s, answer +1 s, a fork's edit +2 s .. its follow-up's answer +5 s), so
children are always newer than their parents and the main branch, which holds the newest
turn, is the one a page shows when nothing was chosen (versions.Tree.path).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from conversations import services
from core import regions
from conversations.models import Conversation, Turn

TURNS_PER_BRANCH = 4  # the edit, its answer, a follow-up and its answer
BATCH = 1000

# Answers with the blocks the live renderer and decorate() handle: a paragraph, a list, and
# (every fifth answer) a code block, so a page of them costs the browser what real ones do.
_ANSWER = (
    "Answer {i}. Here is what I found about **topic {i}**: it depends on the context, "
    "but the short version is that you should start small and measure.\n\n"
    "- first, check the inputs\n- then, run it once\n- finally, compare the numbers\n"
)
_CODE = "\n```python\ndef step_{i}(items):\n    return [x * {i} for x in items]\n```\n"


def question_text(index: int) -> str:
    """The text of main-branch question ``index`` (0-based), so tests can find it on a page."""
    return f"Question {index}: how does step {index} work?"


def answer_text(index: int) -> str:
    """The Markdown of the answer to main-branch question ``index``."""
    text = _ANSWER.format(i=index)
    return text + _CODE.format(i=index) if index % 5 == 0 else text


@dataclass(frozen=True)
class Seeded:
    """What :func:`long_conversation_seed` wrote. ``questions``: the main branch's user turn
    ids, oldest first; ``forks``: main-branch index -> the id of the edit that forks there
    (its sibling); ``turns``: how many turns were written."""

    conversation: Conversation
    questions: list[UUID]
    forks: dict[int, UUID]
    turns: int


def _turn(conversation: Conversation, role: str, content: str, at, **fields) -> Turn:
    return Turn(
        turn_id=regions.new_turn_id(conversation.conversation_id),
        conversation_id=conversation.conversation_id,
        role=role,
        content=content,
        token_count=len(content.split()),
        created_at=at,
        **fields,
    )


def long_conversation_seed(*, owner, turns: int, branches: int = 0, title: str = "") -> Seeded:
    """Create a conversation of ``owner``'s with ``turns`` turns (rounded down to whole
    exchanges), ``branches`` of them forks (4 turns each, module docstring), ending now.

    ``turns`` counts every turn written, forks included: 3,000 turns with 20 branches is a main
    branch of (3000 - 80) / 2 = 1,460 exchanges. Raises ValueError when the forks leave fewer
    than 2 main exchanges. Assistant turns are ``complete`` with ``finish_reason`` "stop".
    """
    main = (turns - TURNS_PER_BRANCH * branches) // 2
    if main < 2:
        raise ValueError(f"{turns} turns cannot hold {branches} branches and 2 exchanges")
    # Forks at evenly spaced main-branch questions, never the first (its parent is none).
    fork_at = {1 + (k * (main - 1)) // branches for k in range(branches)} if branches else set()
    slot = timedelta(seconds=10)
    base = timezone.now() - slot * (main + 1)
    conversation = services.conversation_create(owner=owner, title=title or f"{turns} turns")
    rows: list[Turn] = []
    questions: list[UUID] = []
    forks: dict[int, UUID] = {}
    parent: UUID | None = None
    for i in range(main):
        at = base + slot * i
        question = _turn(conversation, Turn.Role.USER, question_text(i), at, parent_id=parent)
        rows.append(question)
        rows.append(
            _turn(
                conversation, Turn.Role.ASSISTANT, answer_text(i), at + timedelta(seconds=1),
                reply_to_id=question.turn_id, finish_reason="stop", prompt_tokens=0,
            )
        )  # fmt: skip
        if i in fork_at:
            edit = _turn(
                conversation, Turn.Role.USER, f"{question_text(i)} (edited)", at + timedelta(seconds=2),
                parent_id=parent, replaces_id=question.turn_id,
            )  # fmt: skip
            follow_up = _turn(
                conversation, Turn.Role.USER, f"A follow-up on the edit of question {i}",
                at + timedelta(seconds=4), parent_id=edit.turn_id,
            )  # fmt: skip
            rows += [
                edit,
                _turn(conversation, Turn.Role.ASSISTANT, f"The edited answer {i}.",
                      at + timedelta(seconds=3), reply_to_id=edit.turn_id, finish_reason="stop"),
                follow_up,
                _turn(conversation, Turn.Role.ASSISTANT, f"The follow-up answer {i}.",
                      at + timedelta(seconds=5), reply_to_id=follow_up.turn_id, finish_reason="stop"),
            ]  # fmt: skip
            forks[i] = edit.turn_id
        questions.append(question.turn_id)
        parent = question.turn_id
    db = regions.conversation_db(conversation)
    with transaction.atomic(using=db):
        Turn.objects.using(db).bulk_create(rows, batch_size=BATCH)
        Conversation.objects.using(db).filter(pk=conversation.pk).update(
            created_at=base - timedelta(seconds=1), last_turn_at=max(t.created_at for t in rows)
        )
    conversation.refresh_from_db(using=db)
    return Seeded(conversation=conversation, questions=questions, forks=forks, turns=len(rows))
