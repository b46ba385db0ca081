from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    """Thumbs up / down with an optional comment on each answer, counted per pool (issue 8)."""

    name = "feedback"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from feedback import metrics  # noqa: F401, PLC0415 - registers chat_feedback_total
