from django.apps import AppConfig


class MemoryConfig(AppConfig):
    """Long-term user memory: facts extracted in the background, embedded in pgvector,
    retrieved per turn (issue 7)."""

    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects memory/tasks.py's receiver of memory_facts_changed (the block rebuild is
        # queued after a change of a user's facts commits), in web and worker processes alike.
        from memory import tasks  # noqa: F401, PLC0415
