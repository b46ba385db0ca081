"""Production settings: ``DJANGO_SETTINGS_MODULE=chatsite.settings.production``.

Everything of ``chatsite.settings.base`` (all of it env-driven), plus what a public deployment
behind the shipped nginx site (deploy/nginx.conf, TLS terminated by nginx) needs:

- every secret and URL comes from the environment; a missing required one stops the process at
  start with one message naming all of them (:data:`REQUIRED_ENV`), before anything listens;
- ``DEBUG`` is off (``DJANGO_DEBUG=1`` is refused, not ignored);
- HTTPS only: ``X-Forwarded-Proto`` from nginx is trusted, plain-HTTP requests are redirected
  (except the probes ``/healthz``, ``/readyz``, ``/metrics``, which monitoring asks each process
  for directly), HSTS, ``Secure`` + ``HttpOnly`` + ``SameSite=Lax`` session and CSRF cookies;
- a Content-Security-Policy (django-csp) that allows no inline script, no inline style and no
  eval: scripts, styles, fetches and the answer streams come from the site itself.

``manage.py check --deploy`` passes with no warnings under these settings
(tests/test_deploy_check.py). docs/operations.md (and deploy/) describe the rest.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

# Required in production: (variable, what it is). Checked before the base settings fill in
# their development defaults, so a forgotten variable can never fall back to one.
REQUIRED_ENV: tuple[tuple[str, str], ...] = (
    ("DJANGO_SECRET_KEY", "a long random secret (python -c 'import secrets; print(secrets.token_urlsafe(50))')"),
    ("DJANGO_ALLOWED_HOSTS", "the site's public host names, comma-separated, e.g. chat.example.org"),
    ("DATABASE_URL", "the PostgreSQL URL, e.g. postgresql://chat:PASSWORD@db.example:5432/chat"),
    ("REDIS_URL", "the Redis URL, e.g. redis://127.0.0.1:6379/0"),
    ("CHAT_INTERNAL_API_URL", "where background jobs reach the model: the engine process, e.g. http://127.0.0.1:8100"),
)
# Django's own deploy check (security.W009) wants at least 50 characters, 5 of them distinct.
MIN_SECRET_KEY_CHARS = 50
REMOTE_ENGINE_CLASS = "inference.remote.OpenAIRemoteEngine"


def production_env_problems(environ: os._Environ | dict[str, str]) -> list[str]:
    """Everything wrong with ``environ`` for production, one line per problem (empty: fine).

    Checks: each :data:`REQUIRED_ENV` variable is set and not blank; the secret key is long and
    varied enough (Django's security.W009 rule) and is not the development default; debug is not
    switched on; a gateway without an engine of its own (``CHAT_ENGINE_CLASS`` =
    ``inference.remote.OpenAIRemoteEngine``) names the engine (``CHAT_ENGINE_URL``) and a key
    for it (``CHAT_ENGINE_API_KEY``).
    """
    problems = [
        f"{name} is not set: {meaning}"
        for name, meaning in REQUIRED_ENV
        if not environ.get(name, "").strip()
    ]
    secret = environ.get("DJANGO_SECRET_KEY", "").strip()
    if secret and (
        len(secret) < MIN_SECRET_KEY_CHARS
        or len(set(secret)) < 5
        or secret.startswith("django-insecure-")
        or secret.startswith("dev-only-")
    ):
        problems.append(
            f"DJANGO_SECRET_KEY is too weak: use at least {MIN_SECRET_KEY_CHARS} random characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    if environ.get("DJANGO_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}:
        problems.append("DJANGO_DEBUG is on: debug pages leak settings and source; unset it")
    if environ.get("CHAT_ENGINE_CLASS", "").strip() == REMOTE_ENGINE_CLASS:
        for name, meaning in (
            ("CHAT_ENGINE_URL", "the engine process this gateway sends prompts to, e.g. http://127.0.0.1:8100"),
            ("CHAT_ENGINE_API_KEY", "the service key for it (python -m chatsite.prodstack service-key)"),
        ):
            if not environ.get(name, "").strip():
                problems.append(f"{name} is not set: {meaning}")
    return problems


_problems = production_env_problems(os.environ)
if _problems:
    raise ImproperlyConfigured(
        "chatsite.settings.production cannot start; set these environment variables:\n  - "
        + "\n  - ".join(_problems)
    )

from .base import *  # noqa: E402, F403
from .base import INSTALLED_APPS, MIDDLEWARE, env_bool, env_int  # noqa: E402

DEBUG = False
ALLOWED_HOSTS = [h.strip() for h in os.environ["DJANGO_ALLOWED_HOSTS"].split(",") if h.strip()]
# Where `manage.py collectstatic` puts the files nginx serves (deploy/nginx.conf {{STATIC_ROOT}}).
if os.environ.get("DJANGO_STATIC_ROOT"):
    STATIC_ROOT = os.environ["DJANGO_STATIC_ROOT"]

# --- HTTPS behind nginx (deploy/nginx.conf sets X-Forwarded-Proto $scheme) ---
# The server (uvicorn) listens on loopback only, so the header can only come from nginx.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Plain HTTP gets a redirect to https://. The engine process, which only gateways and Celery
# reach over loopback, runs with DJANGO_SECURE_SSL_REDIRECT=off (deploy/systemd/chat-engine.service).
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# Probes and metrics are asked of each server process directly, over plain HTTP on loopback.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# The redirect keeps the request's host (and port); name the HTTPS host[:port] when the HTTPS
# port is not 443, e.g. DJANGO_SECURE_SSL_HOST=chat.example.org:8443.
SECURE_SSL_HOST = os.environ.get("DJANGO_SECURE_SSL_HOST") or None
# HSTS (RFC 6797): a year, subdomains included, preload-ready. Start lower (DJANGO_HSTS_SECONDS=300)
# while trying TLS out; browsers remember the header for max-age seconds.
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# --- Cookies: HTTPS only, out of scripts' reach, not sent on cross-site subrequests ---
SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SECURE = True
# The pages hand htmx the CSRF token in the markup (base.html's hx-headers); no script reads it.
CSRF_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"

# --- Content-Security-Policy (django-csp 4) ---
# No inline <script>, no on* handlers, no style="" attributes, no eval (htmx runs with
# allowEval false and includeIndicatorStyles false: templates/base.html's htmx-config).
INSTALLED_APPS = [*INSTALLED_APPS, "csp"]
MIDDLEWARE = list(MIDDLEWARE)
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
    "csp.middleware.CSPMiddleware",
)
_SELF, _NONE = "'self'", "'none'"
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [_SELF],
        "script-src": [_SELF],
        "style-src": [_SELF],
        # data: for base.html's empty favicon (<link rel="icon" href="data:,">).
        "img-src": [_SELF, "data:"],
        "font-src": [_SELF],
        # htmx requests and the answers' EventSource streams.
        "connect-src": [_SELF],
        "form-action": [_SELF],
        "frame-ancestors": [_NONE],
        "object-src": [_NONE],
        "base-uri": [_NONE],
    },
}
