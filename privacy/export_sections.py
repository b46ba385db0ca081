"""The sections of a data export (privacy/export.py builds the archive from them), read in
batches of ``BATCH`` so an export never holds a whole account in memory.

- Conversations: :func:`conversation_batches` (keyset on ``(created_at, conversation_id)``, every
  region's database), :func:`conversation_turns` (stored turns and answers held for write-back),
  :func:`conversation_json` (a conversation as data.json holds it, with the ``*_json`` shapes of
  its turns, attachments, share links, ratings and withdrawn answers) and
  :func:`conversation_items`, which also writes each conversation's Markdown and files into the
  archive as it goes. Shared with the one-conversation download (privacy/conversation_export.py)
  and the training export (privacy/training.py).
- Usage records: :func:`usage_items`, the person's ledger rows from every database that holds
  some.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from django.db.models import Q
from django.utils.text import get_valid_filename, slugify

from accounts.models import Organisation, User
from attachments.models import Attachment
from attachments.services import attachment_storage
from conversations.models import Conversation, Turn
from conversations.selectors import Tree, held_turns, tree_build, turn_values
from core import regions
from feedback.models import Feedback
from projects.export import answer_sources
from moderation.models import WithdrawnAnswer
from privacy.archive import ArchiveBuilder
from privacy.markdown import conversation_markdown
from sharing.models import ShareLink
from usage.models import UsageRecord
from usage.selectors import ledger_dbs


BATCH = 200  # conversations (and usage records) read per query


# --- rows as JSON ---------------------------------------------------------------------------


def turn_json(turn: Turn, *, held: bool = False, tree: Tree | None = None) -> dict:
    """Every field of a turn (conversations/turndata.py, so a new field is exported without an
    edit here) but its conversation's id (turns are listed under their conversation), with the
    links named ``reply_to`` / ``replaces`` / ``parent`` / ``continues``, and ``held``: an answer
    still waiting in Redis to be written to the database. ``tree``: the conversation's turn tree
    (conversations/versions.py), which gives a user turn written before branches existed its
    derived ``parent``. Values are Python's (UUID, datetime, Decimal) for the encoder."""
    data = turn_values(turn)
    del data["conversation_id"]
    data["reply_to"], data["replaces"] = data.pop("reply_to_id"), data.pop("replaces_id")
    data["continues"], data["parent"] = data.pop("continues_id"), data.pop("parent_id")
    if tree is not None and turn.role == Turn.Role.USER:
        data["parent"] = tree.parent_of(turn)
    return {**data, "held": held}


def attachment_json(attachment: Attachment, file: str | None) -> dict:
    return {
        "attachment_id": attachment.attachment_id,
        "turn_id": attachment.turn_id,
        "name": attachment.name,
        "kind": attachment.kind,
        "size": attachment.size,
        "sha256": attachment.sha256,
        "pages": attachment.pages,
        "tokens": attachment.tokens,
        "created_at": attachment.created_at,
        "file": file,
    }


def share_link_json(link: ShareLink) -> dict:
    return {
        "link_id": link.link_id,
        "token_start": f"{link.token[:7]}…",
        "title": link.title,
        "through_at": link.through_at,
        "through_turn_id": link.through_turn_id,
        "created_at": link.created_at,
        "updated_at": link.updated_at,
        "revoked_at": link.revoked_at,
    }


def feedback_json(feedback: Feedback) -> dict:
    return {
        "feedback_id": feedback.feedback_id,
        "turn_id": feedback.turn_id,
        "rating": feedback.rating,
        "comment": feedback.comment,
        "pool": feedback.pool,
        "model_version": feedback.model_version,
        "created_at": feedback.created_at,
        "updated_at": feedback.updated_at,
    }


def withdrawn_json(answer: WithdrawnAnswer) -> dict:
    return {
        "turn_id": answer.turn_id,
        "text": answer.text,
        "window": answer.window,
        "categories": answer.categories,
        "verdict": answer.verdict,
        "created_at": answer.created_at,
        "reviewed_as_fine": answer.fine,
        "reviewed_at": answer.reviewed_at,
    }


# --- conversations --------------------------------------------------------------------------


