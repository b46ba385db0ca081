"""Signals the memory app sends, so the code above it can act on memory changes without memory
importing it (no import cycle: conversations builds prompts from memory, never the reverse; and
memory/blocks.py queues its rebuild through memory/tasks.py, which imports it, by a signal)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by the memory.memory_block_rebuild task after it stored a new memory block for a user,
# with ``user_id`` (int). A receiver returns how many prompt tokens it sent to warm the prefix
# cache (conversations/prefix_warm.py), or 0; it may raise inference.service_client's
# ServiceCallError when the model endpoint cannot be reached (the task logs it).
memory_block_rebuilt = Signal()

# Sent once a transaction that changed user ``user_id``'s facts or memory switch commits
# (memory.blocks.memory_block_touch registers the send with ``transaction.on_commit``). The
# receiver, memory/tasks.py ``queue_block_rebuild`` (connected by memory/apps.py), queues the
# ``memory.memory_block_rebuild`` task, so memory/blocks.py need not import the tasks that
# import it. An exception a receiver raises reaches the sender, as a failed ``.delay`` would.
memory_facts_changed = Signal()
