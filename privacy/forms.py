"""Confirmation forms of the privacy pages: the account's password (or, for an account that
signs in only through single sign-on and has none, its username typed out), and for an
organisation's deletion also its URL name."""

from __future__ import annotations

from django import forms

from accounts.models import User


class ConfirmForm(forms.Form):
    """``password`` checked against ``user``'s, or ``username`` typed exactly when the account
    has no usable password. ``slug`` (when ``slug`` is given): the organisation's URL name."""

    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
    )
    username = forms.CharField(required=False, max_length=150)
    slug = forms.CharField(required=False, max_length=50)

    def __init__(self, *args, user: User, slug: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.expected_slug = slug
        self.password_failed = False

    @property
    def uses_password(self) -> bool:
        return self.user.has_usable_password()

    def clean(self):
        data = super().clean()
        if self.expected_slug is not None and data.get("slug", "").strip() != self.expected_slug:
            self.add_error(
                "slug", f"Type the organisation's URL name, {self.expected_slug}, to confirm."
            )
        if self.uses_password:
            if not data.get("password"):
                self.add_error("password", "Enter your password to confirm.")
            elif not self.user.check_password(data["password"]):
                self.password_failed = True
                self.add_error("password", "That is not your password.")
        elif data.get("username", "").strip() != self.user.get_username():
            self.add_error(
                "username", f"Type your username, {self.user.get_username()}, to confirm."
            )
        return data
