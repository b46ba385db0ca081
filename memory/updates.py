"""Memory changes asked for in a chat, shown as "Memory updated" with Undo (issue 28 part 3).

:func:`memory_commands_apply` runs when a user's message is stored (conversations/submit.py),
before its answer starts: the message's commands (memory/commands.py) are applied at once -
"remember that I ..." stores a grounded fact (a newer fact in a single-valued slot, such as
where they live or their name, replaces the older), "forget that ..." deletes the facts that
contain all its words, "call me X" sets how to address the user - and one
:class:`memory.models.MemoryUpdate` records what changed, for the chat's notice and its Undo
(:func:`memory_update_undo`, which restores exactly the facts removed and deletes the ones
added). All in the user's home region's database, in one transaction.
"""

from __future__ import annotations

from uuid import UUID

from django.utils import timezone

from core import user_regions
from inference.embeddings import embed
from memory.blocks import memory_block_touch
from memory.commands import commands_parse, forget_words, remembered_fact
from memory.models import MemoryUpdate, UserMemory
from memory.selectors import memory_enabled_for
from memory.services import FactIn, fact_snapshot, memory_facts_store
from memory.statements import fact_words


def _forget(user, clause: str) -> list[dict]:
    """Delete the user's facts "forget <clause>" names; returns their snapshots."""
    words = forget_words(clause)
    facts = list(UserMemory.objects.filter(user=user).defer("embedding"))
    if words is None:
        doomed = facts
    elif words == {"<name>"}:
        doomed = [f for f in facts if f.slot in ("name", "address")]
    elif not words:
        doomed = []
    else:
        doomed = [f for f in facts if words <= fact_words(f.text)]
    if doomed:
        UserMemory.objects.filter(user=user, pk__in=[f.pk for f in doomed]).delete()
        memory_block_touch(user_id=user.pk)
    return [fact_snapshot(f) for f in doomed]


@user_regions.atomic_for_user
def memory_commands_apply(*, user, conversation_id: UUID, turn) -> MemoryUpdate | None:
    """Apply the memory commands in ``turn`` (a stored user Turn of ``user``'s conversation
    ``conversation_id``); returns the MemoryUpdate recorded, or None when the message has no
    command, memory is off for the user, or nothing changed (a fact already known, a "forget"
    that matched nothing). Raises ValidationError when the user is at their fact cap."""
    commands = commands_parse(turn.content or "")
    if not commands or not memory_enabled_for(user):
        return None
    added: list[UserMemory] = []
    removed: list[dict] = []
    lines: list[str] = []
    for command in commands:
        if command.kind == "forget":
            gone = _forget(user, command.clause)
            removed += gone
            lines += [f"Forgot: {g['text']}" for g in gone]
            continue
        if command.kind == "call_me":
            text, slot = f"The user wants to be called {command.clause.split()[0]}.", "address"
        else:
            text, slot = remembered_fact(command.clause)
        change = memory_facts_store(
            user=user, source=UserMemory.Source.EXPLICIT, source_conversation_id=conversation_id,
            facts=[FactIn(text, slot, turn.turn_id, command.start, command.end, command.clause)],
        )  # fmt: skip
        added += change.added
        removed += change.removed
        lines += [f"Remembered: {f.text}" for f in change.added]
        lines += [f"Replaced: {r['text']}" for r in change.removed]
    if not added and not removed:
        return None
    return MemoryUpdate.objects.create(
        user=user, conversation_id=conversation_id, turn_id=turn.turn_id,
        added=[str(f.fact_id) for f in added], removed=removed, summary=" ".join(lines)[:400],
    )  # fmt: skip


@user_regions.atomic_for_user
def memory_update_undo(*, user, update_id: UUID) -> MemoryUpdate:
    """Undo one of ``user``'s memory updates: delete the facts it added and put back the facts
    it removed (same text, slot, source and span; embedded again). Idempotent: an update already
    undone is returned as it is. Raises MemoryUpdate.DoesNotExist when it is not theirs."""
    update = MemoryUpdate.objects.select_for_update().get(user=user, pk=update_id)
    if update.undone_at is not None:
        return update
    UserMemory.objects.filter(user=user, pk__in=update.added).delete()
    if update.removed:
        vectors = embed([r["text"] for r in update.removed])
        UserMemory.objects.bulk_create(
            UserMemory(
                user=user, embedding=vector,
                **{k: v for k, v in snapshot.items() if k != "fact_id"},
            )
            for snapshot, vector in zip(update.removed, vectors, strict=True)
        )  # fmt: skip
    memory_block_touch(user_id=user.pk)
    update.undone_at = timezone.now()
    update.save(update_fields=["undone_at"])
    return update


@user_regions.for_user
def memory_updates_for_turns(*, user, turn_ids) -> dict:
    """``user``'s memory updates asked for by the given user turns, by turn id (one query)."""
    return {u.turn_id: u for u in MemoryUpdate.objects.filter(user=user, turn_id__in=list(turn_ids))}
