"""Reading another product's chat export (issue 30, part 3: "Bring your history").

Three formats, told apart by their shape (:func:`chats_read`):

- **ChatGPT** (the ``conversations.json`` of "Export data"): a list of conversations, each with
  ``mapping`` (node id -> ``{"message", "parent", "children"}``), ``current_node`` (the leaf of
  the branch last shown), ``title``, ``create_time`` / ``update_time`` (Unix seconds, floats),
  and ``conversation_id`` or ``id``. A message has ``author.role``, ``content.parts`` (text and,
  for images, objects left out here), ``create_time`` and ``metadata.model_slug``.
- **Open WebUI** (a chat export, one chat or a list): ``{"id", "title", "created_at",
  "updated_at", "chat": {"history": {"messages": {id: {"id", "parentId", "role", "content",
  "timestamp", "model"}}, "currentId"}}}`` (times in Unix seconds).
- **This product's** JSON (privacy/conversation_export.py, one conversation, or the account
  archive's data.json): turns with their own ``parent`` / ``reply_to`` / ``replaces`` /
  ``continues`` links, read as they are, tool rounds included (conversations/toolrounds.py: an
  answer's ``tool_calls``, the ``tool`` turns with their ``tool_call_id``, the answer after them
  that ``continues`` the calling one), so export -> import -> export keeps them. A result whose
  calling answer the file lacks (a file cut or edited by hand) is kept, under a stand-in calling
  answer (:func:`stand_in_calls`).

Each becomes a :class:`Chat` of :class:`Message` rows with the links this product's turn tree
uses (conversations/versions.py): a user message's ``parent`` (the user message before it on
its branch), an answer's ``reply_to`` (its question), and ``replaces`` (an edit's or a
regenerated answer's earlier sibling). A message tree (ChatGPT, Open WebUI) is turned into those
links by :func:`links_from_tree`: system, tool and empty messages are stepped over; an answer
that follows another answer directly (a model's reply in parts around a tool) joins it; an answer
before any question has nothing to hang off and is left out (counted in ``Chat.skipped``).

Malformed input raises :class:`ImportFormatError` naming where (``conversations[3].mapping``)
and what is wrong; nothing is read past it, so a caller imports all or nothing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

USER, ASSISTANT, TOOL = "user", "assistant", "tool"


class ImportFormatError(ValueError):
    """The file is not an export this reader knows, or part of it is malformed (the message
    names the part)."""


@dataclass
class Message:
    """One message with this product's links (module docstring); keys are the source's ids."""

    key: str
    role: str  # "user" | "assistant" | "tool" (this product's own export only)
    content: str
    created_at: dt.datetime
    parent: str | None = None  # user messages
    reply_to: str | None = None  # answers: the question; tool results: the calling answer
    replaces: str | None = None
    model: str = ""
    status: str = "complete"
    continues: str | None = None  # answers: the cut-off or calling answer this one follows
    tool_calls: list[dict] = field(default_factory=list)  # answers that called functions
    tool_call_id: str = ""  # tool results
    finish_reason: str = ""  # "": what the importer infers from the status


@dataclass
class Chat:
    """One conversation to import: ``source`` (``chatgpt`` | ``openwebui`` | ``chatsite``) and
    its id there, title, times, model, system prompt, messages (oldest first), and the branch to
    show: ``current`` (the key of the newest message on it; None: the newest branch).
    ``skipped``: messages left out (module docstring); ``stand_ins``: calling answers put in
    for tool results whose own calling answer the file lacks (:func:`stand_in_calls`)."""

    source: str
    source_id: str
    title: str
    created_at: dt.datetime
    updated_at: dt.datetime
    messages: list[Message]
    model: str = ""
    system_prompt: str = ""
    current: str | None = None
    skipped: int = 0
    answer_choices: dict[str, str] = field(default_factory=dict)  # question key -> answer key
    stand_ins: int = 0  # calling answers put in for results whose own was not in the file


@dataclass
class Node:
    """A message of a source's tree before linking: ``parent`` is the node before it."""

    key: str
    parent: str | None
    role: str
    content: str
    created_at: dt.datetime | None
    model: str = ""


