from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    """Projects (issue 30): chats that share instructions and files."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "projects"
