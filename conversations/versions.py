"""Versions and branches of turns in an append-only log: a conversation is a tree.

Nothing is ever updated (issue 4, "Append-only"). The user messages form a tree (issue 18,
part 5): each user turn names its ``parent``, the user message before it on its branch (None
for a first message). Sending a message adds a child to the last message of the branch the
page shows; editing a message adds a *sibling* (same parent, ``replaces`` = the edited turn),
which starts a new branch there: the later turns stay on the old one. Answers hang off their
question (``reply_to``); regenerating an answer adds another answer to the same question
(``replaces`` = the old answer), an alternative at that place, not a branch.

So the conversation the page shows is a **path** from a first message down to a last one:

- at each fork (a parent with several children) the path takes the child the user chose last
  (``Conversation.branch_choices``: parent turn id, or ``""`` for the first messages -> the
  child's id; stored server-side so a reload and another device show the same branch), else the
  child whose subtree holds the most recent message;
- a **position** of the path is one question with its siblings (the versions the page flips
  between, ``< 2/3 >``, oldest first) and its answers (oldest first): the one the user chose
  last is shown (``Conversation.answer_choices``: question id -> answer id; Regenerate and
  Continue clear it), else the newest.

Turns written before the tree existed have no stored parent. Their parent is derived here, in
the order they were written: an edit's parent is the edited turn's; any other message's is the
then-current version of the then-last position (the old linear reading), the first message has
none. New turns always store their parent, so the derivation only concerns old rows.

Continue (issue 18) appends an assistant turn with ``continues`` = a cut-off answer and the same
``reply_to``; its content is the whole answer (the continued text, then the new). A continued
answer is no version of its own: the continuation stands in for it, on the page (one answer,
not ``< 1/2 >``) and in prompts.

The prompt for a question uses the positions of the path down to its parent, each with its
question and newest usable answer (not failed, not empty); a position without one is left out.

Pure functions over turns already loaded (no queries here): :func:`tree_build` and
:func:`positions_build` are used by the selectors for the page, prompts, shares and exports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from conversations import toolrounds
from conversations.models import Turn

# The key of the first messages' fork in Conversation.branch_choices (they have no parent).
ROOT = ""


def choice_key(parent_id: UUID | None) -> str:
    """The key of the fork below ``parent_id`` (None: the first messages) in branch_choices."""
    return ROOT if parent_id is None else str(parent_id)


@dataclass
class Position:
    """One place on the path: a question, its siblings and the answers to each of them.

    ``questions``: the question's versions, i.e. the user turns with its parent, oldest first
    (the ``< i/n >`` the page shows). ``current``: the one on the path. ``answers_by_question``:
    question turn id -> its answers, oldest first. ``answer_choices``: question id -> the id of
    the answer version chosen (Conversation.answer_choices, ids as strings).
    """

    questions: list[Turn]
    answers_by_question: dict[UUID, list[Turn]] = field(default_factory=dict)
    current: Turn | None = None
    answer_choices: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[datetime, str]:
        """Where the position sits: (created_at, turn_id) of its question."""
        return (self.question.created_at, str(self.question.turn_id))

    @property
    def question(self) -> Turn:
        """The question on the path (default: the newest version)."""
        return self.current if self.current is not None else self.questions[-1]

    @property
    def index(self) -> int:
        """0-based index of :attr:`question` among :attr:`questions`."""
        return next(i for i, q in enumerate(self.questions) if q.turn_id == self.question.turn_id)

    @property
    def answers(self) -> list[Turn]:
        """The answers to the current question, oldest first (the versions shown ``i/n``)."""
        return self.answers_by_question.get(self.question.turn_id, [])

    @property
    def answer(self) -> Turn | None:
        """The answer the page shows for the current question: the version chosen last if it is
        among its answers, else the newest; None if it has none."""
        answers = self.answers
        chosen = self.answer_choices.get(str(self.question.turn_id))
        return next((a for a in answers if str(a.turn_id) == chosen), answers[-1] if answers else None)

    def usable_answer(self) -> Turn | None:
        """The answer to the current question that goes into a prompt: the version the page
        shows (:attr:`answer`: the one chosen with `<`/`>`, else the newest) when it can (not
        failed and with text; a cancelled answer keeps its partial text), else the newest that
        can. None if there is none. (The model is asked to follow on from what the user reads.)"""
        shown = self.answer
        if shown is not None and _usable(shown):
            return shown
        return next((a for a in reversed(self.answers) if _usable(a)), None)


def _usable(answer: Turn) -> bool:
    return answer.status != Turn.Status.FAILED and bool(answer.content)


def _sort_key(turn: Turn) -> tuple[datetime, str]:
    return (turn.created_at, str(turn.turn_id))


def _continued(turns: Iterable[Turn]) -> set[UUID]:
    """Ids of the answers some turn among ``turns`` continues (module docstring)."""
    return {t.continues_id for t in turns if getattr(t, "continues_id", None) is not None}


# A parent outside the turns given (a suffix of the log): the question hangs below nothing known.
OUTSIDE = object()


@dataclass
class Tree:
    """The user messages of a conversation as a tree (module docstring), from turns loaded.

    ``questions``: user turn id -> turn. ``parent``: user turn id -> its parent's id (None: a
    first message; :data:`OUTSIDE` when the parent is not among the turns given).
    ``children``: parent id (None: the first messages) -> its children, oldest first.
    ``answers``: question id -> its answers, oldest first (those a continuation stands in for
    left out). ``latest``: user turn id -> (created_at, id) of the newest turn in its subtree.
    """

    questions: dict[UUID, Turn]
    parent: dict[UUID, object]
    children: dict[UUID | None, list[Turn]]
    answers: dict[UUID, list[Turn]]
    latest: dict[UUID, tuple[datetime, str]]

    def parent_of(self, turn: Turn) -> UUID | None:
        """The (stored or derived) parent id of ``turn``: a user turn's parent message, an
        assistant turn's question; None for a first message or a turn not in the tree."""
        if turn.role == Turn.Role.ASSISTANT:
            return turn.reply_to_id
        parent = self.parent.get(turn.turn_id)
        return parent if isinstance(parent, UUID) else None

    def siblings(self, question: Turn) -> list[Turn]:
        """The versions of ``question``: the user turns with its parent, oldest first."""
        parent = self.parent.get(question.turn_id)
        if parent is OUTSIDE or question.turn_id not in self.questions:
            return [question]
        return self.children.get(parent, [question])

    def ancestors(self, question_id: UUID) -> list[Turn]:
        """The questions above ``question_id`` among the turns given, first message (or the
        oldest one given) first, the question itself left out."""
        chain: list[Turn] = []
        parent = self.parent.get(question_id)
        while isinstance(parent, UUID) and parent in self.questions:
            chain.append(self.questions[parent])
            parent = self.parent.get(parent)
        chain.reverse()
        return chain

    def position(self, question: Turn, answer_choices: Mapping[str, str] | None = None) -> Position:
        """The position ``question`` is the current question of. ``answer_choices``:
        Conversation.answer_choices (None: each question shows its newest answer)."""
        siblings = self.siblings(question)
        return Position(
            questions=list(siblings),
            answers_by_question={q.turn_id: self.answers.get(q.turn_id, []) for q in siblings},
            current=question,
            answer_choices=answer_choices or {},
        )

    def path(self, choices: Mapping[str, str] | None = None, *, below: Turn | None = None) -> list[Turn]:
        """The questions of the selected path, first message first (module docstring).
        ``below``: start under this question (its own place is not included) instead of at the
        first messages. ``choices``: Conversation.branch_choices (ids as strings)."""
        choices = choices or {}
        path: list[Turn] = []
        parent = below.turn_id if below is not None else None
        while True:
            kids = self.children.get(parent)
            if not kids:
                return path
            chosen = choices.get(choice_key(parent))
            pick = next((k for k in kids if str(k.turn_id) == chosen), None)
            if pick is None:
                pick = max(kids, key=lambda k: self.latest[k.turn_id])
            path.append(pick)
            parent = pick.turn_id

    def leaf(self, choices: Mapping[str, str] | None = None) -> Turn | None:
        """The last question of the selected path (a new message's parent), or None."""
        path = self.path(choices)
        return path[-1] if path else None


