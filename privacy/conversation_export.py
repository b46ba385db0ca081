"""One conversation as a download, from the conversation's menu (issue 18, part 11).

Two files, both built by the account export's code (privacy/export_sections.py,
privacy/markdown.py), so a turn is serialised one way whatever the export:

- Markdown (``.md``): the branch the chat page shows (the selected path of the turn tree,
  conversations/versions.py); the file says so and how many other branches there are.
- JSON (``.json``): the whole tree: every turn, branch and version, each user turn with its
  ``parent``, and ``selected_path`` (the ids of the turns the page shows). ``"scope": "tree"``
  says so. In a project chat each answer carries its ``sources`` (file name, passage text).

Only the owner downloads (the views read the conversation with
``conversation_get_for_user``: 404 for anyone else). Small enough to build in memory: one
conversation's turns, no attachment files (their names and sizes are in the JSON).
"""

from __future__ import annotations

import json
from collections import defaultdict

from django.utils import timezone
from django.utils.text import slugify

from attachments.models import Attachment
from conversations.models import Conversation
from feedback.models import Feedback
from privacy.archive import ExportEncoder
from privacy.export import FORMAT, VERSION
from privacy.export_sections import conversation_json, conversation_turns
from privacy.markdown import conversation_markdown
from projects.export import answer_sources


def export_filename(conversation: Conversation, extension: str) -> str:
    """``chat-<title slug>-<first 8 of the id>-<YYYYMMDD>.<extension>`` (ASCII: a safe
    Content-Disposition name; "untitled" for a conversation without a title)."""
    title = slugify(conversation.title)[:60].strip("-") or "untitled"
    stamp = timezone.now().strftime("%Y%m%d")
    return f"chat-{title}-{str(conversation.pk)[:8]}-{stamp}.{extension}"


def _db(conversation: Conversation) -> str:
    return conversation._state.db or "default"  # the region database it was read from


def conversation_export_markdown(*, conversation: Conversation) -> str:
    """The Markdown of ``conversation``'s selected path (privacy/markdown.py), with the names of
    the files sent with each message."""
    db = _db(conversation)
    turns = [t for t, _ in conversation_turns(db, conversation)]
    names: dict = defaultdict(list)
    for turn_id, name in (
        Attachment.objects.using(db)
        .filter(conversation_id=conversation.pk, turn_id__isnull=False)
        .order_by("created_at")
        .values_list("turn_id", "name")
    ):
        names[turn_id].append(name)
    return conversation_markdown(
        conversation, turns, attachment_names=names, json_name=export_filename(conversation, "json")
    )


def conversation_export_json(*, conversation: Conversation) -> str:
    """The JSON document of ``conversation``'s whole tree: ``{"format", "version", "kind":
    "conversation", "scope": "tree", "exported_at", "conversation": {...}}`` (the conversation
    as privacy/export_sections.py ``conversation_json`` writes it, share links left out: a link
    is a credential), indented, UTF-8 text."""
    db = _db(conversation)
    attachments = list(
        Attachment.objects.using(db).filter(conversation_id=conversation.pk).defer("text").order_by("created_at")
    )
    ratings = list(Feedback.objects.using(db).filter(conversation_id=conversation.pk).order_by("created_at"))
    item = conversation_json(
        conversation, conversation_turns(db, conversation), attachments=attachments, ratings=ratings,
        sources=answer_sources(db, conversation),
    )  # fmt: skip
    del item["markdown_file"], item["share_links"]
    document = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "conversation",
        "scope": "tree",
        "exported_at": timezone.now(),
        "conversation": item,
    }
    return json.dumps(document, cls=ExportEncoder, ensure_ascii=False, indent=2) + "\n"
