from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chatsite import dbrouter  # noqa: PLC0415 - apps load first
        from conversations import regions  # noqa: PLC0415
        from conversations.prefix_warm import on_memory_block_rebuilt  # noqa: PLC0415 - apps load first
        from memory.signals import memory_block_rebuilt  # noqa: PLC0415

        # A rebuilt memory block is warmed into the prefix cache (conversations/prefix_warm.py).
        memory_block_rebuilt.connect(on_memory_block_rebuilt, dispatch_uid="conversations.prefix_warm")
        # The database router asks this app where an unsaved conversation row belongs.
        dbrouter.instance_locator_set(regions)