def _when(value, where: str) -> dt.datetime | None:
    """A Unix time (seconds, int or float; milliseconds when it is too large to be seconds) or
    an ISO 8601 text -> an aware UTC datetime; None for None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ImportFormatError(f"{where}: not a time: {value!r}")
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 10_000_000_000 else value
        try:
            return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
        except (OverflowError, OSError, ValueError):
            raise ImportFormatError(f"{where}: not a time: {value!r}") from None
    if isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ImportFormatError(f"{where}: not a time: {value!r}") from None
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    raise ImportFormatError(f"{where}: not a time: {value!r}")


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ImportFormatError(f"{where}: expected an object, found {type(value).__name__}")
    return value


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ImportFormatError(f"{where}: expected text, found {type(value).__name__}")
    return value.replace("\x00", "")  # PostgreSQL text cannot hold NUL


def chats_read(data) -> list[Chat]:
    """The chats of a parsed export file (``json.loads`` of it), whichever of the three formats
    it is. Raises ImportFormatError when it is none of them or is malformed."""
    if isinstance(data, dict) and data.get("format") == "chatsite-export":
        return chatsite_read(data)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise ImportFormatError("The file holds no conversations.")
    first = items[0]
    if isinstance(first, dict) and "mapping" in first:
        return [chatgpt_read(item, f"conversations[{i}]") for i, item in enumerate(items)]
    if isinstance(first, dict) and isinstance(first.get("chat"), dict):
        return [openwebui_read(item, f"chats[{i}]") for i, item in enumerate(items)]
    raise ImportFormatError(
        "This is not a chat export this service reads: expected ChatGPT's conversations.json, an "
        "Open WebUI chat export or this service's own JSON export."
    )


# --- ChatGPT -----------------------------------------------------------------------------------


def _chatgpt_content(message: dict, where: str) -> str:
    content = message.get("content")
    if content is None:
        return ""
    content = _object(content, f"{where}.content")
    parts = content.get("parts")
    if parts is None:
        return _text(content.get("text"), f"{where}.content.text")
    if not isinstance(parts, list):
        raise ImportFormatError(f"{where}.content.parts: expected a list")
    return "\n".join(_text(p, f"{where}.content.parts") for p in parts if isinstance(p, str)).strip()


def chatgpt_read(item, where: str) -> Chat:
    """One conversation of ChatGPT's conversations.json (module docstring)."""
    item = _object(item, where)
    mapping = _object(item.get("mapping"), f"{where}.mapping")
    created = _when(item.get("create_time"), f"{where}.create_time")
    nodes = []
    for key, raw in mapping.items():
        node_where = f"{where}.mapping[{key!r}]"
        raw = _object(raw, node_where)
        message = raw.get("message")
        role, content, when, model = "", "", None, ""
        if message is not None:
            message = _object(message, f"{node_where}.message")
            author = _object(message.get("author") or {}, f"{node_where}.message.author")
            role = str(author.get("role") or "")
            metadata = message.get("metadata") or {}
            if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
                role = "hidden"
            content = _chatgpt_content(message, f"{node_where}.message")
            when = _when(message.get("create_time"), f"{node_where}.message.create_time")
            model = str(metadata.get("model_slug") or "") if isinstance(metadata, dict) else ""
        parent = raw.get("parent")
        if parent is not None and parent not in mapping:
            raise ImportFormatError(f"{node_where}.parent: {parent!r} is not a node of the mapping")
        nodes.append(Node(str(key), parent, role, content, when, model))
    updated = _when(item.get("update_time"), f"{where}.update_time")
    return links_from_tree(
        nodes, source="chatgpt", source_id=str(item.get("conversation_id") or item.get("id") or ""),
        title=_text(item.get("title"), f"{where}.title"), created_at=created, updated_at=updated,
        current=item.get("current_node"), model=str(item.get("default_model_slug") or ""), where=where,
    )  # fmt: skip


# --- Open WebUI ----------------------------------------------------------------------------------


def openwebui_read(item, where: str) -> Chat:
    """One Open WebUI chat export (module docstring)."""
    item = _object(item, where)
    chat = _object(item.get("chat"), f"{where}.chat")
    history = _object(chat.get("history"), f"{where}.chat.history")
    messages = _object(history.get("messages"), f"{where}.chat.history.messages")
    nodes = []
    for key, raw in messages.items():
        node_where = f"{where}.chat.history.messages[{key!r}]"
        raw = _object(raw, node_where)
        parent = raw.get("parentId")
        if parent is not None and parent not in messages:
            raise ImportFormatError(f"{node_where}.parentId: {parent!r} is not a message of the chat")
        nodes.append(
            Node(
                str(key), parent, str(raw.get("role") or ""), _text(raw.get("content"), f"{node_where}.content"),
                _when(raw.get("timestamp"), f"{node_where}.timestamp"), str(raw.get("model") or ""),
            )
        )
    models = chat.get("models") if isinstance(chat.get("models"), list) else []
    return links_from_tree(
        nodes, source="openwebui", source_id=str(item.get("id") or chat.get("id") or ""),
        title=_text(item.get("title") or chat.get("title"), f"{where}.title"),
        created_at=_when(item.get("created_at") or chat.get("timestamp"), f"{where}.created_at"),
        updated_at=_when(item.get("updated_at"), f"{where}.updated_at"),
        current=history.get("currentId"), model=str(models[0]) if models else "", where=where,
    )  # fmt: skip


