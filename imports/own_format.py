"""This product's own JSON export read back (privacy/conversation_export.py: one conversation,
or the account archive's data.json): turns with their own links, tool rounds included, and
stand-in calling answers for results whose calling answer the file lacks (imports/formats.py's
module docstring has the whole story)."""

from __future__ import annotations

import bisect
import datetime as dt

from imports.chat import (
    ASSISTANT,
    TOOL,
    USER,
    Chat,
    ImportFormatError,
    Message,
    cycle_check,
    read_label,
    read_object,
    read_text,
    read_time,
)


def chatsite_read(data: dict) -> list[Chat]:
    """This product's JSON: one conversation (``"kind": "conversation"``) or an account
    archive's data.json (``"conversations": [...]``)."""
    if data.get("kind") == "conversation":
        return [_chatsite_conversation(read_object(data.get("conversation"), "conversation"), "conversation")]
    conversations = data.get("conversations")
    if not isinstance(conversations, list):
        raise ImportFormatError("conversations: expected a list (this service's data.json)")
    return [_chatsite_conversation(read_object(c, f"conversations[{i}]"), f"conversations[{i}]")
            for i, c in enumerate(conversations)]  # fmt: skip


def _chatsite_conversation(item: dict, where: str) -> Chat:
    turns = item.get("turns")
    if not isinstance(turns, list):
        raise ImportFormatError(f"{where}.turns: expected a list")
    messages = []
    seen: set[str] = set()
    for index, raw in enumerate(turns):
        turn_where = f"{where}.turns[{index}]"
        raw = read_object(raw, turn_where)
        role = raw.get("role")
        if role not in (USER, ASSISTANT, TOOL):
            continue  # system turns have no place on the chat page
        if raw.get("held"):
            continue  # an answer not yet written when exported
        key = str(raw.get("turn_id") or "")
        if not key:
            raise ImportFormatError(f"{turn_where}.turn_id: missing")
        if key in seen:
            raise ImportFormatError(f"{turn_where}.turn_id: {key!r} is the id of an earlier turn too")
        seen.add(key)
        created = read_time(raw.get("created_at"), f"{turn_where}.created_at")
        if created is None:
            raise ImportFormatError(f"{turn_where}.created_at: missing")
        status = str(raw.get("status") or "complete")
        if status not in ("complete", "cancelled", "failed", "blocked"):
            raise ImportFormatError(f"{turn_where}.status: {status!r} is not a turn status")
        messages.append(
            Message(
                key, role, read_text(raw.get("content"), f"{turn_where}.content"), created,
                parent=_key(raw.get("parent")), reply_to=_key(raw.get("reply_to")),
                replaces=_key(raw.get("replaces")), model=read_label(raw.get("model_version")), status=status,
                continues=_key(raw.get("continues")),
                tool_calls=_tool_calls(raw.get("tool_calls"), f"{turn_where}.tool_calls") if role == ASSISTANT else [],
                tool_call_id=read_text(raw.get("tool_call_id"), f"{turn_where}.tool_call_id")[:200] if role == TOOL else "",
                finish_reason=read_text(raw.get("finish_reason"), f"{turn_where}.finish_reason")[:16],
            )
        )  # fmt: skip
    added_calls = unlisted_calls_add(messages)
    stand_ins = stand_in_calls(messages, where)
    messages.extend(stand_ins)
    keys = {m.key for m in messages}
    for message in messages:
        for link in ("parent", "reply_to", "replaces", "continues"):
            value = getattr(message, link)
            if value is not None and value not in keys:
                setattr(message, link, None)  # a turn not in the file (a held one)
        if message.role == ASSISTANT and message.reply_to is None:
            raise ImportFormatError(f"{where}: answer {message.key} replies to no message of the file")
    cycle_check({m.key: m.parent for m in messages}, where)  # the branch shown is found by walking up
    messages.sort(key=lambda m: (m.created_at, m.key))
    path = item.get("selected_path") if isinstance(item.get("selected_path"), list) else []
    on_path = [str(k) for k in path if str(k) in keys]
    chat = Chat(
        source="chatsite", source_id=str(item.get("conversation_id") or ""),
        title=read_text(item.get("title"), f"{where}.title"),
        created_at=read_time(item.get("created_at"), f"{where}.created_at") or (messages[0].created_at if messages else dt.datetime.now(dt.UTC)),
        updated_at=read_time(item.get("last_turn_at"), f"{where}.last_turn_at") or (messages[-1].created_at if messages else dt.datetime.now(dt.UTC)),
        messages=messages, model=str(item.get("model") or ""),
        system_prompt=read_text(item.get("system_prompt"), f"{where}.system_prompt"),
        current=on_path[-1] if on_path else None,
    )  # fmt: skip
    chat.stand_ins = len(stand_ins)
    chat.added_calls = added_calls
    if not chat.source_id:
        raise ImportFormatError(f"{where}.conversation_id: missing")
    by_key = {m.key: m for m in messages}
    for key in on_path:
        if by_key[key].role == ASSISTANT:
            chat.answer_choices[by_key[key].reply_to] = key
    return chat


