from django.apps import AppConfig


class SharingConfig(AppConfig):
    """Share links: read-only snapshots of a conversation under an unguessable URL (issue 8)."""

    name = "sharing"
    default_auto_field = "django.db.models.BigAutoField"
