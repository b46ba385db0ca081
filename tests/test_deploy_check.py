"""Production settings (chatsite/settings/production.py) at start: Django's deployment checklist
passes with no warnings, and a missing or unsafe environment stops the process with a message
naming what to set.

Each test runs ``manage.py check --deploy`` in a subprocess, since the settings module checks
the environment when it is imported (once per process).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL", "CHAT_INTERNAL_API_URL")


def production_env(**overrides: str | None) -> dict[str, str]:
    """This process's environment with production settings and every required variable set to a
    plausible value (nothing needs to answer: the checks do not connect); ``None`` unsets."""
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED and not k.startswith("CHAT_ENGINE_")}
    env.pop("DJANGO_DEBUG", None)
    env.update(
        DJANGO_SETTINGS_MODULE="chatsite.settings.production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="chat.example.org,127.0.0.1",
        DATABASE_URL="postgresql://chat:pw@db.example:5432/chat",
        REDIS_URL="redis://127.0.0.1:6379/0",
        CHAT_INTERNAL_API_URL="http://127.0.0.1:8100",
    )
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_check_deploy_reports_no_issues_with_production_settings():
    """Given the required environment, when Django's deployment checklist runs, then it finds
    nothing at all: no security warning (HSTS, SSL redirect, cookies, secret key, DEBUG, ...)
    and nothing silenced."""
    result = check_deploy(production_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", result.stdout
    assert "WARNING" not in result.stderr.upper(), result.stderr


def test_check_deploy_warns_under_the_development_settings():
    """The same command under the development settings does warn (so the test above can fail:
    the checklist really runs and really looks at these settings)."""
    env = production_env(DJANGO_SETTINGS_MODULE="chatsite.settings.base")
    result = check_deploy(env)
    assert "security.W004" in result.stderr + result.stdout  # no HSTS
    assert "security.W012" in result.stderr + result.stdout  # session cookie not Secure


def test_every_missing_required_variable_is_named_at_start():
    """Given none of the required variables, the settings refuse to load and the message names
    each one with what to put there (not a traceback about a connection much later)."""
    env = production_env(**dict.fromkeys(REQUIRED))
    result = check_deploy(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    for name in REQUIRED:
        assert f"{name} is not set" in result.stderr, (name, result.stderr[-2000:])


def test_a_blank_required_variable_counts_as_missing():
    result = check_deploy(production_env(REDIS_URL="  "))
    assert result.returncode != 0
    assert "REDIS_URL is not set" in result.stderr


def test_a_short_or_development_secret_key_is_refused():
    """Django's own rule (security.W009: 50+ characters, 5+ distinct) stops the start, as does
    the development default."""
    for weak in ("too-short-secret", "dev-only-insecure-key-change-me" + "x" * 40):
        result = check_deploy(production_env(DJANGO_SECRET_KEY=weak))
        assert result.returncode != 0, weak
        assert "DJANGO_SECRET_KEY is too weak" in result.stderr, weak


def test_debug_cannot_be_switched_on():
    result = check_deploy(production_env(DJANGO_DEBUG="1"))
    assert result.returncode != 0
    assert "DJANGO_DEBUG is on" in result.stderr


def test_a_gateway_without_an_engine_must_name_the_engine_and_its_key():
    """A gateway with the remote engine class (no engine of its own) needs CHAT_ENGINE_URL and
    CHAT_ENGINE_API_KEY; with both it starts."""
    remote = "inference.remote.OpenAIRemoteEngine"
    missing = check_deploy(production_env(CHAT_ENGINE_CLASS=remote))
    assert missing.returncode != 0
    assert "CHAT_ENGINE_URL is not set" in missing.stderr
    assert "CHAT_ENGINE_API_KEY is not set" in missing.stderr

    given = check_deploy(
        production_env(
            CHAT_ENGINE_CLASS=remote,
            CHAT_ENGINE_URL="http://127.0.0.1:8100",
            CHAT_ENGINE_API_KEY="sk-chat-x.y",
        )
    )
    assert given.returncode == 0, given.stderr


def test_the_nginx_site_gets_one_upstream_server_per_gateway():
    """render-site (chatsite/nginx_files.py) fills deploy/nginx.conf's placeholders and repeats
    the upstream's server line once per gateway; nothing is left unfilled outside comments."""
    from chatsite.nginx_files import render_site  # noqa: PLC0415

    site = render_site(
        listen="80",
        server_name="chat.example.org",
        upstreams=["127.0.0.1:8101", "127.0.0.1:8102", "127.0.0.1:8103"],
        static_root="/srv/chatsite/var/staticfiles/",
    )
    upstream = site[site.index("upstream chatsite_gateways {"):site.index("}", site.index("upstream chatsite_gateways {"))]
    servers = [line.strip() for line in upstream.splitlines() if line.strip().startswith("server ")]
    assert servers == ["server 127.0.0.1:8101;", "server 127.0.0.1:8102;", "server 127.0.0.1:8103;"]
    assert "alias /srv/chatsite/var/staticfiles/;" in site
    assert all("{{" not in line for line in site.splitlines() if not line.lstrip().startswith("#"))


def test_rendering_refuses_a_placeholder_without_a_value():
    from chatsite.nginx_files import render_template  # noqa: PLC0415

    with pytest.raises(ValueError, match="no value"):
        render_template("listen {{LISTEN}};\nssl_certificate {{TLS_CERT}};\n", {"LISTEN": "443"})
    with pytest.raises(ValueError, match="not in the template"):
        render_template("listen {{LISTEN}};\n", {"LISTEN": "443", "EXTRA": "x"})
