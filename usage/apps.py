from django.apps import AppConfig


class UsageConfig(AppConfig):
    """Token usage and cost per turn: the billing ledger (default database)."""

    name = "usage"
    default_auto_field = "django.db.models.BigAutoField"
