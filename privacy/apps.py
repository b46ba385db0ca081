from django.apps import AppConfig


class PrivacyConfig(AppConfig):
    """A person's data (issue 10): exporting it (and an organisation's, for its owners) and
    deleting an account in every region's database, with what the law lets us keep anonymised."""

    name = "privacy"
    default_auto_field = "django.db.models.BigAutoField"
