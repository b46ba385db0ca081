"""Share-link tokens that name the region database their link lives in.

A token is ``TTT`` + ``R``: ``TTT`` the region's 12-bit tag in three lowercase hex digits (the
tag conversation ids carry: ``core.regions.region_tag``, the first 12 bits of SHA-256
of the region's name, the same on every server), ``R`` 32 URL-safe base64 characters from
``secrets.token_urlsafe(24)``, i.e. 192 bits from the OS's CSPRNG. 192 > 128 bits, so guessing
a live link is out of reach however many links exist (the tag adds no secrecy and needs none).

Why a tag and not a lookup: the shared page is read by anonymous viewers, who have nothing but
the token. The tag sends the query straight to one region's database, with no global directory
of links (one more cross-region write per share) and no asking every region in turn.
"""

from __future__ import annotations

import re
import secrets

from django.conf import settings

from core import regions

RANDOM_BYTES = 24  # 192 bits of randomness per token
TOKEN_RE = re.compile(r"[0-9a-f]{3}[A-Za-z0-9_-]{32}")


def token_new(region: str) -> str:
    """A fresh, unguessable token for a link stored in ``region``'s database (35 characters)."""
    return f"{regions.region_tag(region):03x}{secrets.token_urlsafe(RANDOM_BYTES)}"


def region_of_token(token: str) -> str | None:
    """The region a token names, or None if ``token`` is not shaped like one of ours or its tag
    names no region of ``settings.CHAT_REGIONS``."""
    if not isinstance(token, str) or not TOKEN_RE.fullmatch(token):
        return None
    tag = int(token[:3], 16)
    for region in settings.CHAT_REGIONS:
        if regions.region_tag(region) == tag:
            return region
    return None


def db_for_token(token: str) -> str | None:
    """The primary alias holding the link ``token`` names, or None when no database here can
    hold it (malformed token, unknown region, or a region without a database here): the
    caller answers 404 without a query."""
    region = region_of_token(token)
    if region is None:
        return None
    try:
        return regions.db_for_region(region)
    except regions.RegionUnavailable:
        return None
