"""Optional sign-in with OpenID Connect (issue 10), through mozilla-django-oidc.

Off unless ``CHAT_OIDC_ENABLED``; then the sign-in page shows "Sign in with
<CHAT_OIDC_PROVIDER_NAME>", ``/accounts/oidc/authenticate/`` sends the browser to the provider
(authorization code flow with state, nonce and PKCE S256) and ``/accounts/oidc/callback/`` takes
it back. When off, neither URL exists and no button is shown (accounts/urls.py, the login page).

Who the person is comes from the provider's **verified** email (the ``email_verified`` claim,
OpenID Connect Core 1.0 section 5.1), never from a name they could choose:

- an account whose email is that address *and is verified here* (``User.verified_email``: set
  by a password reset link or by an earlier OIDC sign-in) is signed in;
- an account with that address that is *not* verified here is not joined: otherwise anyone could
  sign up with a victim's address and a password of their own and later share the victim's
  account ("pre-account takeover"). The person is told to reset that account's password by email
  (which verifies the address), then sign in with the provider again;
- no account with that address: a new one is made (``CHAT_OIDC_CREATE_USERS``, default on), with
  no usable password and the address verified.

Failures end on the sign-in page with a message saying what happened, never a bare 400.
"""

from __future__ import annotations

import logging
import re

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.core.checks import Error, register
from django.core.exceptions import SuspiciousOperation
from django.shortcuts import redirect
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from accounts.models import User

logger = logging.getLogger(__name__)

# Settings mozilla-django-oidc needs, and the CHAT_OIDC_* variables that set them.
REQUIRED_SETTINGS = (
    ("OIDC_RP_CLIENT_ID", "CHAT_OIDC_CLIENT_ID"),
    ("OIDC_RP_CLIENT_SECRET", "CHAT_OIDC_CLIENT_SECRET"),
    ("OIDC_OP_AUTHORIZATION_ENDPOINT", "CHAT_OIDC_AUTHORIZATION_ENDPOINT"),
    ("OIDC_OP_TOKEN_ENDPOINT", "CHAT_OIDC_TOKEN_ENDPOINT"),
    ("OIDC_OP_USER_ENDPOINT", "CHAT_OIDC_USERINFO_ENDPOINT"),
)
FAILURE_ATTR = "chat_oidc_failure"  # request attribute: why the backend refused


def provider_name() -> str:
    """The provider's name on the sign-in button ("Sign in with <name>")."""
    return settings.CHAT_OIDC_PROVIDER_NAME


def _refuse(request, message: str) -> None:
    setattr(request, FAILURE_ATTR, message)
    raise SuspiciousOperation(message)


def _claim_true(value) -> bool:
    # Some providers send the boolean as a string ("true").
    return value is True or (isinstance(value, str) and value.lower() == "true")


class OIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, matching and creating users by verified email only."""

    def authenticate(self, request, **kwargs):
        # Only the callback view passes a nonce (OIDC_USE_NONCE is on). A password sign-in runs
        # every backend too; this one must never exchange a code taken from that request's URL.
        if "nonce" not in kwargs:
            return None
        unverifiable = f"The answer from {provider_name()} could not be verified. Start again."
        try:
            return super().authenticate(request, **kwargs)
        except SuspiciousOperation as exc:  # a bad signature or nonce, no matching key
            logger.warning("OIDC sign-in refused: %s", exc)
            if not getattr(request, FAILURE_ATTR, None):
                setattr(request, FAILURE_ATTR, unverifiable)
        except jwt.PyJWTError as exc:  # e.g. an expired ID token
            logger.warning("OIDC ID token refused: %s", exc)
            setattr(request, FAILURE_ATTR, unverifiable)
        except requests.RequestException as exc:  # the token, userinfo or keys call failed
            logger.warning("OIDC provider call failed: %s", exc)
            setattr(
                request,
                FAILURE_ATTR,
                f"{provider_name()} could not be reached or refused the sign-in. Try again in a "
                "moment.",
            )
        return None

    def get_or_create_user(self, access_token, id_token, payload):
        """Checks the ID token's audience (this client) and, with ``CHAT_OIDC_ISSUER``, its
        issuer (OpenID Connect Core 1.0 section 3.1.3.7; the library checks neither), then
        matches or creates the user from the userinfo claims."""
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if self.OIDC_RP_CLIENT_ID not in audiences:
            _refuse(self.request, f"{provider_name()} answered for another application.")
        issuer = settings.CHAT_OIDC_ISSUER
        if issuer and payload.get("iss") != issuer:
            _refuse(self.request, f"The sign-in answer did not come from {provider_name()}.")
        self.id_token_subject = payload.get("sub")
        return super().get_or_create_user(access_token, id_token, payload)

    def verify_claims(self, claims: dict) -> bool:
        """The userinfo is about the ID token's subject (Core 5.3.4) and has an email the
        provider verified (unless ``CHAT_OIDC_REQUIRE_VERIFIED_EMAIL`` is off, for providers
        that only ever give out verified addresses)."""
        name = provider_name()
        if claims.get("sub") != getattr(self, "id_token_subject", None):
            _refuse(self.request, f"{name} gave inconsistent answers about who you are.")
        if not claims.get("email"):
            _refuse(
                self.request,
                f"{name} did not tell us your email address, so you cannot sign in with it "
                "here. Sign in with your password instead.",
            )
        if settings.CHAT_OIDC_REQUIRE_VERIFIED_EMAIL and not _claim_true(claims.get("email_verified")):
            _refuse(
                self.request,
                f"Your email address at {name} is not verified. Verify it there, then sign in "
                f"with {name} again.",
            )
        return True

    def filter_users_by_claims(self, claims: dict):
        """The accounts with this email verified here (one expected); refuses when only
        unverified accounts have it (see the module docstring)."""
        email = claims["email"]
        users = User.objects.filter(email__iexact=email)
        verified = [user for user in users if user.email_is_verified]
        if verified:
            return verified
        if users:
            logger.info("OIDC sign-in refused: %d account(s) hold the address unverified", len(users))
            _refuse(
                self.request,
                "An account with this email address already exists, but the address has not "
                "been verified for it. Reset that account's password by email (which verifies "
                f"the address), then sign in with {provider_name()} again.",
            )
        return User.objects.none()

    def create_user(self, claims: dict) -> User:
        """A new account: a free username from the claims, no usable password (it signs in
        through the provider; a password can be set later by a reset link), email verified."""
        email = claims["email"]
        user = User.objects.create_user(free_username(claims), email=email)
        user.verified_email = email
        user.save(update_fields=["verified_email"])
        return user


def free_username(claims: dict) -> str:
    """A username not yet taken, from ``preferred_username`` or the email's local part, kept to
    the characters Django's username validator allows (no colon: the service user has one)."""
    base = claims.get("preferred_username") or claims["email"].split("@")[0]
    base = re.sub(r"[^\w.@+-]", "", str(base))[:140] or "user"
    candidate, n = base, 1
    while User.objects.filter(username__iexact=candidate).exists():
        n += 1
        candidate = f"{base}{n}"
    return candidate


class OIDCAuthenticateView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (mozilla-django-oidc's view, unchanged)."""


class OIDCCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back. On failure: the sign-in page with a message saying why."""

    def get(self, request):
        try:
            return super().get(request)
        except SuspiciousOperation:
            # The state is not one this browser started (a reused or forged callback URL).
            setattr(
                request,
                FAILURE_ATTR,
                "That sign-in link has expired or was already used. Start again with "
                f"“Sign in with {provider_name()}”.",
            )
            return self.login_failure()

    def login_failure(self):
        message = getattr(self.request, FAILURE_ATTR, None) or (
            f"Signing in with {provider_name()} did not work. Try again, or sign in with your "
            "password."
        )
        messages.error(self.request, message)
        return redirect("login")


@register("chat")
def check_oidc_settings(app_configs=None, **kwargs) -> list[Error]:
    """``chat.E010``: OIDC sign-in is on but a setting it needs is empty (names the variable);
    an RS*/ES* signing algorithm without ``CHAT_OIDC_JWKS_ENDPOINT``."""
    if not getattr(settings, "CHAT_OIDC_ENABLED", False):
        return []
    errors = [
        Error(f"CHAT_OIDC_ENABLED is on but {variable} is empty.", id="chat.E010")
        for setting, variable in REQUIRED_SETTINGS
        if not getattr(settings, setting, "")
    ]
    if settings.OIDC_RP_SIGN_ALGO.startswith(("RS", "ES")) and not settings.OIDC_OP_JWKS_ENDPOINT:
        errors.append(
            Error(
                f"CHAT_OIDC_SIGN_ALGO={settings.OIDC_RP_SIGN_ALGO} needs CHAT_OIDC_JWKS_ENDPOINT "
                "(the provider's signing keys).",
                id="chat.E010",
            )
        )
    return errors
