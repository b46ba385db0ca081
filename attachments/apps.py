from django.apps import AppConfig


class AttachmentsConfig(AppConfig):
    """Files uploaded into a turn (text, Markdown, source code, PDF), their extracted text
    joining the prompt (issue 8)."""

    name = "attachments"
    default_auto_field = "django.db.models.BigAutoField"
