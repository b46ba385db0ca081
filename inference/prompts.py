"""Prompt assembly: system prompt + history fitted into the model's context window."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


class PromptTooLong(ValueError):
    """Even the newest message alone does not leave room for an answer in the context."""


@dataclass(frozen=True)
class FittedPrompt:
    """Token ids for the engine, how many history messages were dropped, and the completion
    budget (tokens) left in the context window."""

    token_ids: list[int]
    dropped_messages: int
    max_tokens: int


MIN_ANSWER_TOKENS = 16


def prompt_fit(
    *,
    system_prompt: str,
    messages: Sequence[dict[str, str]],
    encode_chat: Callable[[Sequence[dict[str, str]]], list[int]],
    max_model_len: int,
    max_tokens: int,
) -> FittedPrompt:
    """Fit ``messages`` (oldest first, the last is the user's new message) into the context.

    The oldest messages are dropped, a user/assistant pair at a time, until the templated prompt
    leaves room for ``max_tokens`` completion tokens within ``max_model_len``; if even the last
    message alone does not, the completion budget shrinks, down to ``MIN_ANSWER_TOKENS``.
    Raises PromptTooLong if no budget of at least ``MIN_ANSWER_TOKENS`` is possible.
    """
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    history = list(messages)
    dropped = 0
    while True:
        ids = encode_chat(system + history)
        room = max_model_len - len(ids)
        if room >= max_tokens or len(history) <= 1:
            break
        # Drop the oldest exchange (user + assistant) so roles keep alternating.
        step = 2 if len(history) > 2 else 1
        history = history[step:]
        dropped += step
    budget = min(max_tokens, room)
    if budget < MIN_ANSWER_TOKENS:
        raise PromptTooLong(
            f"This message is {len(ids):,} tokens long with the instructions; the model's "
            f"context holds {max_model_len:,}. Shorten the message."
        )
    return FittedPrompt(token_ids=ids, dropped_messages=dropped, max_tokens=budget)