# --- a message tree -> this product's links ------------------------------------------------------


def links_from_tree(
    nodes: list[Node],
    *,
    source: str,
    source_id: str,
    title: str,
    created_at: dt.datetime | None,
    updated_at: dt.datetime | None,
    current: str | None,
    model: str,
    where: str,
) -> Chat:
    """A :class:`Chat` from a source's message tree (module docstring). Messages without a
    time get their parent's (or the chat's); the chat's times default to its messages'."""
    if not source_id:
        raise ImportFormatError(f"{where}: the conversation has no id")
    by_key = {n.key: n for n in nodes}
    for node in nodes:  # a cycle would make every walk up the tree endless
        seen, at = set(), node
        while at is not None:
            if at.key in seen:
                raise ImportFormatError(f"{where}: the messages' parents form a cycle at {node.key!r}")
            seen.add(at.key)
            at = by_key.get(at.parent) if at.parent is not None else None
    fallback = created_at or updated_at or dt.datetime.now(dt.UTC)

    def when(node: Node) -> dt.datetime:
        at = node
        while at is not None:
            if at.created_at is not None:
                return at.created_at
            at = by_key.get(at.parent) if at.parent is not None else None
        return fallback

    def kept(node: Node) -> bool:
        return node.role in (USER, ASSISTANT) and bool(node.content.strip())

    # Walk from each kept node to its nearest kept ancestor (dropped nodes are stepped over).
    def kept_parent(node: Node) -> Node | None:
        at = by_key.get(node.parent) if node.parent is not None else None
        while at is not None and not kept(at):
            at = by_key.get(at.parent) if at.parent is not None else None
        return at

    order = sorted((n for n in nodes if kept(n)), key=lambda n: (when(n), n.key))
    messages: dict[str, Message] = {}
    owner_of: dict[str, str] = {}  # node key -> the message key it was merged into
    question_of: dict[str, str | None] = {}  # node key -> the user message key above it (itself for users)
    last_sibling: dict[tuple[str, str | None], str] = {}
    skipped = 0
    for node in order:
        above = kept_parent(node)
        above_question = question_of.get(above.key) if above is not None else None
        if node.role == USER:
            message = Message(node.key, USER, node.content, when(node), parent=above_question)
            sibling_key = (USER, above_question)
        else:
            if above is None or above_question is None:
                skipped += 1  # an answer before any question
                question_of[node.key] = None
                continue
            if above.role == ASSISTANT and above.key in owner_of:  # an answer in parts
                merged = messages[owner_of[above.key]]
                merged.content = f"{merged.content}\n\n{node.content}"
                owner_of[node.key] = merged.key
                question_of[node.key] = above_question
                continue
            message = Message(node.key, ASSISTANT, node.content, when(node), reply_to=above_question,
                              model=node.model or model)  # fmt: skip
            sibling_key = (ASSISTANT, above_question)
        message.replaces = last_sibling.get(sibling_key)
        last_sibling[sibling_key] = node.key
        messages[node.key] = message
        owner_of[node.key] = node.key
        question_of[node.key] = node.key if node.role == USER else above_question
    chat_messages = list(messages.values())
    times = [m.created_at for m in chat_messages]
    chat = Chat(
        source=source, source_id=source_id, title=title.strip(),
        created_at=created_at or (min(times) if times else fallback),
        updated_at=updated_at or (max(times) if times else fallback),
        messages=chat_messages, model=model, skipped=skipped,
    )  # fmt: skip
    # The branch shown: the current node's nearest kept message, and the answers on its path.
    at = by_key.get(current) if isinstance(current, str) else None
    while at is not None and at.key not in owner_of:
        at = by_key.get(at.parent) if at.parent is not None else None
    if at is not None:
        chat.current = owner_of[at.key]
        node = at
        while node is not None:
            key = owner_of.get(node.key)
            if key is not None and messages[key].role == ASSISTANT:
                chat.answer_choices[messages[key].reply_to] = key
            node = by_key.get(node.parent) if node.parent is not None else None
    return chat


# --- this product's own export -------------------------------------------------------------------


def chatsite_read(data: dict) -> list[Chat]:
    """This product's JSON: one conversation (``"kind": "conversation"``) or an account
    archive's data.json (``"conversations": [...]``)."""
    if data.get("kind") == "conversation":
        return [_chatsite_conversation(_object(data.get("conversation"), "conversation"), "conversation")]
    conversations = data.get("conversations")
    if not isinstance(conversations, list):
        raise ImportFormatError("conversations: expected a list (this service's data.json)")
    return [_chatsite_conversation(_object(c, f"conversations[{i}]"), f"conversations[{i}]")
            for i, c in enumerate(conversations)]  # fmt: skip


