"""Accounts: users with a tier and a residency region; organisations with memberships."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.crypto import salted_hmac


def default_region() -> str:
    """The region new users live in (``settings.CHAT_DEFAULT_REGION``)."""
    return settings.CHAT_DEFAULT_REGION


class Tier(models.TextChoices):
    FREE = "free", "Free"
    PAID = "paid", "Paid"
    ENTERPRISE = "enterprise", "Enterprise"


class Theme(models.TextChoices):
    """The colour scheme a user picked; ``system`` follows the browser's prefers-color-scheme."""

    SYSTEM = "system", "System"
    LIGHT = "light", "Light"
    DARK = "dark", "Dark"


class User(AbstractUser):
    """A person who chats. ``tier`` picks limits and model pools; ``region`` is where their
    conversations are stored (data residency)."""

    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.FREE)
    region = models.CharField(max_length=32, default=default_region)
    # Feature flags (names); a flag in settings.CHAT_FLAG_POOLS opens that pool beyond the tier.
    feature_flags = models.JSONField(default=list, blank=True)
    # Long-term memory (memory/): off means nothing is extracted from this user's conversations
    # and nothing is retrieved into their prompts.
    memory_enabled = models.BooleanField(default=True)
    # Sign-in security (issue 10; accounts/services.py). Mixed into the session auth hash, so a
    # new value ("sign out everywhere") ends every session of the user in any session store,
    # even ones UserSession does not list. Empty: exactly Django's own hash.
    session_salt = models.CharField(max_length=32, blank=True, default="")
    # The address this person proved they control (they followed a password reset link sent to
    # it, or an OpenID Connect provider vouched for it). OIDC sign-in joins only an account whose
    # email is verified: otherwise anyone could pre-register a victim's address with a password.
    verified_email = models.EmailField(blank=True, default="")
    # Colour scheme of every page (templates/base.html puts it on <html data-theme>, so the page
    # is drawn in it from the first paint).
    theme = models.CharField(max_length=8, choices=Theme.choices, default=Theme.SYSTEM)
    # Custom instructions (issue 18): applied to every chat of this user, after the site's
    # prompt and before the memory block (inference/prompts.py system_message); blank: none.
    custom_instructions = models.TextField(blank=True, default="", db_default="")
    # Training opt-out (issue 20): this person's turns are stored with Turn.training_eligible
    # False from their next turn on, whatever their organisation's policy (either opt-out wins:
    # accounts/selectors.py turn_training_eligible). Turns already stored keep their tag.
    training_opt_out = models.BooleanField(default=False, db_default=False)

    def get_session_auth_hash(self) -> str:
        """Django's session hash (HMAC-SHA256 of the password hash) with ``session_salt``."""
        return self._salted_session_auth_hash()

    def get_session_auth_fallback_hash(self):
        for secret in settings.SECRET_KEY_FALLBACKS:
            yield self._salted_session_auth_hash(secret=secret)

    def _salted_session_auth_hash(self, secret: str | None = None) -> str:
        return salted_hmac(
            "django.contrib.auth.models.AbstractBaseUser.get_session_auth_hash",
            self.password + self.session_salt,
            secret=secret,
            algorithm="sha256",
        ).hexdigest()

    @property
    def email_is_verified(self) -> bool:
        return bool(self.email) and self.verified_email.lower() == self.email.lower()


class Organisation(models.Model):
    """A workspace that users belong to through :class:`Membership`."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.ENTERPRISE)
    region = models.CharField(max_length=32, default=default_region)
    # Retention policy: conversations older than this many days (by last turn) are purged;
    # None: the tier's default (settings.CHAT_RETENTION_DAYS_BY_TIER).
    retention_days = models.PositiveIntegerField(null=True, blank=True)
    # Zero data retention: answers are given but no turn is ever stored in PostgreSQL, and the
    # transient copies in Redis expire within minutes (settings.CHAT_ZDR_TTL_S).
    zero_retention = models.BooleanField(default=False)
    # An exact pool version every member's turn uses ("frontier@smollm2-135m-1"); blank: none.
    # Enterprise orgs pin a version so an upgrade never changes answers under them unannounced.
    pinned_pool = models.CharField(max_length=100, blank=True)
    # Moderation policy (moderation/): per-category thresholds overriding
    # settings.CHAT_MODERATION_THRESHOLDS ({"offensive": 0.7}), terms no message or answer may
    # contain, and whether a failed classifier lets turns through (default: refuse, PF-M2).
    moderation_thresholds = models.JSONField(default=dict, blank=True)
    blocked_terms = models.JSONField(default=list, blank=True)
    moderation_fail_open = models.BooleanField(default=False)
    # Not for training (workspaces/): every turn of the organisation's conversations is stored
    # with Turn.training_eligible False from the next turn on (True otherwise).
    not_for_training = models.BooleanField(default=False)
    # The organisation's own shared limits, requests / tokens per minute, replacing its tier's
    # (settings.CHAT_ORG_RATE_LIMITS_BY_TIER) one by one; None: the tier's (inference/ratelimit.py).
    rate_limit_rpm = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    rate_limit_tpm = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    # One prefix cache for the whole workspace: its members' turns share cached prompt prefixes
    # (the engine's cache salt is the organisation's, gateway/tenancy.py), so a member can tell
    # from the speed of an answer what prompt another member sent. Off: each member's own.
    share_prefix_cache = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="organisations"
    )

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in an organisation."""

    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organisation", "user"], name="one_membership_per_org")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organisation} ({self.role})"


class ApiKey(models.Model):
    """A bearer credential for ``/v1``. The secret is shown once at creation; only its SHA-256
    is stored. Keys are 256-bit random strings, so a fast hash is enough (no password-style
    stretching needed: there is nothing to brute-force), the same choice GitHub and Stripe make
    for their tokens. ``prefix`` (public) finds the row; the hash is compared in constant time.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class UserSession(models.Model):
    """A signed-in browser session, listed on the sessions page (issue 10). Recorded at sign-in
    (accounts/signals.py); ``last_seen_at``, ``ip`` and ``user_agent`` are refreshed at most once
    a minute (accounts/middleware.py). ``session_key`` is a credential: never rendered."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="login_sessions"
    )
    session_key = models.CharField(max_length=40, unique=True)
    user_agent = models.CharField(max_length=300, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-last_seen_at",)

    def __str__(self) -> str:
        return f"{self.user} session since {self.created_at:%Y-%m-%d %H:%M}"
