"""A conversation as a Markdown file, for data exports (privacy/export.py).

It reads like the chat page: the branch the page shows (conversations/versions.py: the selected
path of the turn tree), each message in the version on that branch with the answer the page
shows (the newest version), oldest first. The file says so, and how many other branches there
are; every branch and version, and everything else about each turn, is in the JSON export.
An answer written after tool calls (conversations/toolrounds.py) lists them first under "Used N
tools": each call (function and arguments) and its result, whole, in code blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from uuid import UUID

import re

from conversations.models import Conversation, Turn
from conversations.selectors import (
    ToolUse,
    calls_uses,
    made_calls,
    results_by_call_turn,
    tool_uses,
    tree_build,
)

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


def _code_span(text: str) -> str:
    """``text`` as inline code, with more backticks around it than any run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _code_block(text: str, indent: str = "") -> list[str]:
    """``text`` as a fenced code block (a fence longer than any backtick run inside it)."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [indent + line for line in (fence, *text.splitlines(), fence)]


def _tool_lines(uses: list[ToolUse]) -> list[str]:
    """"Used N tools" and each call with its result, as Markdown lines (module docstring)."""
    lines = [f"**Used {len(uses)} tool{'s' if len(uses) != 1 else ''}:**", ""]
    for number, use in enumerate(uses, 1):
        lines.append(f"{number}. {_code_span(f'{use.name}({use.arguments})')}")
        lines.append("")
        if use.result is None:
            lines += ["   _(no result)_", ""]
        else:
            lines += ["   Result:", "", *_code_block(use.result, "   "), ""]
    return lines


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
    turns = list(turns)
    by_id = {t.turn_id: t for t in turns}
    results = results_by_call_turn(turns)
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
        uses = tool_uses(answer, by_id, results)
        if uses:
            lines += _tool_lines(uses)
        elif made_calls(answer):  # still waiting for its results
            lines += _tool_lines(calls_uses([answer], results))
        if answer.content or answer.status != Turn.Status.BLOCKED:
            lines.append(_body(answer.content))
    return "\n".join(lines).rstrip("\n") + "\n"
