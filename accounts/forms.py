from django.contrib.auth.forms import UserCreationForm

from accounts.models import User


class SignUpForm(UserCreationForm):
    """Sign-up with username and password; tier and region take their defaults."""

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username",)