# The function a stand-in calling answer names (:func:`stand_in_calls`): the file does not say.
STAND_IN_FUNCTION = "unknown"


def unlisted_calls_add(messages: list[Message]) -> int:
    """Add to a calling answer of ``messages`` the calls its ``tool`` results name but it does
    not list; returns how many were added (``messages`` is edited in place).

    A page and a prompt show a result under the call of its answer that has its
    ``tool_call_id`` (conversations/toolrounds.py); a result whose id the answer does not list
    would be stored and never seen. Like :func:`stand_in_calls`, the result is kept where it
    is read: its answer gets a call with that id, function :data:`STAND_IN_FUNCTION` and no
    arguments (the file does not say which), after the calls it has, and ``finish_reason``
    ``tool_calls`` when it had none. A result with no id, or one another result of the answer
    already answers, gets an id of its own first. Results whose answer is not in the file are
    :func:`stand_in_calls`' part."""
    answers = {m.key: m for m in messages if m.role == ASSISTANT}
    added = 0
    answered: dict[str, set[str]] = {}  # answer key -> the call ids a result answers
    listed: dict[str, set[str]] = {}  # answer key -> the call ids it lists (kept, not rebuilt per result)
    for result in sorted((m for m in messages if m.role == TOOL), key=lambda m: (m.created_at, m.key)):
        answer = answers.get(result.reply_to)
        if answer is None:
            continue
        seen = answered.setdefault(answer.key, set())
        if answer.key not in listed:
            listed[answer.key] = {call["id"] for call in answer.tool_calls}
            answer.tool_calls = list(answer.tool_calls)  # appended to below, in place
        if result.tool_call_id in listed[answer.key] and result.tool_call_id not in seen:
            seen.add(result.tool_call_id)
            continue
        if not result.tool_call_id or result.tool_call_id in seen:
            result.tool_call_id = f"{result.tool_call_id or 'call'}_{result.key}"[:200]
        seen.add(result.tool_call_id)
        listed[answer.key].add(result.tool_call_id)
        answer.tool_calls.append(_stand_in_call(result.tool_call_id))
        answer.finish_reason = "tool_calls"
        added += 1
    return added


def _stand_in_call(call_id: str) -> dict:
    """A call the file does not describe, for a result answering ``call_id``: OpenAI's shape,
    function :data:`STAND_IN_FUNCTION`, no arguments."""
    return {"id": call_id, "type": "function", "function": {"name": STAND_IN_FUNCTION, "arguments": ""}}


