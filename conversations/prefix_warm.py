"""Warming a user's memory block into the engine's prefix cache (issue 19 part 3).

It runs when the memory app says a block was rebuilt (memory/signals.py ``memory_block_rebuilt``,
connected in conversations/apps.py): the prefix is the turn's own assembly (plan.py), so it
lives here, above memory.

After the block is rebuilt (memory/blocks.py), one request of 1 token puts the prefix every new
chat of the user starts with - preamble, site prompt, custom instructions, memory block
(conversations/plan.py new_chat_prefix) - into vLLM's prefix cache, so the user's next new chat
prefills only its own part. It goes the way every background job reaches the model (DESIGN.md,
"How background jobs reach the model"): the server's OpenAI endpoint with the service
credential (inference/service_client.py), at ``CHAT_BACKGROUND_PRIORITY``, on no user's rate
limits. The prompt is sent as token ids (``/v1/completions``), the very ids a turn will send,
under the user's prefix-cache salt (``cache_salt``, gateway/tenancy.py: the salt their turns
carry), so the cached blocks match; warmed under any other salt they would serve nobody. Automatic prefix caching keeps whole KV blocks
(``CHAT_ENGINE_BLOCK_SIZE``, 128 tokens on the CPU by default): the last partial block of the
prefix is recomputed by the turn, as it would be anyway.

With several engines behind the endpoint the request warms the one it lands on; without a
model endpoint (no server running) the warm-up fails, is logged, and turns are no less correct.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import get_user_model

from accounts.callers import caller_for
from conversations.plan import new_chat_prefix
from gateway.tenancy import cache_salt_for
from inference import service_client
from memory.blocks import memory_block_current
from memory.selectors import memory_enabled_for

logger = logging.getLogger(__name__)


def memory_block_warm(*, user_id) -> int:
    """Send user ``user_id``'s new-chat prefix (through their memory block) to the model at
    background priority with ``max_tokens`` 1; returns how many prompt tokens were sent (0:
    nothing to warm - warm-up off (``CHAT_MEMORY_BLOCK_WARM``), the user gone, memory off for
    them, no facts, or an overflow user, whose block is not in the prompt). Raises
    service_client.ServiceCallError when the endpoint cannot be reached or refuses."""
    if not settings.CHAT_MEMORY_BLOCK_WARM:
        return 0
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or not memory_enabled_for(user):
        return 0
    block = memory_block_current(user_id=user_id)
    if block.overflow or not block.text:
        return 0
    caller = caller_for(user)
    route, prefix = new_chat_prefix(user=user, memory=block.text, caller=caller)
    # Under the user's own cache salt: their turns read only blocks cached under it.
    service_client.prompt_complete(prefix, max_tokens=1, model=route.pool.name, cache_salt=cache_salt_for(caller))
    return len(prefix)


def on_memory_block_rebuilt(sender, *, user_id: int, **kwargs) -> int:
    """Receiver of memory/signals.py ``memory_block_rebuilt``: :func:`memory_block_warm`."""
    return memory_block_warm(user_id=user_id)
