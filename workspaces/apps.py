from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    """Organisation workspaces: invitations, members and roles, org policies, conversations
    shared with the workspace (issue 8)."""

    name = "workspaces"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit.signals import org_rows_register  # noqa: PLC0415
        from workspaces.models import Invitation  # noqa: PLC0415

        # The admin's changes to an invitation reach its organisation's owners' audit log.
        org_rows_register(Invitation)
