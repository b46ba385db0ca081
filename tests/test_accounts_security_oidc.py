"""Optional sign-in with OpenID Connect (issue 10), against a tiny local OIDC provider: a real
HTTP server in a thread with token, userinfo and JWKS endpoints, RS256 ID tokens, PKCE. The
browser's trip to the provider's authorization page is played by the test (it reads the
redirect and asks the provider for a code)."""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.core.checks import run_checks
from django.test import Client
from django.urls import NoReverseMatch, clear_url_caches, reverse

from accounts.models import UserSession
from tests.test_accounts_security import (  # noqa: F401 - the autouse fixture
    WRONG,
    fresh_throttle_counters,
    is_signed_in,
)

pytestmark = pytest.mark.django_db

CLIENT_ID = "chatsite-test"
CLIENT_SECRET = "s3cret-for-tests"
CALLBACK = "http://testserver/accounts/oidc/callback/"


@functools.cache
def signing_key() -> rsa.RSAPrivateKey:
    """The provider's RSA key (made once per test run: key generation is slow)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FakeProvider:
    """An OpenID Connect provider good for one test: ``authorize`` stands in for the person
    approving the sign-in on the provider's page and returns a code; ``/token`` checks client,
    code, redirect URI and PKCE and returns an RS256 ID token carrying the request's nonce;
    ``/userinfo`` returns the claims; ``/jwks`` the public key."""

    def __init__(self) -> None:
        self.key = signing_key()
        self.kid = "test-key-1"
        self.codes: dict[str, dict] = {}
        self.access_tokens: dict[str, dict] = {}
        self.token_calls = 0
        self.fail_token_endpoint = False
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                if self.path != "/token":
                    return self._json(404, {"error": "not_found"})
                length = int(self.headers.get("Content-Length", 0))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                status, body = provider.token(form)
                self._json(status, body)

            def do_GET(self):
                if self.path == "/jwks":
                    return self._json(200, provider.jwks())
                if self.path == "/userinfo":
                    token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    claims = provider.access_tokens.get(token)
                    if claims is None:
                        return self._json(401, {"error": "invalid_token"})
                    return self._json(200, claims)
                return self._json(404, {"error": "not_found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeProvider:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def jwks(self) -> dict:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def authorize(self, params: dict, claims: dict, **id_token_overrides) -> str:
        """The person approves: a code for this authorization request (``params``: the query
        the app redirected to) that will yield ``claims``."""
        assert params["client_id"] == CLIENT_ID and params["response_type"] == "code"
        code = secrets.token_urlsafe(16)
        self.codes[code] = {
            "params": params,
            "claims": {"sub": "subject-1", **claims},
            "overrides": id_token_overrides,
        }
        return code

    def token(self, form: dict) -> tuple[int, dict]:
        self.token_calls += 1
        if self.fail_token_endpoint:
            return 503, {"error": "temporarily_unavailable"}
        grant = self.codes.pop(form.get("code", ""), None)  # a code works once
        if grant is None or form.get("client_secret") != CLIENT_SECRET:
            return 400, {"error": "invalid_grant"}
        params = grant["params"]
        if form.get("redirect_uri") != params["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri"}
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
        if challenge.decode() != params.get("code_challenge"):
            return 400, {"error": "invalid_grant", "error_description": "PKCE"}
        now = int(time.time())
        id_claims = {
            "iss": self.url,
            "sub": grant["claims"]["sub"],
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": params.get("nonce"),
            **grant["overrides"],
        }
        id_token = jwt.encode(id_claims, self.key, algorithm="RS256", headers={"kid": self.kid})
        access_token = secrets.token_urlsafe(16)
        self.access_tokens[access_token] = grant["claims"]
        return 200, {"access_token": access_token, "id_token": id_token, "token_type": "Bearer"}


def reload_urls() -> None:
    """accounts/urls.py adds the OIDC URLs only when the setting is on, at import."""
    import accounts.urls  # noqa: PLC0415
    import chatsite.urls  # noqa: PLC0415

    importlib.reload(accounts.urls)
    importlib.reload(chatsite.urls)
    clear_url_caches()


@pytest.fixture
def provider(settings) -> Iterator[FakeProvider]:
    """OIDC sign-in switched on against a fresh fake provider ("Acme ID")."""
    fake = FakeProvider().start()
    settings.CHAT_OIDC_ENABLED = True
    settings.CHAT_OIDC_PROVIDER_NAME = "Acme ID"
    settings.CHAT_OIDC_ISSUER = fake.url
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{fake.url}/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{fake.url}/token"
    settings.OIDC_OP_USER_ENDPOINT = f"{fake.url}/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = f"{fake.url}/jwks"
    settings.AUTHENTICATION_BACKENDS = [
        "django.contrib.auth.backends.ModelBackend",
        "accounts.oidc.OIDCBackend",
    ]
    reload_urls()
    try:
        yield fake
    finally:
        fake.stop()
        settings.CHAT_OIDC_ENABLED = False
        reload_urls()


def start(client: Client, next_url: str = "/") -> dict:
    """Press "Sign in with ...": the app's redirect to the provider, as a dict of its query."""
    response = client.get("/accounts/oidc/authenticate/", {"next": next_url})
    assert response.status_code == 302
    return {k: v[0] for k, v in parse_qs(urlsplit(response["Location"]).query).items()}


