"""A conversation as a Markdown file, for data exports (privacy/export.py).

It reads like the chat page: the branch the page shows (conversations/versions.py: the selected
path of the turn tree), each message in the version on that branch with the answer the page
shows (the newest version), oldest first. The file says so, and how many other branches there
are; every branch and version, and everything else about each turn, is in the JSON export.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from uuid import UUID

from conversations.models import Conversation, Turn
from conversations.versions import tree_build

STATUS_NOTES = {
    Turn.Status.CANCELLED: "stopped before it finished",
    Turn.Status.FAILED: "failed",
    Turn.Status.BLOCKED: "withheld by moderation",
}


def _when(turn: Turn) -> str:
    return turn.created_at.strftime("%Y-%m-%d %H:%M UTC")


def _body(text: str) -> str:
    """A message as written (messages are Markdown already); a blank one gets a placeholder."""
    return text if text.strip() else "_(empty)_"


def conversation_markdown(
    conversation: Conversation,
    turns: Iterable[Turn],
    *,
    attachment_names: Mapping[UUID, list[str]] | None = None,
    owner_label: str = "",
    org_label: str = "",
    json_name: str = "data.json",
) -> str:
    """The Markdown text of ``conversation`` from its ``turns`` (all of them, any order).

    ``attachment_names``: user turn id -> names of the files sent with it (listed under the
    message). ``owner_label`` / ``org_label``: shown in the header when given (organisation
    exports name each conversation's owner). ``json_name``: the file that holds every version
    (the account archive's ``data.json``, or the conversation's own JSON download, whose name
    privacy/conversation_export.py ``export_filename`` gives). Returns text ending in a newline.
    """
    attachment_names = attachment_names or {}
    tree = tree_build(turns)
    positions = [tree.position(q, conversation.answer_choices) for q in tree.path(conversation.branch_choices)]
    leaves = sum(1 for q in tree.questions if not tree.children.get(q))
    lines = [f"# {conversation.title or 'Untitled conversation'}", ""]
    facts = [
        ("Conversation", str(conversation.conversation_id)),
        ("Owner", owner_label),
        ("Organisation", org_label),
        ("Started", conversation.created_at.strftime("%Y-%m-%d %H:%M UTC")),
        ("Last message", conversation.last_turn_at.strftime("%Y-%m-%d %H:%M UTC")),
        ("Model", conversation.model),
        ("Region", conversation.region),
    ]
    lines += [f"- {name}: {value}" for name, value in facts if value]
    others = max(0, leaves - 1)
    lines.append(
        "- Shows: the branch selected on the chat page"
        + (f" ({others} other branch(es) are in the JSON export)" if others else " (the only one)")
    )
    if conversation.system_prompt:
        lines += ["", "**Instructions to the model:**", "", _body(conversation.system_prompt)]
    versions = sum(len(p.questions) - 1 + max(0, len(p.answers) - 1) for p in positions)
    if versions:
        lines += ["", f"_{versions} earlier version(s) of messages or answers are in {json_name}._"]
    for position in positions:
        question = position.question
        edited = (
            f" (version {position.index + 1} of {len(position.questions)})"
            if len(position.questions) > 1 else ""
        )  # fmt: skip
        lines += ["", f"## You, {_when(question)}{edited}", ""]
        note = STATUS_NOTES.get(question.status)
        if note:
            lines += [f"_Not sent: {note}._", ""]
        lines.append(_body(question.content))
        names = attachment_names.get(question.turn_id)
        if names:
            lines += ["", "Attached: " + ", ".join(f"`{n}`" for n in names)]
        answer = position.answer
        if answer is None:
            continue
        by = f" ({answer.pool}@{answer.model_version})" if answer.pool else ""
        lines += ["", f"## Assistant{by}, {_when(answer)}", ""]
        note = STATUS_NOTES.get(answer.status)
        if note:
            lines += [f"_The answer was {note}._", ""]
        if answer.content or answer.status != Turn.Status.BLOCKED:
            lines.append(_body(answer.content))
    return "\n".join(lines).rstrip("\n") + "\n"
