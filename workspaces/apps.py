from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    """Organisation workspaces: invitations, members and roles, org policies, conversations
    shared with the workspace (issue 8)."""

    name = "workspaces"
    default_auto_field = "django.db.models.BigAutoField"
