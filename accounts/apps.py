from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the model-pool system check (manage.py check and server start).
        from accounts import checks  # noqa: F401, PLC0415
