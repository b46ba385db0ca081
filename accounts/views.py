"""Account pages: sign-up, sign-in (throttled), password reset and change, signed-in sessions,
API keys, and the settings page's forms (custom instructions, colour scheme, training opt-out)."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login, logout, update_session_auth_hash
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts import selectors, services, throttle
from accounts.forms import SignUpForm, ThrottledAuthenticationForm
from accounts.models import ApiKey
from accounts.request_info import client_ip
from audit.models import Action
from audit.services import audit_record
from core.redirects import next_on_site


def _next_path(request: HttpRequest) -> str:
    """The ``next`` a page was opened or posted with (e.g. an invitation that sent its visitor
    to sign in), when it is on this site (core/redirects.py); "" otherwise."""
    return next_on_site(request, request.POST.get("next") or request.GET.get("next", ""))


def signup(request: HttpRequest) -> HttpResponse:
    """Create an account (free tier, default region) and sign in, then go to ``next`` (a page
    on this site that sent the visitor to sign in, e.g. an invitation; the sign-in page's
    "Sign up" link carries it) or the chat. 400 with the form's errors."""
    next_path = _next_path(request)
    if request.user.is_authenticated:
        return redirect(next_path or "home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect(next_path or "home")
    return render(
        request, "registration/signup.html", {"form": form, "next": next_path},
        status=400 if form.is_bound else 200,
    )  # fmt: skip


def _oidc_context() -> dict:
    if not settings.CHAT_OIDC_ENABLED:
        return {"oidc_enabled": False}
    from accounts.oidc import provider_name  # noqa: PLC0415 - mozilla-django-oidc only when on

    return {"oidc_enabled": True, "oidc_provider": provider_name()}


class LoginView(auth_views.LoginView):
    """Sign in with username and password (throttled: accounts/throttle.py), or, when it is
    configured, with the OpenID Connect provider. A locked account or address gets 429 with
    Retry-After and the lock's message; other failures 400."""

    form_class = ThrottledAuthenticationForm

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **_oidc_context()}

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.lockout is not None:
            response.status_code = 429
            response["Retry-After"] = str(form.lockout.retry_after_s)
        else:
            response.status_code = 400
        return response


class PasswordResetView(auth_views.PasswordResetView):
    """Ask for a reset link by email (Django's token: single use, ``PASSWORD_RESET_TIMEOUT``).
    Limited per address (429 when over) and per email (silently: the page looks the same
    whether or not a mail went out, or an account exists)."""

    def form_valid(self, form):
        ip = client_ip(self.request)
        lockout = throttle.reset_request_lockout(ip=ip)
        if lockout is not None:
            form.add_error(None, ValidationError(lockout.message, code="locked"))
            response = self.form_invalid(form)
            response.status_code = 429
            response["Retry-After"] = str(lockout.retry_after_s)
            return response
        if throttle.reset_request_count(email=form.cleaned_data["email"], ip=ip):
            return super().form_valid(form)
        return redirect(self.get_success_url())

    def form_invalid(self, form):
        response = super().form_invalid(form)
        response.status_code = 400
        return response


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """Set a new password from a reset link. Then: the email is verified, every session of the
    account ends, and its failed sign-ins are forgotten (services.user_password_reset_completed)."""

    def form_valid(self, form):
        response = super().form_valid(form)
        services.user_password_reset_completed(user=form.user)
        return response

    def form_invalid(self, form):
        response = super().form_invalid(form)
        response.status_code = 400
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    """Change the password (current one required). This session stays signed in; every other
    session of the account ends (the password hash they were bound to changed; their entries
    are deleted from the session store too)."""

    def form_valid(self, form):
        old_key = self.request.session.session_key
        services.user_sessions_end(user=form.user, keep_session_key=old_key)
        # Saves the password; update_session_auth_hash binds this session to the new hash (new
        # password, new salt) and cycles its key.
        response = super().form_valid(form)
        services.user_session_rekey(old_key=old_key, new_key=self.request.session.session_key)
        messages.success(self.request, "Your password was changed. Your other sessions were signed out.")
        return response

    def form_invalid(self, form):
        response = super().form_invalid(form)
        response.status_code = 400
        return response


def _keep_this_session(request: HttpRequest) -> None:
    """After the user's session salt changed: bind this session to the new hash (which cycles
    its key) and move its row to the new key."""
    old_key = request.session.session_key
    update_session_auth_hash(request, request.user)
    services.user_session_rekey(old_key=old_key, new_key=request.session.session_key)


@require_GET
@login_required
def sessions(request: HttpRequest) -> HttpResponse:
    """The user's signed-in sessions: device, address, first and last seen; this one marked.
    405 for a method other than GET (ending sessions has routes of its own)."""
    services.user_sessions_prune(user=request.user)
    listing = selectors.user_session_list(
        user=request.user, current_session_key=request.session.session_key
    )
    response = render(request, "accounts/sessions.html", {"sessions": listing})
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@login_required
def session_end(request: HttpRequest, session_id: int) -> HttpResponse:
    """Sign one session out (404 if it is not the user's). Ending this one signs out here."""
    row = selectors.user_session_get_for_user(session_id=session_id, user=request.user)
    if row.session_key == request.session.session_key:
        logout(request)
        messages.info(request, "You are signed out.")
        return redirect("login")
    services.user_session_end(user_session=row)
    messages.success(request, "That session was signed out.")
    return redirect("sessions")


@require_POST
@login_required
def sessions_end_others(request: HttpRequest) -> HttpResponse:
    """Sign out every session of the user except this one."""
    ended = services.user_sessions_end(
        user=request.user, keep_session_key=request.session.session_key
    )
    _keep_this_session(request)
    messages.success(
        request,
        f"Signed out of {ended} other session{'' if ended == 1 else 's'}." if ended
        else "Your other sessions were signed out.",
    )  # fmt: skip
    return redirect("sessions")


