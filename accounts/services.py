"""Writes for accounts: API keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiKey, User

KEY_PREFIX = "sk-"  # what a key looks like: sk-<prefix>.<secret>
PREFIX_BYTES = 6  # 12 hex chars: public id of the key
SECRET_BYTES = 32  # 256 bits of secret


@dataclass(frozen=True)
class IssuedKey:
    """A new key: ``raw`` is shown to the user once and never stored."""

    api_key: ApiKey
    raw: str


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def api_key_create(*, user: User, name: str) -> IssuedKey:
    """Issue a key for ``user``. Raises ValidationError for a blank or over-long name."""
    name = " ".join((name or "").replace("\x00", "").split())
    if not name:
        raise ValidationError("Give the key a name, e.g. the script that will use it.", code="empty")
    if len(name) > 100:
        raise ValidationError("A key name can be at most 100 characters.", code="too_long")
    prefix = secrets.token_hex(PREFIX_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    api_key = ApiKey.objects.create(user=user, name=name, prefix=prefix, key_hash=_hash(secret))
    return IssuedKey(api_key=api_key, raw=f"{KEY_PREFIX}{prefix}.{secret}")


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke a key (idempotent); it stops working at once."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


def api_key_authenticate(raw: str) -> User | None:
    """The active user a raw key belongs to, or None for a malformed, unknown or revoked key."""
    if not raw or not raw.startswith(KEY_PREFIX) or "." not in raw:
        return None
    prefix, _, secret = raw[len(KEY_PREFIX):].partition(".")
    api_key = ApiKey.objects.select_related("user").filter(prefix=prefix).first()
    if api_key is None or api_key.revoked_at is not None or not api_key.user.is_active:
        return None
    if not hmac.compare_digest(api_key.key_hash, _hash(secret)):
        return None
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=timezone.now())
    return api_key.user