def stand_in_calls(messages: list[Message], where: str) -> list[Message]:
    """Calling answers to put in for the ``tool`` results among ``messages`` (this product's
    export, links as the file gives them) whose calling answer is not an answer of the file.

    Why not leave such results out, or refuse the file: a result is what a tool returned, which
    the file may hold nowhere else, and the answer written after it read it. Left out, it would
    be gone without a word; refused, the whole file (an account's archive, perhaps) would not
    import for one missing turn. So the results are kept where a reader and the model see them:
    answering a stand-in calling answer (an assistant turn with empty text, ``finish_reason``
    ``tool_calls``, one call per result: its ``tool_call_id``, function
    :data:`STAND_IN_FUNCTION`, no arguments, since the file does not say which), which the
    page shows as "Used N tools" above the answer after them and prompts read as a round.

    One stand-in per missing calling answer (the results naming the same missing ``reply_to``;
    a result naming none, or a turn that is no answer, gets its own). It takes the missing
    answer's key, so an answer that ``continues`` it follows it as it followed the original;
    its question is that answer's, else the question of the nearest message before the first
    result. Its time is just before that result. Results get ``reply_to`` the stand-in (and a
    call id of their own where they have none or share one). Returns the stand-ins (``messages``
    is edited in place). Raises ImportFormatError when a result has no message before it to
    attach it to."""
    by_key = {m.key: m for m in messages}
    answers = {m.key for m in messages if m.role == ASSISTANT}
    groups: dict[str, list[Message]] = {}
    for result in sorted((m for m in messages if m.role == TOOL), key=lambda m: (m.created_at, m.key)):
        if result.reply_to in answers:
            continue
        missing = result.reply_to is not None and result.reply_to not in by_key
        groups.setdefault(result.reply_to if missing else f"{result.key}:calls", []).append(result)
    # Each group's question is found without a scan of the file per group (a hand-made file of
    # many results naming different missing answers would take time in their square): the first
    # answer continuing each key, and, in time order, the question of the latest message so far.
    followers: dict[str, Message] = {}
    for message in messages:
        if message.role == ASSISTANT and message.continues is not None:
            followers.setdefault(message.continues, message)
    ordered = sorted((m for m in messages if m.role in (USER, ASSISTANT)), key=lambda m: (m.created_at, m.key))
    order_keys = [(m.created_at, m.key) for m in ordered]
    question_so_far: list[str | None] = []  # [i]: the question of the latest of ordered[:i + 1] that has one
    for m in ordered:
        latest = m.key if m.role == USER else m.reply_to if m.reply_to in by_key else None
        question_so_far.append(latest if latest is not None else (question_so_far[-1] if question_so_far else None))
    stand_ins = []
    for key, results in groups.items():
        first = results[0]
        follower = followers.get(key)
        question = follower.reply_to if follower is not None and follower.reply_to in by_key else None
        if question is None:
            before = bisect.bisect_left(order_keys, (first.created_at, first.key))  # messages before it
            question = question_so_far[before - 1] if before else None
        if question is None:
            raise ImportFormatError(
                f"{where}: tool result {first.key} answers a call whose answer is not in the file, and no "
                "message comes before it to attach it to"
            )
        calls, seen = [], set()
        for result in results:
            if not result.tool_call_id or result.tool_call_id in seen:
                result.tool_call_id = f"{result.tool_call_id or 'call'}_{result.key}"[:200]
            seen.add(result.tool_call_id)
            result.reply_to = key
            calls.append(_stand_in_call(result.tool_call_id))
        stand_ins.append(
            Message(
                key, ASSISTANT, "", first.created_at - dt.timedelta(microseconds=1), reply_to=question,
                tool_calls=calls, finish_reason="tool_calls",
            )
        )  # fmt: skip
    return stand_ins


def _tool_calls(value, where: str) -> list[dict]:
    """An answer's ``tool_calls`` (OpenAI's items: ``{"id", "type": "function", "function":
    {"name", "arguments"}}``), checked for shape; [] for none."""
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise ImportFormatError(f"{where}: expected a list, found {type(value).__name__}")
    calls = []
    for index, raw in enumerate(value):
        call = read_object(raw, f"{where}[{index}]")
        function = read_object(call.get("function"), f"{where}[{index}].function")
        call_id = read_text(call.get("id"), f"{where}[{index}].id")
        if not call_id:
            raise ImportFormatError(f"{where}[{index}].id: missing")
        calls.append({
            "id": call_id[:200], "type": "function",
            "function": {
                "name": read_text(function.get("name"), f"{where}[{index}].function.name"),
                "arguments": read_text(function.get("arguments"), f"{where}[{index}].function.arguments"),
            },
        })  # fmt: skip
    return calls


def _key(value) -> str | None:
    return None if value in (None, "") else str(value)