def tree_build(turns: Iterable[Turn]) -> Tree:
    """The tree of ``turns`` (any order; a conversation's log or a suffix of it). Turns of
    other roles than user and assistant are ignored, and so are answers a continuation stands
    in for and answers to questions not given. An old turn's parent is derived (module
    docstring); a question whose parent is not given hangs below :data:`OUTSIDE`."""
    turns = list(turns)
    continued = _continued(turns)
    ordered = sorted((t for t in turns if t.turn_id not in continued), key=_sort_key)
    questions: dict[UUID, Turn] = {}
    parent: dict[UUID, object] = {}
    # The old linear reading, for turns without a stored parent: each original message's
    # newest version, and the newest original.
    newest_version: dict[UUID, UUID] = {}
    original_of: dict[UUID, UUID] = {}
    last_original: UUID | None = None
    seen_first = False
    for turn in ordered:
        if turn.role != Turn.Role.USER:
            continue
        questions[turn.turn_id] = turn
        stored = getattr(turn, "parent_id", None)
        if stored is not None:
            parent[turn.turn_id] = stored if stored in questions else OUTSIDE
        elif turn.replaces_id is not None:
            parent[turn.turn_id] = parent.get(turn.replaces_id, OUTSIDE)
        elif not seen_first:
            parent[turn.turn_id] = None
        else:  # written before the tree: after the then-last position's current version
            parent[turn.turn_id] = newest_version.get(last_original) if last_original else None
        if parent[turn.turn_id] is OUTSIDE:
            continue  # below a turn not given: no part of the linear reading either
        seen_first = True
        original = original_of.get(turn.replaces_id) if turn.replaces_id else turn.turn_id
        if original is None:
            continue
        original_of[turn.turn_id] = original
        newest_version[original] = turn.turn_id
        if original == turn.turn_id:
            last_original = turn.turn_id
    children: dict[UUID | None, list[Turn]] = {}
    for turn_id, turn in questions.items():  # oldest first (insertion order)
        if parent[turn_id] is not OUTSIDE:
            children.setdefault(parent[turn_id], []).append(turn)
    answers: dict[UUID, list[Turn]] = {}
    for turn in ordered:
        if turn.role == Turn.Role.ASSISTANT and turn.reply_to_id in questions:
            answers.setdefault(turn.reply_to_id, []).append(turn)
    latest: dict[UUID, tuple[datetime, str]] = {}
    for turn_id in reversed(list(questions)):  # children are newer than their parent
        own = max([_sort_key(questions[turn_id])] + [_sort_key(a) for a in answers.get(turn_id, [])])
        below = [latest[k.turn_id] for k in children.get(turn_id, [])]
        latest[turn_id] = max([own, *below])
    return Tree(questions=questions, parent=parent, children=children, answers=answers, latest=latest)


