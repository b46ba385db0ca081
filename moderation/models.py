"""Moderation keeps no table of its own: verdicts are stored on the turns they judged
(``Turn.moderation_verdict``, moderation/verdicts.py ``Verdict.as_json``). This proxy is how the
admin lists them (moderation/admin.py)."""

from __future__ import annotations

from conversations.models import Turn


class ModeratedTurn(Turn):
    """A turn with a moderation verdict (flagged or clean): the admin's list of verdicts.

    A proxy (no table): its rows are turns, in their conversation's region database. The app
    label is ``moderation``, which is not in ``settings.CHAT_REGIONAL_APPS``, so every query of
    it names its database explicitly (``conversations.admin.RegionalAdmin``) and loads the
    conversation in the same query (``select_related``)."""

    class Meta:
        proxy = True
        verbose_name = "moderated turn"
        verbose_name_plural = "moderated turns"