def conversation_batches(
    *, dbs: Iterable[str] | None = None, **filters
) -> Iterator[tuple[str, list[Conversation]]]:
    """(primary alias, up to BATCH conversations) matching ``filters`` (e.g. ``owner_id=``,
    ``org_id=``), every region's database in turn (only ``dbs`` when given), each oldest first
    (keyset on ``(created_at, conversation_id)``)."""
    for db in regions.region_dbs() if dbs is None else dbs:
        query = (
            Conversation.objects.using(db)
            .filter(**filters)
            .order_by("created_at", "conversation_id")
        )
        after = None
        while True:
            page = query
            if after is not None:
                page = page.filter(
                    Q(created_at__gt=after[0])
                    | Q(created_at=after[0], conversation_id__gt=after[1])
                )
            batch = list(page[:BATCH])
            if batch:
                yield db, batch
            if len(batch) < BATCH:
                break
            after = (batch[-1].created_at, batch[-1].conversation_id)


def _grouped(rows: Iterable, key: str) -> dict:
    groups: dict = defaultdict(list)
    for row in rows:
        groups[getattr(row, key)].append(row)
    return groups


def conversation_turns(db: str, conversation: Conversation) -> list[tuple[Turn, bool]]:
    """(turn, held) for every turn of ``conversation``: the stored ones from database ``db``
    and answers still held in Redis awaiting write-back, oldest first."""
    stored = list(
        Turn.objects.using(db)
        .filter(conversation_id=conversation.pk)
        .order_by("created_at", "turn_id")
    )
    known = {t.turn_id for t in stored}
    pending = [t for t in held_turns(conversation.pk) if t.turn_id not in known]
    pairs = [(t, False) for t in stored] + [(t, True) for t in pending]
    pairs.sort(key=lambda pair: (pair[0].created_at, str(pair[0].turn_id)))
    return pairs


def _markdown_name(conversation: Conversation) -> str:
    title = slugify(conversation.title)[:60].strip("-") or "untitled"
    return f"conversations/{conversation.created_at:%Y-%m-%d}-{title}-{str(conversation.pk)[:8]}.md"


def _attachment_name(attachment: Attachment) -> str:
    name = get_valid_filename(attachment.name)[:120] or "file"
    return f"attachments/{attachment.conversation_id}/{attachment.attachment_id}-{name}"


def conversation_items(
    builder: ArchiveBuilder,
    *,
    people: dict[int, str] | None = None,
    orgs: dict[int, str] | None = None,
    **filters,
) -> Iterator[dict]:
    """The JSON of each conversation matching ``filters`` (see :func:`conversation_batches`),
    writing its Markdown file and attachment files into the archive as it goes. ``people``:
    user id -> username, to name each conversation's owner (organisation exports; filled in as
    needed); ``orgs``: organisation id -> slug."""
    orgs = {} if orgs is None else orgs
    for db, batch in conversation_batches(**filters):
        ids = [c.pk for c in batch]
        attachments = _grouped(
            Attachment.objects.using(db).filter(conversation_id__in=ids).defer("text"),
            "conversation_id",
        )
        links = _grouped(
            ShareLink.objects.using(db).filter(conversation_id__in=ids), "conversation_id"
        )
        ratings = _grouped(
            Feedback.objects.using(db).filter(conversation_id__in=ids), "conversation_id"
        )
        withdrawn = _grouped(
            WithdrawnAnswer.objects.using(db).filter(conversation_id__in=ids), "conversation_id"
        )
        missing_orgs = {c.org_id for c in batch if c.org_id and c.org_id not in orgs}
        orgs.update(Organisation.objects.filter(pk__in=missing_orgs).values_list("pk", "slug"))
        if people is not None:
            missing = {c.owner_id for c in batch if c.owner_id not in people}
            people.update(User.objects.filter(pk__in=missing).values_list("pk", "username"))
        for conversation in batch:
            yield _conversation_item(
                builder,
                attachment_storage(conversation_id=conversation.pk),
                db,
                conversation,
                attachments=attachments.get(conversation.pk, []),
                links=links.get(conversation.pk, []),
                ratings=ratings.get(conversation.pk, []),
                withdrawn=withdrawn.get(conversation.pk, []),
                people=people,
                orgs=orgs,
            )