def positions_build(
    turns: Iterable[Turn],
    choices: Mapping[str, str] | None = None,
    answer_choices: Mapping[str, str] | None = None,
) -> list[Position]:
    """The positions of the selected path (module docstring) of a conversation's ``turns``
    (all of them, any order), first message first. ``choices``: Conversation.branch_choices;
    None or {}: at each fork the branch with the most recent message. ``answer_choices``:
    Conversation.answer_choices; None or {}: each position shows its newest answer."""
    tree = tree_build(turns)
    return [tree.position(q, answer_choices) for q in tree.path(choices)]


def prompt_exchanges(positions: Iterable[Position], turns: Iterable[Turn] = ()) -> list[tuple[str, str | list[dict]]]:
    """(question, answer) for a prompt: each position's current question with its usable
    answer (:meth:`Position.usable_answer`: the version shown), oldest first; positions without
    one are left out. An answer written after tool calls (conversations/toolrounds.py) is the
    list of messages of its rounds then its text, when ``turns`` (the turns the positions were
    built from) hold them; else its text."""
    turns = list(turns)
    by_id = {t.turn_id: t for t in turns}
    results = toolrounds.results_by_call_turn(turns)
    exchanges = []
    for position in positions:
        answer = position.usable_answer()
        if answer is not None:
            exchanges.append((position.question.content, toolrounds.answer_messages(answer, by_id, results)))
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
