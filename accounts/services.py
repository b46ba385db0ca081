"""Writes for accounts: API keys, signed-in sessions, password events, the colour scheme, the
training opt-out (and its audit entries, for a person's flag and an organisation's)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from importlib import import_module

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import throttle
from accounts.models import ApiKey, Organisation, Theme, Tier, User, UserSession
from audit.models import Action, AuditEntry
from audit.services import audit_record

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


# --- Signed-in sessions and password events (issue 10) -----------------------------------------


def _session_store(session_key: str | None = None):
    """A session of the configured engine (settings.SESSION_ENGINE), by key."""
    return import_module(settings.SESSION_ENGINE).SessionStore(session_key)


def session_is_alive(session_key: str) -> bool:
    """Whether the session store still holds an unexpired session ``session_key``."""
    store = _session_store(session_key)
    store.load()  # a missing or expired session leaves the store without a key
    return store.session_key is not None


@transaction.atomic
def user_session_record(
    *, user: User, session_key: str, ip: str | None, user_agent: str
) -> UserSession:
    """Record the session a sign-in just made (or refresh it), and drop the user's rows not seen
    for longer than a session lives (``settings.SESSION_COOKIE_AGE``, seconds)."""
    now = timezone.now()
    row, _ = UserSession.objects.update_or_create(
        session_key=session_key,
        defaults={"user": user, "ip": ip, "user_agent": user_agent, "last_seen_at": now},
    )
    stale_before = now - timedelta(seconds=settings.SESSION_COOKIE_AGE)
    UserSession.objects.filter(user=user, last_seen_at__lt=stale_before).delete()
    return row


def user_session_touch(*, user: User, session_key: str, ip: str | None, user_agent: str) -> None:
    """Refresh a session's last-seen time, address and user agent (accounts/middleware.py calls
    it at most once a minute per session). A signed-in session with no row yet (one from before
    sessions were recorded) gets one."""
    values = {"ip": ip, "user_agent": user_agent, "last_seen_at": timezone.now()}
    if not UserSession.objects.filter(session_key=session_key, user=user).update(**values):
        UserSession.objects.get_or_create(session_key=session_key, defaults={"user": user, **values})


def user_session_rekey(*, old_key: str | None, new_key: str | None) -> None:
    """Follow a session whose key was cycled (``update_session_auth_hash``) to its new key."""
    if old_key and new_key and old_key != new_key:
        UserSession.objects.filter(session_key=old_key).update(session_key=new_key)


def user_session_forget(*, session_key: str | None) -> None:
    """Drop the row of a session that signed out (the session store flushes the session)."""
    if session_key:
        UserSession.objects.filter(session_key=session_key).delete()


@transaction.atomic
def user_session_end(*, user_session: UserSession) -> None:
    """Sign one session out: delete it from the session store and from the list."""
    _session_store(user_session.session_key).delete()
    user_session.delete()


@transaction.atomic
def user_sessions_prune(*, user: User) -> int:
    """Drop the user's rows whose session has ended (expired, or deleted from the store, e.g.
    by ``clearsessions``); returns how many. Reads the store once per row (a user has few)."""
    gone = [
        row.pk
        for row in UserSession.objects.filter(user=user).only("pk", "session_key")
        if not session_is_alive(row.session_key)
    ]
    UserSession.objects.filter(pk__in=gone).delete()
    return len(gone)


@transaction.atomic
def user_sessions_end(*, user: User, keep_session_key: str | None = None) -> int:
    """Sign ``user`` out everywhere, except the session ``keep_session_key`` (None: all of them).

    Every listed session is deleted from the session store and the list, and
    ``User.session_salt`` gets a new random value, which changes the user's session auth hash:
    any session not listed (another store, a signed-cookie session, one made before sessions
    were recorded) fails Django's hash check on its next request and is flushed. The caller
    keeping its own session must then call ``update_session_auth_hash(request, user)`` (and
    :func:`user_session_rekey`, as that cycles the key). Returns the number of listed sessions
    ended. API keys are not touched: they are revoked on their own page.
    """
    user.session_salt = secrets.token_hex(16)
    user.save(update_fields=["session_salt"])
    rows = UserSession.objects.filter(user=user)
    if keep_session_key:
        rows = rows.exclude(session_key=keep_session_key)
    rows = list(rows)
    for row in rows:
        _session_store(row.session_key).delete()
    UserSession.objects.filter(pk__in=[row.pk for row in rows]).delete()
    return len(rows)


@transaction.atomic
def user_password_reset_completed(*, user: User) -> None:
    """After a person set a new password through a reset link mailed to ``user.email``: that
    address is verified (they read its mail), every session of the account ends, and its failed
    sign-ins are forgotten (the lockout message tells a locked-out person to reset)."""
    if user.email:
        user.verified_email = user.email
        user.save(update_fields=["verified_email"])
    user_sessions_end(user=user)
    username = user.get_username()
    transaction.on_commit(lambda: throttle.login_account_clear(username=username))


@transaction.atomic
def user_theme_set(*, user: User, theme: str) -> User:
    """Store the colour scheme every page of ``user`` is drawn in: ``system`` (follow the
    browser's prefers-color-scheme), ``light`` or ``dark``. Raises ValidationError for any other
    value."""
    if theme not in Theme.values:
        raise ValidationError(f"Unknown theme {theme!r}: choose one of {', '.join(Theme.values)}.")
    user.theme = theme
    user.save(update_fields=["theme"])
    return user


# The longest custom instructions (characters): ChatGPT's limit for each of its two boxes.
CUSTOM_INSTRUCTIONS_MAX_CHARS = 1500


@transaction.atomic
def user_custom_instructions_set(*, user: User, text: str) -> User:
    """Store ``user``'s custom instructions, applied to every chat of theirs from its next turn
    (after the site's prompt, before the memory block: inference/prompts.py system_message).
    Stripped; blank clears them. Raises ValidationError for over
    ``CUSTOM_INSTRUCTIONS_MAX_CHARS`` characters (code ``too_long``) or a NUL (code ``nul``)."""
    text = (text or "").replace("\r\n", "\n").strip()
    if "\x00" in text:
        raise ValidationError("Custom instructions cannot contain the NUL character.", code="nul")
    if len(text) > CUSTOM_INSTRUCTIONS_MAX_CHARS:
        raise ValidationError(
            f"Custom instructions can be at most {CUSTOM_INSTRUCTIONS_MAX_CHARS:,} characters "
            f"(these are {len(text):,}).",
            code="too_long",
        )
    user.custom_instructions = text
    user.save(update_fields=["custom_instructions"])
    return user


# --- Training opt-out (issue 20) ---------------------------------------------------------------


def training_opt_out_record(
    *, actor: User | int | None, subject: User | Organisation, old: bool, new: bool
) -> AuditEntry | None:
    """Audit one change of a training opt-out: ``User.training_opt_out`` (action
    ``account.training_opt_out``) or ``Organisation.not_for_training`` (``org.training_opt_out``,
    shown to the organisation's owners). ``actor``: who changed it (None: the system); the
    entry's ``created_at`` is when. Details ``{"flag": field name, "from": old, "to": new}``.
    Returns None, and writes nothing, when ``old == new``: a save that changes nothing is no
    change. Every writer of either flag calls this (:func:`user_training_opt_out_set`,
    workspaces/services.py ``organisation_policy_update``, the admin's ``save_model``) inside
    the transaction that writes the flag, so a change that rolls back leaves no entry."""
    old, new = bool(old), bool(new)
    if old == new:
        return None
    if isinstance(subject, Organisation):
        action, flag, org = Action.ORG_TRAINING_OPT_OUT, "not_for_training", subject
        target_type = "accounts.organisation"
    else:
        action, flag, org = Action.ACCOUNT_TRAINING_OPT_OUT, "training_opt_out", None
        target_type = "accounts.user"
    return audit_record(
        actor=actor, action=action, org=org, target_type=target_type, target_id=subject.pk,
        details={"flag": flag, "from": old, "to": new},
    )  # fmt: skip


@transaction.atomic
def user_training_opt_out_set(*, user: User, opt_out: bool, actor: User | None = None) -> bool:
    """Set ``user``'s training opt-out. From their next turn on, every turn of theirs (in any
    conversation, personal or an organisation's) is stored with ``training_eligible`` False
    while it is on (accounts/selectors.py ``turn_training_eligible``); turns already stored keep
    their tag. ``actor``: who made the change (None: the user themselves). The row is read under
    a lock, so two saves at once record two true changes or one change and a no-op. Writes an
    ``account.training_opt_out`` audit entry when the value changes, none otherwise. Returns
    whether it changed."""
    locked = User.objects.select_for_update().values_list("training_opt_out", flat=True)
    old = locked.get(pk=user.pk)
    new = bool(opt_out)
    user.training_opt_out = new
    if old == new:
        return False
    User.objects.filter(pk=user.pk).update(training_opt_out=new)
    training_opt_out_record(actor=actor or user, subject=user, old=old, new=new)
    return True
