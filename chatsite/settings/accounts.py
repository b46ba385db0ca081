"""Settings of workspaces (issue 8) and of the accounts' security (issue 10: sign-in throttling,
sessions, OpenID Connect), imported by chatsite/settings/base.py. Every name is overridable
from the environment.
"""

from __future__ import annotations

import os

from chatsite.settings.env import env_bool, env_int

# --- Workspaces (issue 8; workspaces/) -------------------------------------------------------------
# Organisation invitations (by link or email) can be accepted until this many days after they
# were made.
CHAT_WORKSPACE_INVITATION_TTL_DAYS = env_int("CHAT_WORKSPACE_INVITATION_TTL_DAYS", 7)
# Invitation emails go through Django's mail API. Default: the console backend (the message is
# printed to the server's output); set DJANGO_EMAIL_BACKEND (e.g.
# django.core.mail.backends.smtp.EmailBackend) and the DJANGO_EMAIL_* variables for real mail.
EMAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend"
)
EMAIL_HOST = os.environ.get("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("DJANGO_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("DJANGO_EMAIL_TIMEOUT_S", 10)
DEFAULT_FROM_EMAIL = os.environ.get("DJANGO_DEFAULT_FROM_EMAIL", "chatsite <noreply@localhost>")


# --- Accounts security (issue 10; accounts/throttle.py, middleware.py, oidc.py) ----------------
# Failed sign-ins, counted in Redis: this many for one username within the window lock that
# account (from every address) for the lockout; this many from one address (IPv4, or an IPv6
# /64) across any usernames lock that address. A successful sign-in clears the account's count.
CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT = env_int("CHAT_ACCOUNTS_LOGIN_ACCOUNT_LIMIT", 5)
CHAT_ACCOUNTS_LOGIN_IP_LIMIT = env_int("CHAT_ACCOUNTS_LOGIN_IP_LIMIT", 30)
CHAT_ACCOUNTS_LOGIN_WINDOW_S = float(os.environ.get("CHAT_ACCOUNTS_LOGIN_WINDOW_S", "900"))
CHAT_ACCOUNTS_LOGIN_LOCKOUT_S = float(os.environ.get("CHAT_ACCOUNTS_LOGIN_LOCKOUT_S", "900"))
# Password reset requests per address, and mails per email address, within the window.
CHAT_ACCOUNTS_RESET_IP_LIMIT = env_int("CHAT_ACCOUNTS_RESET_IP_LIMIT", 10)
CHAT_ACCOUNTS_RESET_EMAIL_LIMIT = env_int("CHAT_ACCOUNTS_RESET_EMAIL_LIMIT", 3)
CHAT_ACCOUNTS_RESET_WINDOW_S = float(os.environ.get("CHAT_ACCOUNTS_RESET_WINDOW_S", "3600"))
# Reverse proxies of ours in front of the app: the client's address is the X-Forwarded-For entry
# this many from the right. Unset: 1 when SECURE_PROXY_SSL_HEADER is set (behind
# deploy/nginx.conf), else 0 (REMOTE_ADDR).
CHAT_ACCOUNTS_TRUSTED_PROXIES = (
    env_int("CHAT_ACCOUNTS_TRUSTED_PROXIES", 0)
    if os.environ.get("CHAT_ACCOUNTS_TRUSTED_PROXIES", "") != ""
    else None
)
# The sessions page's "last seen" is refreshed at most this often per session, seconds.
CHAT_ACCOUNTS_SESSION_TOUCH_S = env_int("CHAT_ACCOUNTS_SESSION_TOUCH_S", 60)
# Reset links work for this long (Django's default is 3 days), and once (the token is bound to
# the password hash, which the reset changes).
PASSWORD_RESET_TIMEOUT = env_int("CHAT_ACCOUNTS_PASSWORD_RESET_TIMEOUT_S", 3600)

# Sign-in with OpenID Connect (mozilla-django-oidc), off by default. When on: the sign-in page
# shows "Sign in with CHAT_OIDC_PROVIDER_NAME"; register CHAT_OIDC_CLIENT_ID with the provider
# with the redirect URI https://<site>/accounts/oidc/callback/. `manage.py check` names any
# missing variable (chat.E010).
CHAT_OIDC_ENABLED = env_bool("CHAT_OIDC_ENABLED", False)
CHAT_OIDC_PROVIDER_NAME = os.environ.get("CHAT_OIDC_PROVIDER_NAME", "single sign-on")
# Only an email the provider marks verified (email_verified) signs in; turn off only for a
# provider that gives out nothing but verified addresses and omits the claim.
CHAT_OIDC_REQUIRE_VERIFIED_EMAIL = env_bool("CHAT_OIDC_REQUIRE_VERIFIED_EMAIL", True)
# The provider's issuer identifier; when set, ID tokens from any other issuer are refused.
CHAT_OIDC_ISSUER = os.environ.get("CHAT_OIDC_ISSUER", "")
OIDC_RP_CLIENT_ID = os.environ.get("CHAT_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = os.environ.get("CHAT_OIDC_CLIENT_SECRET", "")
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("CHAT_OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("CHAT_OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("CHAT_OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = os.environ.get("CHAT_OIDC_JWKS_ENDPOINT", "") or None
OIDC_RP_SIGN_ALGO = os.environ.get("CHAT_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = os.environ.get("CHAT_OIDC_SCOPES", "openid email profile")
OIDC_CREATE_USER = env_bool("CHAT_OIDC_CREATE_USERS", True)
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True  # RFC 7636, S256
OIDC_TIMEOUT = float(os.environ.get("CHAT_OIDC_TIMEOUT_S", "10"))  # each call to the provider
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
if CHAT_OIDC_ENABLED:
    AUTHENTICATION_BACKENDS.append("accounts.oidc.OIDCBackend")
