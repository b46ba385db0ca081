from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log of administrators' and organisation owners' actions (issue 10): append-only
    rows in the default database, shown to an organisation's owners for their organisation
    (``/orgs/<slug>/audit/``) and to staff in the admin (read-only)."""

    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Mirrors the Django admin's own log (LogEntry: add / change / delete) into the audit log.
        from audit import signals  # noqa: F401, PLC0415
