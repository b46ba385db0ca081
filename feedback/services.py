"""Writes of feedback: rating an answer (thumbs up / down, optional comment)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, router, transaction
from django.utils import timezone

from accounts.models import User
from conversations.models import Conversation, Turn
from conversations.selectors import conversation_zero_retention
from core import regions
from feedback.metrics import feedback_count
from feedback.models import Feedback

# Longest comment, in characters: room for a paragraph on what was wrong, not for pasting
# whole documents into a table every operator reads.
COMMENT_MAX_CHARS = 2000


def rating_clean(rating: object) -> str:
    """``"up"`` or ``"down"``. Raises ValidationError (code ``rating``) for anything else."""
    if rating not in Feedback.Rating.values:
        raise ValidationError(
            'A rating is "up" (a good answer) or "down" (a bad one).', code="rating"
        )
    return str(rating)


def comment_clean(comment: str | None) -> str:
    """The comment with surrounding whitespace removed ("" for none). Raises ValidationError
    (code ``too_long`` over ``COMMENT_MAX_CHARS`` characters, ``nul`` for U+0000, which
    PostgreSQL text cannot hold)."""
    text = (comment or "").strip()
    if "\x00" in text:
        raise ValidationError(
            "The comment contains a NUL character (U+0000); remove it and send again.", code="nul"
        )
    if len(text) > COMMENT_MAX_CHARS:
        raise ValidationError(
            f"The comment is {len(text):,} characters long; the limit is {COMMENT_MAX_CHARS:,}. "
            "Shorten it and send again.",
            code="too_long",
        )
    return text


@transaction.atomic
@regions.atomic
def feedback_set(
    *, conversation: Conversation, answer: Turn, user: User, rating: str, comment: str = ""
) -> Feedback:
    """Store ``user``'s rating of ``answer`` (an assistant turn of ``conversation``, stored or
    held awaiting write-back) in the conversation's region database and return it.

    One row per user and answer: rating again replaces the rating *and* the comment (an empty
    ``comment`` clears it). The caller checks that ``user`` may see ``conversation``. The
    answer's pool and model version are copied onto the row. ``chat_feedback_total`` counts
    the rating once committed, if it is new or changed (feedback/metrics.py).

    Raises ValidationError: code ``not_an_answer`` if ``answer`` is not an assistant turn,
    ``rating`` / ``too_long`` / ``nul`` for a bad rating or comment (:func:`rating_clean`,
    :func:`comment_clean`), ``zero_retention`` for a comment on a conversation of a
    zero-retention organisation (no text of theirs is stored; the rating alone is).
    """
    if answer.role != Turn.Role.ASSISTANT:
        raise ValidationError(
            "Only answers can be rated: that turn is a message, not the assistant's answer.",
            code="not_an_answer",
        )
    rating = rating_clean(rating)
    comment = comment_clean(comment)
    if comment and conversation_zero_retention(conversation):
        raise ValidationError(
            "Your organisation keeps no conversation text, so a comment cannot be stored; "
            "send the rating without one.",
            code="zero_retention",
        )
    now = timezone.now()
    fields = {
        "rating": rating, "comment": comment, "pool": answer.pool,
        "model_version": answer.model_version, "updated_at": now,
    }  # fmt: skip
    mine = Feedback.objects.select_for_update().filter(turn_id=answer.turn_id, user_id=user.pk)
    row = mine.first()
    previous = row.rating if row is not None else None
    if row is None:
        try:
            with transaction.atomic(using=router.db_for_write(Feedback), savepoint=True):
                row = Feedback.objects.create(
                    conversation=conversation, turn_id=answer.turn_id, user_id=user.pk,
                    created_at=now, **fields,
                )  # fmt: skip
        except IntegrityError:  # the same user's rating arrived at the same moment: replace it
            row = mine.get()
            previous = row.rating
    if previous is not None:
        for name, value in fields.items():
            setattr(row, name, value)
        row.save(update_fields=list(fields))
    if rating != previous:
        labels = {"pool": answer.pool, "model_version": answer.model_version, "rating": rating}
        transaction.on_commit(lambda: feedback_count(**labels))
    return row
