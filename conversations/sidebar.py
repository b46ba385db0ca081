"""The sidebar's conversation list: date groups, pinned chats first, and search snippets.

Pure functions (no database, no request): the view passes the conversations, the moment
``now`` and the user's time zone in, so the boundaries test without a clock or a browser.

Groups (issue 29 item 8, after ChatGPT's sidebar), in this order:

1. **Pinned**: every chat with ``pinned_at``, the latest pinned first, whatever its date;
2. **Today**, **Yesterday**: by the calendar day of ``last_turn_at`` in the user's time zone
   (a chat active at 23:30 in Auckland is "Today" there though it is yesterday in UTC);
3. **Previous 7 days**: 2 to 7 calendar days ago; **Previous 30 days**: 8 to 30 days ago;
4. then one group per calendar month, newest first, named "November 2026".

A chat dated after ``now`` (a clock ahead on another server) counts as today. Within a group
the input order is kept (the selector's: most recently active first). Empty groups are left
out.

The user's time zone is the IANA name the page's script stores in the ``tz`` cookie
(static/chat/layout.js, from ``Intl.DateTimeFormat().resolvedOptions().timeZone``); without one
(the first page a browser loads, or a name this server does not know), ``settings.TIME_ZONE``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from conversations.models import Conversation

# The cookie static/chat/layout.js writes the browser's IANA time zone name into.
TIME_ZONE_COOKIE = "tz"
# IANA names are ASCII letters, digits and "/_+-" (e.g. "America/Argentina/Buenos_Aires",
# "Etc/GMT+5"); the tz database's longest is under 40 characters.
_TIME_ZONE_NAME = re.compile(r"[A-Za-z0-9/_+\-]{1,64}")

MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
# Fixed names (not the server's locale): the page is in English.

# The markers put around each match in a search headline (search_selectors.search_snippets), outside
# text as typed (control characters), turned into <mark> after escaping; a turn that holds one
# at worst marks a stretch of its own escaped text.
MATCH_START = "\x02"
MATCH_STOP = "\x03"


@dataclass(frozen=True)
class SidebarGroup:
    """One heading of the sidebar and its chats. ``key``: "pinned", "today", "yesterday",
    "previous-7-days", "previous-30-days" or "YYYY-MM"; ``label``: the heading shown."""

    key: str
    label: str
    conversations: tuple[Conversation, ...]


def time_zone_from(name: str | None, default: str) -> tzinfo:
    """The time zone named ``name`` (an IANA name, e.g. from the ``tz`` cookie), or ``default``
    (``settings.TIME_ZONE``) when it is missing, malformed or unknown here. Never raises for a
    bad ``name``; raises ZoneInfoNotFoundError only for a bad ``default``."""
    if name and _TIME_ZONE_NAME.fullmatch(name) and ".." not in name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return ZoneInfo(default)


def _day_group(day: date, today: date) -> tuple[str, str]:
    days = (today - day).days
    if days <= 0:
        return "today", "Today"
    if days == 1:
        return "yesterday", "Yesterday"
    if days <= 7:
        return "previous-7-days", "Previous 7 days"
    if days <= 30:
        return "previous-30-days", "Previous 30 days"
    return f"{day.year:04d}-{day.month:02d}", f"{MONTHS[day.month - 1]} {day.year}"


_RELATIVE_ORDER = ("pinned", "today", "yesterday", "previous-7-days", "previous-30-days")


def sidebar_groups(
    conversations: Iterable[Conversation], *, now: datetime, tz: tzinfo
) -> list[SidebarGroup]:
    """The sidebar's groups of ``conversations`` (see the module docstring for the rule).

    ``now``: an aware datetime (``django.utils.timezone.now()``); ``tz``: the user's time zone
    (:func:`time_zone_from`). Each conversation needs ``last_turn_at`` (aware) and
    ``pinned_at`` (aware or None). Returns the non-empty groups in display order; every
    conversation is in exactly one. Raises ValueError for a naive ``now``."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    today = now.astimezone(tz).date()
    labels: dict[str, str] = {"pinned": "Pinned"}
    members: dict[str, list[Conversation]] = {}
    pinned: list[Conversation] = []
    for conversation in conversations:
        if conversation.pinned_at is not None:
            pinned.append(conversation)
            continue
        key, label = _day_group(conversation.last_turn_at.astimezone(tz).date(), today)
        labels[key] = label
        members.setdefault(key, []).append(conversation)
    if pinned:
        members["pinned"] = sorted(pinned, key=lambda c: c.pinned_at, reverse=True)
    relative = [k for k in _RELATIVE_ORDER if k in members]
    months = sorted((k for k in members if k not in _RELATIVE_ORDER), reverse=True)
    return [SidebarGroup(key=k, label=labels[k], conversations=tuple(members[k])) for k in relative + months]


def snippet_html(marked: str) -> SafeString:
    """A search snippet as HTML: ``marked`` (text with each match between MATCH_START and
    MATCH_STOP, e.g. PostgreSQL ``ts_headline`` output) with everything escaped, each match in
    ``<mark>``, and stray or unpaired markers dropped. The only tags in the result are the
    ``<mark>`` pairs this function writes (never the user's text as HTML)."""
    out = []
    for i, part in enumerate(escape(marked).split(MATCH_START)):
        if i == 0:
            out.append(part.replace(MATCH_STOP, ""))
            continue
        inside, stop, after = part.partition(MATCH_STOP)
        if not stop:  # unpaired: its text, unmarked
            out.append(inside)
            continue
        out.append(f"<mark>{inside}</mark>" if inside else "")
        out.append(after.replace(MATCH_STOP, ""))
    return mark_safe("".join(out))  # noqa: S308 - escaped above; only our <mark> tags added


def substring_snippet(text: str, needle: str, *, width: int = 80) -> SafeString:
    """A snippet of ``text`` around the first case-insensitive occurrence of ``needle``, at most
    about ``width`` characters (an ellipsis where cut), the match in ``<mark>``, all escaped
    (:func:`snippet_html`). Without an occurrence: the start of ``text``, unmarked."""
    text = " ".join(text.replace(MATCH_START, "").replace(MATCH_STOP, "").split())
    at = text.lower().find(needle.lower()) if needle else -1
    if at < 0:
        cut = text[:width]
        return snippet_html(cut + ("…" if len(text) > width else ""))
    start = 0 if len(text) <= width else max(0, at - (width - len(needle)) // 2)
    end = min(len(text), max(at + len(needle), start + width))
    marked = (
        ("…" if start > 0 else "")
        + text[start:at] + MATCH_START + text[at:at + len(needle)] + MATCH_STOP + text[at + len(needle):end]
        + ("…" if end < len(text) else "")
    )  # fmt: skip
    return snippet_html(marked)
