"""Versions of turns in an append-only log: edited messages and regenerated answers.

Nothing is ever updated (issue 4, "Append-only"). Editing a user message appends a new user turn
with ``replaces`` = the turn it edits; regenerating an answer appends a new assistant turn with
``replaces`` = the old answer and the same ``reply_to``. So a conversation is a sequence of
*positions*: one per original user message (its first version), in the order those were
written. At each position:

- the **current question** is the newest version of the user message (the newest turn of its
  ``replaces`` chain), wherever in time it was written;
- its **answers** are the assistant turns whose ``reply_to`` is that question, oldest first:
  these are the versions the page flips between (``< 2/3 >``); the newest is shown first.

Continue (issue 18) appends an assistant turn with ``continues`` = a cut-off answer and the same
``reply_to``; its content is the whole answer (the continued text, then the new). A continued
answer is no version of its own: the continuation stands in for it, on the page (one answer,
not ``< 1/2 >``) and in prompts.

The prompt for a position uses the positions before it, each with its current question and
newest usable answer (not failed, not empty); a position without one is left out.

Pure functions over turns already loaded (no queries here): :func:`positions_build` is used by
the selectors for the page and for prompts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from conversations.models import Turn


@dataclass
class Position:
    """One place in the conversation: the versions of a user message and the answers to them.

    ``questions``: the user message's versions, oldest first (``questions[0]`` is the original,
    whose ``(created_at, turn_id)`` orders positions). ``answers_by_question``: question turn id
    -> its answers, oldest first.
    """

    questions: list[Turn]
    answers_by_question: dict[UUID, list[Turn]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[datetime, str]:
        """Where the position sits: (created_at, turn_id) of the original message."""
        first = self.questions[0]
        return (first.created_at, str(first.turn_id))

    @property
    def question(self) -> Turn:
        """The current (newest) version of the user message."""
        return self.questions[-1]

    @property
    def answers(self) -> list[Turn]:
        """The answers to the current question, oldest first (the versions shown ``i/n``)."""
        return self.answers_by_question.get(self.question.turn_id, [])

    @property
    def answer(self) -> Turn | None:
        """The newest answer to the current question (what the page shows), or None."""
        answers = self.answers
        return answers[-1] if answers else None

    def usable_answer(self) -> Turn | None:
        """The newest answer to the current question that can go into a prompt: not failed and
        with text (a cancelled answer keeps its partial text). None if there is none."""
        for answer in reversed(self.answers):
            if answer.status != Turn.Status.FAILED and answer.content:
                return answer
        return None


def _sort_key(turn: Turn) -> tuple[datetime, str]:
    return (turn.created_at, str(turn.turn_id))


def _continued(turns: Iterable[Turn]) -> set[UUID]:
    """Ids of the answers some turn among ``turns`` continues (module docstring)."""
    return {t.continues_id for t in turns if getattr(t, "continues_id", None) is not None}


def positions_build(turns: Iterable[Turn]) -> list[Position]:
    """Group a conversation's turns into positions, ordered by their original message.

    ``turns`` may be a suffix of the log (e.g. the turns after the running summary): a user
    turn that replaces one not given, and an answer to a question not given, belong to a
    position outside the suffix and are left out. Turns of other roles are ignored, and so are
    answers a continuation stands in for.
    """
    turns = list(turns)
    continued = _continued(turns)
    ordered = sorted((t for t in turns if t.turn_id not in continued), key=_sort_key)
    users = {t.turn_id: t for t in ordered if t.role == Turn.Role.USER}
    positions: dict[UUID, Position] = {}  # root user turn id -> position
    root_of: dict[UUID, UUID] = {}
    for turn in ordered:
        if turn.role != Turn.Role.USER:
            continue
        if turn.replaces_id is None:
            root = turn.turn_id
        elif turn.replaces_id in root_of:
            root = root_of[turn.replaces_id]
        else:
            continue  # edits a message outside the turns given
        root_of[turn.turn_id] = root
        if root == turn.turn_id:
            positions[root] = Position(questions=[turn])
        else:
            positions[root].questions.append(turn)
    for turn in ordered:
        if turn.role != Turn.Role.ASSISTANT or turn.reply_to_id not in users:
            continue
        root = root_of.get(turn.reply_to_id)
        if root is None:
            continue
        positions[root].answers_by_question.setdefault(turn.reply_to_id, []).append(turn)
    return sorted(positions.values(), key=lambda p: p.key)


def position_of(positions: list[Position], question_id: UUID) -> int | None:
    """Index of the position one of whose versions is ``question_id``, or None."""
    for index, position in enumerate(positions):
        if any(q.turn_id == question_id for q in position.questions):
            return index
    return None


def prompt_exchanges(positions: Iterable[Position]) -> list[tuple[str, str]]:
    """(question, answer) texts for a prompt: each position's current question with its newest
    usable answer, oldest first; positions without one are left out."""
    exchanges = []
    for position in positions:
        answer = position.usable_answer()
        if answer is not None:
            exchanges.append((position.question.content, answer.content))
    return exchanges


def answer_versions(turns: Iterable[Turn], answer: Turn) -> list[Turn]:
    """The versions of ``answer``: every assistant turn replying to the same question, oldest
    first (``answer`` among them), but those a continuation stands in for."""
    turns = list(turns)
    continued = _continued(turns) - {answer.turn_id}
    return sorted(
        (
            t for t in turns
            if t.role == Turn.Role.ASSISTANT and t.reply_to_id == answer.reply_to_id
            and t.turn_id not in continued
        ),
        key=_sort_key,
    )  # fmt: skip
