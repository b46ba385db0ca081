from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts import services
from accounts.forms import SignUpForm
from accounts.models import ApiKey


def signup(request: HttpRequest) -> HttpResponse:
    """Create an account (free tier, default region) and sign in."""
    if request.user.is_authenticated:
        return redirect("home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("home")
    return render(request, "registration/signup.html", {"form": form})


@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    """List the user's API keys; POST creates one and shows its secret once."""
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
    services.api_key_revoke(api_key=api_key)
    return redirect("api-keys")
