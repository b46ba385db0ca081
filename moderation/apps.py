from django.apps import AppConfig


class ModerationConfig(AppConfig):
    """Moderation gates: the input check before any engine work and the output check beside the
    stream (DESIGN.md's request path)."""

    name = "moderation"
    default_auto_field = "django.db.models.BigAutoField"
