"""API keys: issued once, stored hashed, revocable; the settings page and the command."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from accounts import services
from accounts.models import ApiKey

pytestmark = pytest.mark.django_db


def test_key_is_stored_only_as_a_hash(make_user):
    issued = services.api_key_create(user=make_user(), name="script")
    row = ApiKey.objects.get()
    secret = issued.raw.split(".", 1)[1]
    assert secret not in row.key_hash and secret not in row.prefix
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()


def test_key_authenticates_its_user_until_revoked(make_user):
    user = make_user()
    issued = services.api_key_create(user=user, name="script")
    assert services.api_key_authenticate(issued.raw) == user
    services.api_key_revoke(api_key=issued.api_key)
    assert services.api_key_authenticate(issued.raw) is None


@pytest.mark.parametrize("raw", ["", "sk-", "nonsense", "sk-abc.def", "Bearer sk-x.y"])
def test_malformed_or_unknown_keys_do_not_authenticate(make_user, raw):
    services.api_key_create(user=make_user(), name="real")
    assert services.api_key_authenticate(raw) is None


def test_tampered_secret_does_not_authenticate(make_user):
    issued = services.api_key_create(user=make_user(), name="script")
    assert services.api_key_authenticate(issued.raw[:-1] + ("A" if issued.raw[-1] != "A" else "B")) is None


def test_settings_page_shows_a_new_key_once_and_revokes(make_user):
    user = make_user()
    client = Client()
    client.force_login(user)
    created = client.post("/settings/api-keys/", {"name": "laptop"})
    assert created.status_code == 200
    raw = created.context["new_key"].raw
    assert raw in created.content.decode()
    assert created["Cache-Control"] == "no-store"
    listing = client.get("/settings/api-keys/").content.decode()
    assert "laptop" in listing and raw not in listing
    key = ApiKey.objects.get()
    assert client.post(f"/settings/api-keys/{key.pk}/revoke").status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_blank_key_name_is_refused(make_user):
    client = Client()
    client.force_login(make_user())
    response = client.post("/settings/api-keys/", {"name": "  "})
    assert response.status_code == 400
    assert not ApiKey.objects.exists()


def test_cannot_revoke_someone_elses_key(make_user):
    issued = services.api_key_create(user=make_user("owner"), name="theirs")
    client = Client()
    client.force_login(make_user("other"))
    assert client.post(f"/settings/api-keys/{issued.api_key.pk}/revoke").status_code == 404
    issued.api_key.refresh_from_db()
    assert issued.api_key.revoked_at is None


def test_create_api_key_command_prints_a_working_key(make_user):
    user = make_user("ops")
    out = StringIO()
    call_command("create_api_key", "ops", stdout=out)
    assert services.api_key_authenticate(out.getvalue().strip()) == user