def _chatsite_conversation(item: dict, where: str) -> Chat:
    turns = item.get("turns")
    if not isinstance(turns, list):
        raise ImportFormatError(f"{where}.turns: expected a list")
    messages = []
    for index, raw in enumerate(turns):
        turn_where = f"{where}.turns[{index}]"
        raw = _object(raw, turn_where)
        role = raw.get("role")
        if role not in (USER, ASSISTANT, TOOL):
            continue  # system turns have no place on the chat page
        if raw.get("held"):
            continue  # an answer not yet written when exported
        key = str(raw.get("turn_id") or "")
        if not key:
            raise ImportFormatError(f"{turn_where}.turn_id: missing")
        created = _when(raw.get("created_at"), f"{turn_where}.created_at")
        if created is None:
            raise ImportFormatError(f"{turn_where}.created_at: missing")
        status = str(raw.get("status") or "complete")
        if status not in ("complete", "cancelled", "failed", "blocked"):
            raise ImportFormatError(f"{turn_where}.status: {status!r} is not a turn status")
        messages.append(
            Message(
                key, role, _text(raw.get("content"), f"{turn_where}.content"), created,
                parent=_key(raw.get("parent")), reply_to=_key(raw.get("reply_to")),
                replaces=_key(raw.get("replaces")), model=str(raw.get("model_version") or ""), status=status,
                continues=_key(raw.get("continues")),
                tool_calls=_tool_calls(raw.get("tool_calls"), f"{turn_where}.tool_calls") if role == ASSISTANT else [],
                tool_call_id=_text(raw.get("tool_call_id"), f"{turn_where}.tool_call_id")[:200] if role == TOOL else "",
                finish_reason=_text(raw.get("finish_reason"), f"{turn_where}.finish_reason")[:16],
            )
        )  # fmt: skip
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
    messages.sort(key=lambda m: (m.created_at, m.key))
    path = item.get("selected_path") if isinstance(item.get("selected_path"), list) else []
    on_path = [str(k) for k in path if str(k) in keys]
    chat = Chat(
        source="chatsite", source_id=str(item.get("conversation_id") or ""),
        title=_text(item.get("title"), f"{where}.title"),
        created_at=_when(item.get("created_at"), f"{where}.created_at") or (messages[0].created_at if messages else dt.datetime.now(dt.UTC)),
        updated_at=_when(item.get("last_turn_at"), f"{where}.last_turn_at") or (messages[-1].created_at if messages else dt.datetime.now(dt.UTC)),
        messages=messages, model=str(item.get("model") or ""),
        system_prompt=_text(item.get("system_prompt"), f"{where}.system_prompt"),
        current=on_path[-1] if on_path else None,
    )  # fmt: skip
    chat.stand_ins = len(stand_ins)
    if not chat.source_id:
        raise ImportFormatError(f"{where}.conversation_id: missing")
    by_key = {m.key: m for m in messages}
    for key in on_path:
        if by_key[key].role == ASSISTANT:
            chat.answer_choices[by_key[key].reply_to] = key
    return chat


# The function a stand-in calling answer names (:func:`stand_in_calls`): the file does not say.
STAND_IN_FUNCTION = "unknown"


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
    ordered = sorted((m for m in messages if m.role in (USER, ASSISTANT)), key=lambda m: (m.created_at, m.key))
    stand_ins = []
    for key, results in groups.items():
        first = results[0]
        follower = next((m for m in messages if m.role == ASSISTANT and m.continues == key), None)
        question = follower.reply_to if follower is not None and follower.reply_to in by_key else None
        if question is None:
            before = [m for m in ordered if (m.created_at, m.key) < (first.created_at, first.key)]
            question = next(
                (m.key if m.role == USER else m.reply_to for m in reversed(before)
                 if m.role == USER or m.reply_to in by_key),
                None,
            )  # fmt: skip
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
            calls.append(
                {"id": result.tool_call_id, "type": "function", "function": {"name": STAND_IN_FUNCTION, "arguments": ""}}
            )
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
        call = _object(raw, f"{where}[{index}]")
        function = _object(call.get("function"), f"{where}[{index}].function")
        call_id = _text(call.get("id"), f"{where}[{index}].id")
        if not call_id:
            raise ImportFormatError(f"{where}[{index}].id: missing")
        calls.append({
            "id": call_id[:200], "type": "function",
            "function": {
                "name": _text(function.get("name"), f"{where}[{index}].function.name"),
                "arguments": _text(function.get("arguments"), f"{where}[{index}].function.arguments"),
            },
        })  # fmt: skip
    return calls


def _key(value) -> str | None:
    return None if value in (None, "") else str(value)
