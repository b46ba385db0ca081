"""Account forms: sign-up, and sign-in with failed attempts throttled (accounts/throttle.py).

Password rules come from ``settings.AUTH_PASSWORD_VALIDATORS`` (length, similarity to the
username and email, a common-password list, not all digits); Django's sign-up, set-password
(reset) and password-change forms all apply them.
"""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import authenticate, password_validation
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm
from django.core.exceptions import ValidationError

from accounts import throttle
from accounts.models import User
from accounts.request_info import client_ip


class SignUpForm(UserCreationForm):
    """Sign-up with username, an optional email (for password resets) and password; tier and
    region take their defaults."""

    email = forms.EmailField(
        required=False,
        help_text="Optional. Where a password reset link can be sent if you forget your password.",
    )

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Django's own help texts (a four-item list under the password) put the button below the
        # fold of a 1280x800 window (issue 29, 7): one line each, saying the same rules.
        self.fields["username"].help_text = "Letters, digits and @ . + - _ only, up to 150."
        self.fields["password1"].help_text = password_rules()
        self.fields["password2"].help_text = ""


def password_rules() -> str:
    """The password rules of ``settings.AUTH_PASSWORD_VALIDATORS`` in one sentence, e.g. "At
    least 12 characters; not like your username or email, not a common password, not only
    digits." (the minimum read from the MinimumLengthValidator configured, if any)."""
    rules = []
    for validator in password_validation.get_default_password_validators():
        if isinstance(validator, password_validation.MinimumLengthValidator):
            rules.insert(0, f"At least {validator.min_length} characters")
        elif isinstance(validator, password_validation.UserAttributeSimilarityValidator):
            rules.append("not like your username or email")
        elif isinstance(validator, password_validation.CommonPasswordValidator):
            rules.append("not a common password")
        elif isinstance(validator, password_validation.NumericPasswordValidator):
            rules.append("not only digits")
    if not rules:
        return ""
    head, rest = (rules[0], rules[1:]) if rules[0].startswith("At least") else ("", rules)
    sentence = "; ".join(part for part in (head, ", ".join(rest)) if part)
    return sentence[0].upper() + sentence[1:] + "."


class ThrottledLoginMixin:
    """Sign-in that counts failures per account and per address and refuses while either is
    locked (accounts/throttle.py), with the lock's own message (error code ``"locked"``).

    ``lockout`` is the :class:`~accounts.throttle.Lockout` that refused the sign-in, if any
    (the view answers 429 with its Retry-After).
    """

    lockout: throttle.Lockout | None = None

    def clean(self):
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if username is None or not password:
            return self.cleaned_data
        ip = client_ip(self.request)
        lockout = throttle.login_lockout(username=username, ip=ip)
        if lockout is None:
            self.user_cache = authenticate(self.request, username=username, password=password)
            if self.user_cache is not None:
                self.confirm_login_allowed(self.user_cache)
                throttle.login_account_clear(username=username)
                return self.cleaned_data
            lockout = throttle.login_failed(username=username, ip=ip)
            if lockout is None:
                raise self.get_invalid_login_error()
        self.lockout = lockout
        raise ValidationError(lockout.message, code="locked")


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    """The sign-in page's form."""


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    """The admin's sign-in form (the same counters: /admin/login/ is no way around them)."""
