from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from conversations.prefix_warm import on_memory_block_rebuilt  # noqa: PLC0415 - apps load first
        from conversations.region_locator import ConversationRegionLocator  # noqa: PLC0415
        from core import dbrouter, regions  # noqa: PLC0415
        from memory.signals import memory_block_rebuilt  # noqa: PLC0415

        # A rebuilt memory block is warmed into the prefix cache (conversations/prefix_warm.py).
        memory_block_rebuilt.connect(on_memory_block_rebuilt, dispatch_uid="conversations.prefix_warm")
        # Region routing (core/regions.py) asks this app about conversations and memberships,
        # and the database router asks core/regions.py where an unsaved conversation row belongs.
        regions.region_locator_set(ConversationRegionLocator())
        dbrouter.instance_locator_set(regions)
