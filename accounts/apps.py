from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Issue 10: session records at sign-in/out, the OIDC settings check, and the admin's
        # sign-in form under the same failed-sign-in throttle as the site's.
        from django.contrib import admin  # noqa: PLC0415

        from accounts import oidc, signals  # noqa: F401, PLC0415
        from accounts.forms import ThrottledAdminAuthenticationForm  # noqa: PLC0415
        from accounts.models import Membership  # noqa: PLC0415
        from audit.signals import org_rows_register  # noqa: PLC0415

        admin.site.login_form = ThrottledAdminAuthenticationForm
        # The admin's changes to a membership reach its organisation's owners' audit log.
        org_rows_register(Membership)
