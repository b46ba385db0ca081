from django.apps import AppConfig


class MemoryConfig(AppConfig):
    """Long-term user memory: facts extracted in the background, embedded in pgvector,
    retrieved per turn (issue 7)."""

    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"
