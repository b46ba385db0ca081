from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    """Thumbs up / down with an optional comment on each answer, counted per pool (issue 8)."""

    name = "feedback"
    default_auto_field = "django.db.models.BigAutoField"