def _conversation_item(
    builder, storage, db, conversation, *, attachments, links, ratings, withdrawn, people, orgs
) -> dict:
    turns = conversation_turns(db, conversation)
    files = {
        a.attachment_id: builder.add_stored_file(_attachment_name(a), storage, a.storage_name)
        for a in attachments
    }
    names_by_turn: dict = defaultdict(list)
    for a in attachments:
        if a.turn_id:
            names_by_turn[a.turn_id].append(a.name)
    owner = (
        people.get(conversation.owner_id, f"deleted account #{conversation.owner_id}")
        if people is not None
        else ""
    )
    org = orgs.get(conversation.org_id, "") if conversation.org_id else ""
    markdown = builder.add_text(
        _markdown_name(conversation),
        conversation_markdown(
            conversation,
            [t for t, _ in turns],
            attachment_names=names_by_turn,
            owner_label=owner,
            org_label=org,
        ),
    )
    item = conversation_json(
        conversation, turns, org=org, attachments=attachments, links=links, ratings=ratings,
        withdrawn=withdrawn, files=files, markdown_file=markdown, sources=answer_sources(db, conversation),
    )  # fmt: skip
    if people is not None:
        item = {"owner": owner, **item}
    return item


def conversation_json(
    conversation: Conversation,
    turns: list[tuple[Turn, bool]],
    *,
    org: str = "",
    attachments: Iterable[Attachment] = (),
    links: Iterable[ShareLink] = (),
    ratings: Iterable[Feedback] = (),
    withdrawn: Iterable[WithdrawnAnswer] = (),
    files: dict | None = None,
    markdown_file: str | None = None,
    sources: dict | None = None,
) -> dict:
    """A conversation as data.json holds it: its fields, every turn (:func:`conversation_turns`'
    (turn, held) pairs; the whole tree, each user turn with its ``parent``), ``selected_path``
    (the ids of the turns of the branch the chat page shows, each question with the answer
    version it shows, oldest first), its attachments
    (``files``: attachment id -> the file's name in the archive, None when not in one), share
    links, ratings and withdrawn answers (the text the output gate stopped, kept for review:
    issue 28). ``sources``: answer turn id -> its sources in a project chat
    (projects/export.py ``answer_sources``), given on each of those answers as ``sources``.
    Values are Python's, for the encoder."""
    files = files or {}
    sources = sources or {}
    tree = tree_build(t for t, _ in turns)
    path = []
    for question in tree.path(conversation.branch_choices):
        path.append(question.turn_id)
        shown = tree.position(question, conversation.answer_choices).answer  # the version chosen
        if shown is not None:
            path.append(shown.turn_id)
    return {
        "conversation_id": conversation.pk,
        "title": conversation.title,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "region": conversation.region,
        "organisation": org or None,
        "project_id": conversation.project_id,
        "shared_with_org": conversation.shared_with_org,
        "created_at": conversation.created_at,
        "last_turn_at": conversation.last_turn_at,
        "summary": conversation.summary,
        "summary_through": conversation.summary_through,
        "markdown_file": markdown_file,
        "turns": [_with_sources(turn_json(t, held=held, tree=tree), sources.get(t.turn_id)) for t, held in turns],
        "selected_path": path,
        "attachments": [attachment_json(a, files.get(a.attachment_id)) for a in attachments],
        "share_links": [share_link_json(link) for link in links],
        "feedback": [feedback_json(f) for f in ratings],
        "withdrawn_answers": [withdrawn_json(w) for w in withdrawn],
    }


def _with_sources(item: dict, sources: list[dict] | None) -> dict:
    """A turn's JSON with its sources (an answer in a project chat that had any)."""
    return {**item, "sources": sources} if sources else item


# --- usage records ------------------------------------------------------------------------


def usage_items(user: User) -> Iterator[dict]:
    """The user's ledger rows, from every database that holds some (usage/models.py)."""
    orgs: dict[int, str] = {}
    for db in ledger_dbs():
        yield from _usage_items_in(db, user, orgs)


def _usage_items_in(db: str, user: User, orgs: dict[int, str]) -> Iterator[dict]:
    after = 0
    while True:
        batch = list(
            UsageRecord.objects.using(db)
            .filter(user_id=user.pk, id__gt=after)
            .order_by("id")[:BATCH]
        )
        orgs.update(
            Organisation.objects.filter(
                pk__in={r.org_id for r in batch if r.org_id} - set(orgs)
            ).values_list("pk", "slug")
        )
        for r in batch:
            yield {
                "created_at": r.created_at,
                "pool": r.pool,
                "model_version": r.model_version,
                "tier": r.tier,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "completion_tokens": r.completion_tokens,
                "cost_usd": r.cost_usd,
                "status": r.status,
                "conversation_id": r.conversation_id,
                "turn_id": r.turn_id,
                "organisation": orgs.get(r.org_id),
            }
        if len(batch) < BATCH:
            return
        after = batch[-1].id
