"""Account URLs (included at the site root by chatsite/urls.py): sign-in and sign-up, password
reset and change (Django's URL names, so ``{% url 'login' %}`` etc. work everywhere), the
signed-in sessions page, and, only when ``CHAT_OIDC_ENABLED``, the OpenID Connect endpoints."""

from django.conf import settings
from django.urls import path

from accounts import views

urlpatterns = [
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    path("accounts/logout/", views.logout_view, name="logout"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/password_change/", views.PasswordChangeView.as_view(), name="password_change"),
    path("accounts/password_change/done/", views.password_change_done, name="password_change_done"),
    path("accounts/password_reset/", views.PasswordResetView.as_view(), name="password_reset"),
    path("accounts/password_reset/done/", views.password_reset_done, name="password_reset_done"),
    path(
        "accounts/reset/<uidb64>/<token>/",
        views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path("accounts/reset/done/", views.password_reset_complete, name="password_reset_complete"),
    path("settings/theme", views.theme_set, name="theme-set"),
    path("settings/instructions", views.custom_instructions_set, name="custom-instructions-set"),
    path("settings/training", views.training_opt_out_set, name="training-opt-out-set"),
    path("settings/sessions/", views.sessions, name="sessions"),
    path("settings/sessions/<int:session_id>/end", views.session_end, name="session-end"),
    path("settings/sessions/end-others", views.sessions_end_others, name="sessions-end-others"),
    path("settings/sessions/end-all", views.sessions_end_all, name="sessions-end-all"),
]

if settings.CHAT_OIDC_ENABLED:
    from accounts import oidc

    urlpatterns += [
        path(
            "accounts/oidc/authenticate/",
            oidc.OIDCAuthenticateView.as_view(),
            name="oidc_authentication_init",
        ),
        path(
            "accounts/oidc/callback/",
            oidc.OIDCCallbackView.as_view(),
            name="oidc_authentication_callback",
        ),
    ]
