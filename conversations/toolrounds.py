"""Tool rounds of a conversation's answers (issue 30): how an answer that calls functions, the
client's results and the answer after them sit in the append-only turn log, and how they read
back as chat messages.

**In the log.** An answer that calls functions is an assistant turn with ``tool_calls`` (OpenAI's
items: id, function name, arguments as a JSON text), ``finish_reason`` ``tool_calls`` and its
text, if any, as content (usually empty). Each result is a ``tool`` turn: ``tool_call_id`` names
the call, ``reply_to`` the assistant turn that made it. Once every call has a result, the next
answer is written as an assistant turn with ``continues`` = the calling answer and the same
``reply_to`` (the question): it stands in for the calling answer on the page and among the
answer's versions, as a Continue does (conversations/versions.py), but its content is only its
own text. A chain (calls, results, calls again, results, text) is a chain of such turns. An
answer after tool calls that was cut off and continued (Continue) adds a link whose target made
no calls: the continuation follows the same rounds (:func:`calls_before` passes over the cut-off
answer, whose text starts the continuation's).

**As messages.** :func:`answer_messages` gives, for the answer shown, the calling answers it
follows and their results as OpenAI-shaped messages (assistant with ``tool_calls``, ``tool``
with ``tool_call_id``), then its own text; inference/tool_format.py ``hermes_messages``
renders them for the prompt, the same way ``/v1/chat/completions`` does.

**On the page.** :func:`tool_uses` gives the same rounds as :class:`ToolUse` rows (a call and
its result) for the "Used N tools" block above an answer written after them
(templates/chat/_tool_uses.html), and for the Markdown export.

Pure functions over turns already loaded; no queries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from uuid import UUID

from conversations.models import Turn

TOOL_CALLS = "tool_calls"  # the finish_reason of an answer that called functions


def made_calls(turn: Turn | None) -> bool:
    """Whether ``turn`` is an answer that called functions (and was not cut off, withdrawn or
    failed before its calls were read)."""
    return (
        turn is not None and turn.role == Turn.Role.ASSISTANT and bool(getattr(turn, "tool_calls", None))
        and turn.status == Turn.Status.COMPLETE
    )  # fmt: skip


def call_ids(turn: Turn) -> list[str]:
    """The ids of the calls ``turn`` made, in its order."""
    return [call["id"] for call in turn.tool_calls or ()]


def results_by_call_turn(turns: Iterable[Turn]) -> dict[UUID, list[Turn]]:
    """The ``tool`` turns among ``turns``, by the id of the answer whose calls they answer,
    oldest first."""
    found: dict[UUID, list[Turn]] = {}
    for turn in sorted(turns, key=lambda t: (t.created_at, str(t.turn_id))):
        if turn.role == Turn.Role.TOOL and turn.reply_to_id is not None:
            found.setdefault(turn.reply_to_id, []).append(turn)
    return found


def calls_before(answer: Turn, by_id: Mapping[UUID, Turn]) -> list[Turn]:
    """The calling answers ``answer`` follows (module docstring), oldest first: the answers of
    its ``continues`` chain that made calls. A cut-off answer on the chain that was continued
    (Continue, conversations/versions.py) is passed over, not an end: its text is the start of
    the continuation's, so a continuation of an answer written after tool calls follows the
    same rounds as that answer. [] for an answer that follows none (or whose chain is not among
    ``by_id``)."""
    chain: list[Turn] = []
    seen: set[UUID] = set()  # an imported log could link in a circle
    previous = by_id.get(getattr(answer, "continues_id", None))
    while previous is not None and previous.role == Turn.Role.ASSISTANT and previous.turn_id not in seen:
        seen.add(previous.turn_id)
        if made_calls(previous):
            chain.append(previous)
        elif getattr(previous, "tool_calls", None):
            break  # calls never read (cut off, failed): no round to follow
        previous = by_id.get(previous.continues_id)
    chain.reverse()
    return chain


def round_messages(calls: Iterable[Turn], results: Mapping[UUID, list[Turn]]) -> list[dict]:
    """OpenAI-shaped messages of tool rounds: each calling answer (``content`` its text or None,
    ``tool_calls``) then its results in the order of its calls (a call without a result is
    left out: it has none yet)."""
    messages: list[dict] = []
    for turn in calls:
        messages.append({"role": "assistant", "content": turn.content or None, "tool_calls": list(turn.tool_calls)})
        answered = {r.tool_call_id: r for r in results.get(turn.turn_id, ())}
        for call_id in call_ids(turn):
            if call_id in answered:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": answered[call_id].content})
    return messages


def answer_messages(answer: Turn, by_id: Mapping[UUID, Turn], results: Mapping[UUID, list[Turn]]) -> str | list[dict]:
    """What ``answer`` (an assistant turn) puts into a prompt: its text when it follows no tool
    round, else the rounds it follows (:func:`round_messages`) then its own text as an assistant
    message. ``by_id``: the conversation's turns by id; ``results``: :func:`results_by_call_turn`
    of them."""
    chain = calls_before(answer, by_id)
    if not chain:
        return answer.content
    return [*round_messages(chain, results), {"role": "assistant", "content": answer.content}]


# A result shown in full up to this many lines (and characters); a longer one shows its first
# lines, and the whole text opens in place.
RESULT_PREVIEW_LINES = 4
RESULT_PREVIEW_CHARS = 400


@dataclass(frozen=True)
class ToolUse:
    """One call of a tool round as a reader sees it: ``name`` and ``arguments`` (the JSON text
    the model wrote), ``result`` (the client's result, None when it has none) and ``preview``
    (the result's first :data:`RESULT_PREVIEW_LINES` lines, at most
    :data:`RESULT_PREVIEW_CHARS` characters; equal to ``result`` when that is short)."""

    call_id: str
    name: str
    arguments: str
    result: str | None
    preview: str

    @property
    def truncated(self) -> bool:
        """Whether ``preview`` is only the start of ``result``."""
        return self.result is not None and self.preview != self.result


def result_preview(text: str) -> str:
    """The first lines of a tool result (:class:`ToolUse` ``preview``), with an ellipsis when
    cut; ``text`` itself when it is short."""
    lines = text.splitlines()
    head = "\n".join(lines[:RESULT_PREVIEW_LINES])
    if len(lines) <= RESULT_PREVIEW_LINES and len(text) <= RESULT_PREVIEW_CHARS:
        return text
    return head[:RESULT_PREVIEW_CHARS].rstrip() + "\u2026"


def tool_uses(answer: Turn, by_id: Mapping[UUID, Turn], results: Mapping[UUID, list[Turn]]) -> list[ToolUse]:
    """The calls of the rounds ``answer`` follows (:func:`calls_before`) with their results, in
    the order they were made; [] for an answer that follows none. ``by_id`` and ``results``:
    as for :func:`answer_messages` (only the calling answers and their tool turns are needed)."""
    return calls_uses(calls_before(answer, by_id), results)


def calls_uses(calls: Iterable[Turn], results: Mapping[UUID, list[Turn]]) -> list[ToolUse]:
    """The calls of the calling answers ``calls`` with their results (``results``:
    :func:`results_by_call_turn`), in order, as :class:`ToolUse` rows."""
    uses: list[ToolUse] = []
    for turn in calls:
        answered = {r.tool_call_id: r.content for r in results.get(turn.turn_id, ())}
        for call in turn.tool_calls or ():
            function = call.get("function") or {}
            result = answered.get(call.get("id"))
            uses.append(
                ToolUse(
                    call_id=str(call.get("id", "")), name=str(function.get("name", "")),
                    arguments=str(function.get("arguments", "")), result=result,
                    preview=result_preview(result) if result is not None else "",
                )  # fmt: skip
            )
    return uses


def round_turn_ids(answer: Turn, by_id: Mapping[UUID, Turn], tool_turns: Mapping[UUID, list[Turn]]) -> list[UUID]:
    """The ids of the turns :func:`tool_uses` reads for ``answer``, found from turns *without
    text* (conversations/page_selectors.py's skeleton: roles and links only, ``tool_calls`` not
    loaded): each answer of its ``continues`` chain that has results among ``tool_turns``
    (tool turns by the answer they reply to), and those results; answers without results on
    the chain (continued cut-off ones) are passed over, as :func:`calls_before` does. [] for an
    answer that follows no round."""
    ids: list[UUID] = []
    seen: set[UUID] = set()
    previous = by_id.get(getattr(answer, "continues_id", None))
    while previous is not None and previous.role == Turn.Role.ASSISTANT and previous.turn_id not in seen:
        seen.add(previous.turn_id)
        if previous.turn_id in tool_turns:  # else a continued cut-off answer: passed over
            ids.append(previous.turn_id)
            ids.extend(t.turn_id for t in tool_turns[previous.turn_id])
        previous = by_id.get(previous.continues_id)
    return ids


def pending_calls(answer: Turn, results: Iterable[Turn]) -> list[str]:
    """The ids of ``answer``'s calls that no turn among ``results`` answers yet, in its order."""
    answered = {r.tool_call_id for r in results}
    return [call_id for call_id in call_ids(answer) if call_id not in answered]


class ToolResultsInvalid(ValueError):
    """Tool results that do not answer the latest answer's calls (a 400 on /v1; the message
    says which and why)."""


def tool_results_check(answer: Turn | None, earlier: Iterable[Turn], call_ids_given: list[str]) -> None:
    """Check results for the calls of ``answer`` (the answer the branch shown ends with; None:
    none), which ``earlier`` (its ``tool`` turns) answer in part. Raises
    :class:`ToolResultsInvalid` when it made no calls, for an id that matches none of its
    calls, and for a call given twice or answered already."""
    if not made_calls(answer):
        raise ToolResultsInvalid("The latest answer made no tool calls: there is nothing to send results for.")
    known = call_ids(answer)
    answered = {r.tool_call_id for r in earlier}
    seen: set[str] = set()
    for index, call_id in enumerate(call_ids_given):
        where = f"results[{index}].tool_call_id"
        if call_id not in known:
            raise ToolResultsInvalid(
                f"{where}: '{call_id}' matches no tool call of the latest answer (its calls: {', '.join(known)})."
            )
        if call_id in answered or call_id in seen:
            raise ToolResultsInvalid(f"{where}: the call '{call_id}' has a result already.")
        seen.add(call_id)
