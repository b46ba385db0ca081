"""Writes for accounts: API keys."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiKey, Tier, User

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


# --- The service credential of background jobs ------------------------------------------------

SERVICE_KEY_NAME = "background jobs (derived from SECRET_KEY)"


def _service_key_parts() -> tuple[str, str]:
    """(prefix, secret) of the derived service key: HMAC-SHA256 of fixed labels under
    ``settings.SECRET_KEY``, so every process of a deployment (server, Celery workers) computes
    the same key without storing or passing it around, and it changes with the secret key."""
    secret_key = settings.SECRET_KEY.encode()
    prefix = hmac.new(secret_key, b"chatsite.service-api-key.prefix", hashlib.sha256).hexdigest()
    secret = hmac.new(secret_key, b"chatsite.service-api-key.secret", hashlib.sha256).digest()
    return prefix[: PREFIX_BYTES * 2], base64.urlsafe_b64encode(secret).rstrip(b"=").decode()


def service_user() -> User:
    """The service user background jobs act as (``settings.CHAT_SERVICE_USERNAME``), created on
    first use: enterprise tier, no usable password (it cannot sign in). Its name contains a
    colon, which the sign-up form refuses, so no person can take it."""
    user, created = User.objects.get_or_create(
        username=settings.CHAT_SERVICE_USERNAME, defaults={"tier": Tier.ENTERPRISE}
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def user_is_service(user: User) -> bool:
    """Whether ``user`` is the service user (jobs draw on no user's rate limits)."""
    return getattr(user, "username", None) == settings.CHAT_SERVICE_USERNAME


def service_api_key() -> str:
    """The raw bearer key background jobs send to this deployment's ``/v1`` endpoints
    (DESIGN.md, "How background jobs reach the model").

    ``settings.CHAT_SERVICE_API_KEY`` if set (e.g. a key of a remote pool); otherwise the key
    derived from ``SECRET_KEY`` (:func:`_service_key_parts`), whose row (hashed like every key,
    owned by :func:`service_user`) is created on first use; concurrent first uses are safe.
    Revoking that row in the admin stops the jobs' access until SECRET_KEY changes.
    """
    if settings.CHAT_SERVICE_API_KEY:
        return settings.CHAT_SERVICE_API_KEY
    prefix, secret = _service_key_parts()
    if not ApiKey.objects.filter(prefix=prefix).exists():
        try:
            with transaction.atomic():
                ApiKey.objects.create(
                    user=service_user(), name=SERVICE_KEY_NAME, prefix=prefix, key_hash=_hash(secret)
                )
        except IntegrityError:
            pass  # another process registered it at the same moment
    return f"{KEY_PREFIX}{prefix}.{secret}"
