"""Signals the memory app sends, so the apps above it can act on memory changes without memory
importing them (no import cycle: conversations builds prompts from memory, never the reverse)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by the memory.memory_block_rebuild task after it stored a new memory block for a user,
# with ``user_id`` (int). A receiver returns how many prompt tokens it sent to warm the prefix
# cache (conversations/prefix_warm.py), or 0; it may raise inference.service_client's
# ServiceCallError when the model endpoint cannot be reached (the task logs it).
memory_block_rebuilt = Signal()