def sign_in_with_provider(client: Client, provider: FakeProvider, claims: dict, **overrides):
    params = start(client)
    code = provider.authorize(params, claims, **overrides)
    return client.get("/accounts/oidc/callback/", {"code": code, "state": params["state"]})


def message_texts(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


VERIFIED = {"email": "grace@example.org", "email_verified": True, "preferred_username": "grace"}


# --- off --------------------------------------------------------------------------------------------


def test_oidc_is_off_by_default():
    """No button, no URLs: the init and callback paths are 404 and do not resolve by name."""
    body = Client().get("/accounts/login/").content.decode()
    assert "Sign in with" not in body
    assert Client().get("/accounts/oidc/authenticate/").status_code == 404
    assert Client().get("/accounts/oidc/callback/?code=x&state=y").status_code == 404
    with pytest.raises(NoReverseMatch):
        reverse("oidc_authentication_init")


# --- on ---------------------------------------------------------------------------------------------


def test_when_on_the_sign_in_page_has_the_provider_button(provider):
    body = Client().get("/accounts/login/?next=/c/x/").content.decode()
    assert "Sign in with Acme ID" in body
    assert 'href="/accounts/oidc/authenticate/?next=/c/x/"' in body


def test_the_button_sends_the_browser_to_the_provider_with_state_nonce_and_pkce(provider):
    client = Client()
    response = client.get("/accounts/oidc/authenticate/")
    location = urlsplit(response["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{provider.url}/authorize"
    params = {k: v[0] for k, v in parse_qs(location.query).items()}
    assert params["response_type"] == "code"
    assert params["client_id"] == CLIENT_ID
    assert params["redirect_uri"] == CALLBACK
    assert set(params["scope"].split()) >= {"openid", "email"}
    assert len(params["state"]) >= 32 and len(params["nonce"]) >= 32
    assert params["code_challenge_method"] == "S256" and params["code_challenge"]
    again = start(client)
    assert (again["state"], again["nonce"]) != (params["state"], params["nonce"])


def test_a_first_sign_in_creates_an_account_from_the_verified_email(provider):
    client = Client()
    response = sign_in_with_provider(client, provider, VERIFIED)
    assert response.status_code == 302 and response["Location"] == "/"
    assert is_signed_in(client)
    user = get_user_model().objects.get(email="grace@example.org")
    assert user.username == "grace"
    assert user.email_is_verified
    assert not user.has_usable_password()
    assert UserSession.objects.filter(user=user, session_key=client.session.session_key).exists()


def test_an_account_with_that_email_verified_is_signed_in_not_duplicated(make_user, provider):
    user = make_user("grace_h", email="Grace@Example.org", verified_email="Grace@Example.org")
    client = Client()
    sign_in_with_provider(client, provider, VERIFIED)
    assert client.session["_auth_user_id"] == str(user.pk)
    assert get_user_model().objects.filter(email__iexact="grace@example.org").count() == 1


def test_an_account_holding_the_address_unverified_is_not_joined(make_user, provider):
    """Pre-account takeover: someone signed up with grace's address and a password of their
    own; grace's provider sign-in must not land in that account, nor make a second one."""
    squatter = make_user("squatter", email="grace@example.org")
    client = Client()
    response = sign_in_with_provider(client, provider, VERIFIED)
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert not is_signed_in(client)
    assert any("has not been verified" in m for m in message_texts(response))
    assert list(get_user_model().objects.filter(email__iexact="grace@example.org")) == [squatter]


def test_a_provider_email_that_is_not_verified_is_refused(provider):
    client = Client()
    response = sign_in_with_provider(client, provider, {**VERIFIED, "email_verified": False})
    assert not is_signed_in(client)
    assert any("is not verified" in m for m in message_texts(response))
    assert not get_user_model().objects.filter(email="grace@example.org").exists()


def test_an_id_token_with_another_nonce_is_refused(provider):
    client = Client()
    response = sign_in_with_provider(client, provider, VERIFIED, nonce="not-the-one-we-sent")
    assert response["Location"] == "/accounts/login/"
    assert not is_signed_in(client)
    assert not get_user_model().objects.filter(email="grace@example.org").exists()


def test_an_id_token_for_another_application_is_refused(provider):
    client = Client()
    response = sign_in_with_provider(client, provider, VERIFIED, aud="some-other-client")
    assert not is_signed_in(client)
    assert any("another application" in m for m in message_texts(response))


def test_an_id_token_from_another_issuer_is_refused(provider):
    client = Client()
    sign_in_with_provider(client, provider, VERIFIED, iss="https://evil.example")
    assert not is_signed_in(client)


def test_userinfo_about_another_subject_is_refused(provider):
    client = Client()
    sign_in_with_provider(client, provider, VERIFIED, sub="someone-else")
    assert not is_signed_in(client)


def test_a_callback_with_a_state_this_browser_did_not_start_gets_a_message(provider):
    client = Client()
    start(client)
    response = client.get("/accounts/oidc/callback/", {"code": "x", "state": "forged-state"})
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert any("expired or was already used" in m for m in message_texts(response))
    assert provider.token_calls == 0


def test_a_callback_used_twice_does_not_sign_in_again(provider):
    client = Client()
    params = start(client)
    code = provider.authorize(params, VERIFIED)
    client.get("/accounts/oidc/callback/", {"code": code, "state": params["state"]})
    client.post("/accounts/logout/")
    response = client.get("/accounts/oidc/callback/", {"code": code, "state": params["state"]})
    assert response["Location"] == "/accounts/login/"
    assert not is_signed_in(client)


def test_the_provider_failing_gives_a_message_not_an_error_page(provider):
    provider.fail_token_endpoint = True
    client = Client()
    response = sign_in_with_provider(client, provider, VERIFIED)
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert any("could not be reached" in m for m in message_texts(response))


def test_the_sign_in_page_shows_the_failure_message(provider):
    client = Client()
    sign_in_with_provider(client, provider, {**VERIFIED, "email_verified": False})
    body = client.get("/accounts/login/").content.decode()
    assert "Your email address at Acme ID is not verified" in body


def test_a_password_sign_in_never_exchanges_a_code_from_its_url(make_user, provider):
    """Every backend runs for a password sign-in; the OIDC one must ignore ?code=&state=."""
    make_user("hugo")
    client = Client()
    params = start(client)
    code = provider.authorize(params, VERIFIED)
    client.post(
        f"/accounts/login/?code={code}&state={params['state']}",
        {"username": "hugo", "password": WRONG},
    )
    assert provider.token_calls == 0
    assert not is_signed_in(client)


def test_the_system_check_names_a_missing_setting(provider, settings):
    settings.OIDC_RP_CLIENT_ID = ""
    errors = [e for e in run_checks(tags=["chat"]) if e.id == "chat.E010"]
    assert [e.msg for e in errors] == ["CHAT_OIDC_ENABLED is on but CHAT_OIDC_CLIENT_ID is empty."]


def test_the_system_check_is_quiet_when_off(settings):
    settings.OIDC_RP_CLIENT_ID = ""
    assert not [e for e in run_checks(tags=["chat"]) if e.id == "chat.E010"]
