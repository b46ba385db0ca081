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
  answer (imports/own_format.py ``stand_in_calls``); one whose calling answer does not list its
  call gets that call added to the answer (``unlisted_calls_add``).

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

from imports.chat import (
    ASSISTANT,
    USER,
    Chat,
    ImportFormatError,
    Message,
    Node,
    cycle_check,
    read_label,
    read_object,
    read_text,
    read_time,
)
from imports.own_format import chatsite_read


def chats_read(data) -> list[Chat]:
    """The chats of a parsed export file (``json.loads`` of it), whichever of the three formats
    it is. Raises ImportFormatError when it is none of them or is malformed."""
    if isinstance(data, dict) and data.get("format") == "chatsite-export":
        chats = chatsite_read(data)
        if not chats:
            raise ImportFormatError("The file holds no conversations.")
        return chats
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
    content = read_object(content, f"{where}.content")
    parts = content.get("parts")
    if parts is None:
        return read_text(content.get("text"), f"{where}.content.text")
    if not isinstance(parts, list):
        raise ImportFormatError(f"{where}.content.parts: expected a list")
    return "\n".join(read_text(p, f"{where}.content.parts") for p in parts if isinstance(p, str)).strip()


def chatgpt_read(item, where: str) -> Chat:
    """One conversation of ChatGPT's conversations.json (module docstring)."""
    item = read_object(item, where)
    mapping = read_object(item.get("mapping"), f"{where}.mapping")
    created = read_time(item.get("create_time"), f"{where}.create_time")
    nodes = []
    for key, raw in mapping.items():
        node_where = f"{where}.mapping[{key!r}]"
        raw = read_object(raw, node_where)
        message = raw.get("message")
        role, content, when, model = "", "", None, ""
        if message is not None:
            message = read_object(message, f"{node_where}.message")
            author = read_object(message.get("author") or {}, f"{node_where}.message.author")
            role = str(author.get("role") or "")
            metadata = message.get("metadata") or {}
            if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
                role = "hidden"
            content = _chatgpt_content(message, f"{node_where}.message")
            when = read_time(message.get("create_time"), f"{node_where}.message.create_time")
            model = read_label(metadata.get("model_slug")) if isinstance(metadata, dict) else ""
        parent = raw.get("parent")
        if parent is not None and (not isinstance(parent, str) or parent not in mapping):
            raise ImportFormatError(f"{node_where}.parent: {parent!r} is not a node of the mapping")
        nodes.append(Node(str(key), parent, role, content, when, model))
    updated = read_time(item.get("update_time"), f"{where}.update_time")
    return links_from_tree(
        nodes, source="chatgpt", source_id=str(item.get("conversation_id") or item.get("id") or ""),
        title=read_text(item.get("title"), f"{where}.title"), created_at=created, updated_at=updated,
        current=item.get("current_node"), model=str(item.get("default_model_slug") or ""), where=where,
    )  # fmt: skip


# --- Open WebUI ----------------------------------------------------------------------------------


def openwebui_read(item, where: str) -> Chat:
    """One Open WebUI chat export (module docstring)."""
    item = read_object(item, where)
    chat = read_object(item.get("chat"), f"{where}.chat")
    history = read_object(chat.get("history"), f"{where}.chat.history")
    messages = read_object(history.get("messages"), f"{where}.chat.history.messages")
    nodes = []
    for key, raw in messages.items():
        node_where = f"{where}.chat.history.messages[{key!r}]"
        raw = read_object(raw, node_where)
        parent = raw.get("parentId")
        if parent is not None and (not isinstance(parent, str) or parent not in messages):
            raise ImportFormatError(f"{node_where}.parentId: {parent!r} is not a message of the chat")
        nodes.append(
            Node(
                str(key), parent, str(raw.get("role") or ""), read_text(raw.get("content"), f"{node_where}.content"),
                read_time(raw.get("timestamp"), f"{node_where}.timestamp"), read_label(raw.get("model")),
            )
        )
    models = chat.get("models") if isinstance(chat.get("models"), list) else []
    return links_from_tree(
        nodes, source="openwebui", source_id=str(item.get("id") or chat.get("id") or ""),
        title=read_text(item.get("title") or chat.get("title"), f"{where}.title"),
        created_at=read_time(item.get("created_at") or chat.get("timestamp"), f"{where}.created_at"),
        updated_at=read_time(item.get("updated_at"), f"{where}.updated_at"),
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
    cycle_check({n.key: n.parent for n in nodes}, where)  # else walks up the tree would not end
    fallback = created_at or updated_at or dt.datetime.now(dt.UTC)

    def up(node: Node) -> Node | None:
        return by_key.get(node.parent) if node.parent is not None else None

    # What each walk up the tree found, kept for the nodes it passed: a chain of n nodes is
    # walked once, not n times (a long conversation would take hours).
    times: dict[str, dt.datetime] = {}
    nearest: dict[str, Node | None] = {}  # node key -> itself if kept, else its nearest kept ancestor

    def when(node: Node | None) -> dt.datetime:
        path = []
        while node is not None and node.key not in times and node.created_at is None:
            path.append(node)
            node = up(node)
        moment = fallback if node is None else times.get(node.key, node.created_at)
        times.update((n.key, moment) for n in path)
        return moment

    depth: dict[str, int] = {}

    def level(node: Node) -> int:  # nodes above it: of two at one time, the parent comes first
        path = []
        while node is not None and node.key not in depth:
            path.append(node)
            node = up(node)
        at = -1 if node is None else depth[node.key]
        for above in reversed(path):
            at += 1
            depth[above.key] = at
        return at

    def kept(node: Node) -> bool:
        return node.role in (USER, ASSISTANT) and bool(node.content.strip())

    # Walk from each kept node to its nearest kept ancestor (dropped nodes are stepped over).
    def kept_parent(node: Node) -> Node | None:
        path, at = [], up(node)
        while at is not None and at.key not in nearest and not kept(at):
            path.append(at)
            at = up(at)
        found = nearest[at.key] if at is not None and at.key in nearest else at
        nearest.update((n.key, found) for n in path)
        return found

    order = sorted((n for n in nodes if kept(n)), key=lambda n: (when(n), level(n), n.key))
    messages: dict[str, Message] = {}
    owner_of: dict[str, str] = {}  # node key -> the message key it was merged into
    question_of: dict[str, str | None] = {}  # node key -> the user message key above it (itself for users)
    last_sibling: dict[tuple[str, str | None], str] = {}
    parts: dict[str, list[str]] = {}  # answer key -> the texts of its later parts
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
                owner_of[node.key] = owner_of[above.key]
                parts.setdefault(owner_of[above.key], []).append(node.content)
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
    for key, texts in parts.items():
        messages[key].content = "\n\n".join([messages[key].content, *texts])
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