@require_POST
@login_required
def sessions_end_all(request: HttpRequest) -> HttpResponse:
    """Sign out everywhere, this session included."""
    services.user_sessions_end(user=request.user)
    logout(request)
    messages.info(request, "You were signed out everywhere, on this device too.")
    return redirect("login")


@require_POST
@login_required
def custom_instructions_set(request: HttpRequest) -> HttpResponse:
    """Store the user's custom instructions (``custom_instructions``; blank clears them),
    applied to every chat from its next turn (services.user_custom_instructions_set). htmx gets
    the form's status line; a plain form post goes back to the settings page with a message.
    400 with the reason for text over services.CUSTOM_INSTRUCTIONS_MAX_CHARS or holding NUL."""
    try:
        services.user_custom_instructions_set(
            user=request.user, text=request.POST.get("custom_instructions", "")
        )
    except ValidationError as exc:
        return HttpResponse(exc.messages[0], status=400, content_type="text/plain")
    saved = "Saved: used from the next message in every chat."
    if not request.user.custom_instructions:
        saved = "Cleared."
    if request.headers.get("HX-Request") == "true":
        return HttpResponse(saved, content_type="text/plain")
    messages.success(request, saved)
    return redirect("settings")


# What a checkbox posts when ticked (browsers send "on" unless it has a value), and what a
# client that spells the value out may send; a missing field is an unticked box.
CHECKBOX_VALUES = {"on": True, "1": True, "true": True, "0": False, "false": False, "off": False}


@require_POST
@login_required
def training_opt_out_set(request: HttpRequest) -> HttpResponse:
    """Store the user's training opt-out (``training_opt_out``: a checkbox, ticked = opted out,
    missing = not; 400 for another value) through services.user_training_opt_out_set, which
    audits a change. htmx gets the form's status line; a plain form post goes back to the
    settings page with a message."""
    raw = request.POST.get("training_opt_out", "0").strip().lower()
    if raw not in CHECKBOX_VALUES:
        return HttpResponse(
            "training_opt_out must be a checkbox value (on or off).",
            status=400, content_type="text/plain",
        )  # fmt: skip
    opt_out = CHECKBOX_VALUES[raw]
    changed = services.user_training_opt_out_set(user=request.user, opt_out=opt_out)
    if not changed:
        saved = "No change."
    elif opt_out:
        saved = "Saved: your messages and answers from now on are not used for training."
    else:
        saved = "Saved: your messages and answers from now on may be used for training."
    if request.headers.get("HX-Request") == "true":
        return HttpResponse(saved, content_type="text/plain")
    messages.success(request, saved)
    return redirect("settings")


@require_POST
@login_required
def theme_set(request: HttpRequest) -> HttpResponse:
    """Store the colour scheme (``theme``: system, light or dark; 400 otherwise). An htmx
    request gets 204 with an ``HX-Trigger`` ``theme-changed`` event carrying the scheme (the page
    switches without a reload: static/chat/layout.js); a plain form post goes back to ``next``
    when it is a path on this site, else to the chat."""
    theme = request.POST.get("theme", "")
    try:
        services.user_theme_set(user=request.user, theme=theme)
    except ValidationError as exc:
        return HttpResponse(exc.messages[0], status=400, content_type="text/plain")
    if request.headers.get("HX-Request") == "true":
        response = HttpResponse(status=204)
        response["HX-Trigger"] = json.dumps({"theme-changed": {"theme": theme}})
        return response
    return redirect(next_on_site(request, request.POST.get("next", "")) or reverse("home"))


@require_http_methods(["GET", "POST"])
@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    """List the user's API keys; POST creates one and shows its secret once. 405 for another
    method."""
    new_key = error = None
    if request.method == "POST":
        try:
            new_key = services.api_key_create(user=request.user, name=request.POST.get("name", ""))
        except ValidationError as exc:
            error = exc.messages[0]
    keys = ApiKey.objects.filter(user=request.user)
    response = render(
        request, "accounts/api_keys.html", {"keys": keys, "new_key": new_key, "error": error},
        status=400 if error else 200,
    )
    response["Cache-Control"] = "no-store"  # the page may hold a secret
    return response


@require_POST
@login_required
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    """Revoke one of the user's keys (404 if it is not theirs)."""
    api_key = get_object_or_404(ApiKey, pk=key_id, user=request.user)
    if api_key.is_active:
        audit_record(
            actor=request.user, action=Action.API_KEY_REVOKE, target_type="accounts.apikey",
            target_id=api_key.pk, details={"prefix": api_key.prefix},
        )  # fmt: skip
    services.api_key_revoke(api_key=api_key)
    return redirect("api-keys")


def duration_words(seconds: float) -> str:
    """A whole duration in words: 3600 -> "1 hour", 5400 -> "90 minutes", 259200 -> "3 days"."""
    seconds = int(seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}{'' if n == 1 else 's'}"
    return f"{seconds} seconds"


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    """The "check your email" page, saying how long the link works."""

    def get_context_data(self, **kwargs):
        return {
            **super().get_context_data(**kwargs),
            "reset_timeout_text": duration_words(settings.PASSWORD_RESET_TIMEOUT),
        }


password_reset_done = PasswordResetDoneView.as_view()
password_reset_complete = auth_views.PasswordResetCompleteView.as_view()
password_change_done = auth_views.PasswordChangeDoneView.as_view()
logout_view = auth_views.LogoutView.as_view()
