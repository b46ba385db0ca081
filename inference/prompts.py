"""Prompt assembly: instructions, memory, summary and history fitted into the context window."""

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
    Raises PromptTooLong if no budget of at least ``MIN_ANSWER_TOKENS`` (or ``max_tokens``, if
    smaller) is possible.
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
    # A caller may ask for fewer than MIN_ANSWER_TOKENS; only a shrunk budget has that floor.
    if budget < min(MIN_ANSWER_TOKENS, max_tokens):
        raise PromptTooLong(
            f"This message is {len(ids):,} tokens long with the instructions; the model's "
            f"context holds {max_model_len:,}. Shorten the message."
        )
    return FittedPrompt(token_ids=ids, dropped_messages=dropped, max_tokens=budget)


# --- Prompt assembly for conversations (issue 4, "Context assembly and summarisation") ---------

CUSTOM_INSTRUCTIONS_HEADING = "The user's instructions for every conversation:"
MEMORY_HEADING = "What you know about the user:"
PROJECT_INSTRUCTIONS_HEADING = "Instructions for this project:"
CONVERSATION_PROMPT_HEADING = "Instructions for this conversation:"
SUMMARY_HEADING = "Summary of the earlier conversation:"


@dataclass(frozen=True)
class AssembledPrompt:
    """A conversation prompt assembled within the token budget.

    ``token_ids``: the templated prompt for the engine. ``messages``: the chat messages it was
    made from ([{role, content}], one system message first when there is any instruction).
    ``kept_exchanges`` / ``dropped_exchanges``: of the exchanges offered, how many went in
    verbatim (the newest) and how many (the oldest) were left out to fit. ``used_memory`` /
    ``used_summary``: whether those blocks fitted. ``max_tokens``: the completion budget left
    (the requested one unless the newest message alone leaves less). ``budget``: the prompt
    budget, ``max_model_len - max_tokens`` as requested (tokens).
    """

    token_ids: list[int]
    messages: list[dict[str, str]]
    kept_exchanges: int
    dropped_exchanges: int
    used_memory: bool
    used_summary: bool
    max_tokens: int
    budget: int

    @property
    def fill(self) -> float:
        """How much of the prompt budget the prompt takes (0..1, may exceed 1 when only the
        newest message is left and the completion budget shrank)."""
        return len(self.token_ids) / self.budget if self.budget > 0 else 1.0


def system_message(
    system_prompt: str,
    memory: str = "",
    summary: str = "",
    *,
    custom_instructions: str = "",
    conversation_prompt: str = "",
    project_instructions: str = "",
) -> str:
    """The one system message, in the order DESIGN.md ("Memory in the prompt") gives:
    ``system_prompt`` (the pool's preamble, then the site's prompt), the user's
    ``custom_instructions`` (the same in every chat of theirs), the user-memory block, the
    ``project_instructions`` of the project the chat is in (the same in every chat of the
    project; issue 30), the conversation's own ``conversation_prompt``, then the running summary. What changes least
    comes first, so consecutive turns - and a user's new chats - share the longest token
    prefix and vLLM's prefix cache reuses its KV blocks (automatic prefix caching hashes whole
    blocks from the start of the prompt: a change invalidates only what comes after it).
    Each part after the first carries a heading; blank parts are left out.

    One system message rather than several: many chat templates accept a single system message
    only, and ChatML-style ones render it the same way."""
    parts = [system_prompt.strip()] if system_prompt.strip() else []
    for heading, text in (
        (CUSTOM_INSTRUCTIONS_HEADING, custom_instructions),
        (MEMORY_HEADING, memory),
        (PROJECT_INSTRUCTIONS_HEADING, project_instructions),
        (CONVERSATION_PROMPT_HEADING, conversation_prompt),
        (SUMMARY_HEADING, summary),
    ):
        if text.strip():
            parts.append(f"{heading}\n{text.strip()}")
    return "\n\n".join(parts)


# The filler that pads a memory block to a KV block boundary: one token per unit with the BPE
# tokenizers of the models served here (a space and a full stop are one pre-token, never merged
# with the next unit), and it does not end in whitespace, which system_message strips.
ALIGN_UNIT = " ."


def kv_block_aligned(memory: str, *, prefix_tokens: Callable[[str], int], block_size: int) -> str:
    """``memory`` with filler appended (a new line, then :data:`ALIGN_UNIT` repeated) so that
    ``prefix_tokens(result)`` - the length in tokens of the prompt prefix that ends with the
    memory block, as every new chat of the user starts - is a multiple of ``block_size``.

    Why: vLLM's automatic prefix caching reuses whole KV blocks only (``block_size`` tokens,
    128 on the CPU), so the part of a cached prefix after its last full block is prefilled again
    by every request. A memory block that ends mid-block makes every new chat (and, through the
    history after it, every later turn) prefill that tail; ending it on a boundary makes the
    whole block reusable. The filler costs fewer than ``block_size`` tokens of KV per
    conversation. The same inputs always give the same bytes, so the block stays
    byte-identical across the user's conversations.

    Returns ``memory`` unchanged when it is empty, ``block_size`` <= 1, it is aligned already,
    or no padding under ``2 * block_size`` units reaches a boundary (a tokenizer that merges
    the filler). ``prefix_tokens``: padded memory -> token count; called a few times."""
    if not memory.strip() or block_size <= 1:
        return memory
    if prefix_tokens(memory) % block_size == 0:
        return memory
    units = 1
    for _ in range(4):  # each unit is one token: the first correction normally lands exactly
        padded = f"{memory}\n{ALIGN_UNIT * units}"
        length = prefix_tokens(padded)
        if length % block_size == 0:
            return padded
        units += (-length) % block_size
        if units >= 2 * block_size:
            break
    return memory


def chat_messages(
    *,
    system_prompt: str,
    memory: str = "",
    summary: str = "",
    exchanges: Sequence[tuple[str, str | Sequence[dict]]] = (),
    question: str | None = None,
    custom_instructions: str = "",
    conversation_prompt: str = "",
    tools_section: str = "",
    after_question: Sequence[dict] = (),
    project_instructions: str = "",
) -> list[dict]:
    """Chat messages in the assembly's order: the system message (:func:`system_message`, then
    ``tools_section``, the function definitions in the Hermes format (inference/tool_format.py),
    last: stable from turn to turn, so in the cached prefix; left out when empty), each
    (user, assistant) exchange oldest first, then ``question`` as the last user message (None:
    no question, e.g. to count the tokens of a history) and ``after_question``, the tool rounds
    of the answer being written. An exchange's assistant part is a text, or OpenAI-shaped
    messages (calls, results, text) for an answer written after tool calls; such messages go to
    the template through inference/tool_format.py ``hermes_messages`` (or as they are, for a
    template with a tool format). ``project_instructions``: the project's, in the system
    message (:func:`system_message`)."""
    system = system_message(
        system_prompt, memory, summary,
        custom_instructions=custom_instructions, conversation_prompt=conversation_prompt,
        project_instructions=project_instructions,
    )  # fmt: skip
    if tools_section:
        system = "\n\n".join(p for p in (system, tools_section) if p)
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in exchanges:
        messages.append({"role": "user", "content": user})
        if isinstance(assistant, str):
            messages.append({"role": "assistant", "content": assistant})
        else:  # an answer after tool rounds: its calls, their results, then its text
            messages.extend(assistant)
    if question is not None:
        messages.append({"role": "user", "content": question})
        messages.extend(after_question)
    return messages


def largest_fitting(count: int, fits: Callable[[int], bool]) -> int:
    """The largest ``k`` in ``0..count`` with ``fits(k)``, where ``fits`` is monotone (true up to
    some k, false after) and ``fits(0)`` holds. Binary search: O(log count) calls, each of which
    usually tokenizes a whole prompt."""
    low, high = 0, count
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def prompt_assemble(
    *,
    system_prompt: str,
    question: str,
    exchanges: Sequence[tuple[str, str]],
    encode_chat: Callable[[Sequence[dict[str, str]]], list[int]],
    max_model_len: int,
    max_tokens: int,
    memory: str = "",
    summary: str = "",
    custom_instructions: str = "",
    conversation_prompt: str = "",
    tools_section: str = "",
    after_question: Sequence[dict] = (),
    project_instructions: str = "",
) -> AssembledPrompt:
    """Assemble a conversation's prompt within ``budget = max_model_len - max_tokens`` tokens.

    Filled in this order (issue 4): the instructions (never trimmed: ``system_prompt``, the
    user's ``custom_instructions``, the ``project_instructions`` and the
    ``conversation_prompt``), the user-memory block,
    the running summary, then the most recent whole exchanges (``exchanges``: (user, assistant)
    texts, oldest first, after the part the summary covers); the oldest exchanges are dropped
    first, never half an exchange. ``question`` (the new user message) always goes in, last.
    Memory or summary is left out only if it does not fit even with no exchange at all. In the
    system message the parts stand in :func:`system_message`'s order (prefix-cache friendly).

    If the system prompt and the question alone exceed the budget, the completion budget
    shrinks (down to ``MIN_ANSWER_TOKENS``) so the question is still answered; if even that does
    not fit, raises PromptTooLong (the message names the sizes). Token counts are exact: each
    candidate prompt is templated and tokenized by ``encode_chat`` (O(log n) calls).
    """
    budget = max_model_len - max_tokens
    instructions = {
        "custom_instructions": custom_instructions,
        "conversation_prompt": conversation_prompt,
        "tools_section": tools_section,
        "project_instructions": project_instructions,
    }
    # The question and the tool rounds of the answer being written go in together, always.
    instructions_and_tail = {**instructions, "after_question": after_question}

    def encode(*, memory_in: bool, summary_in: bool, keep: int) -> list[int]:
        kept = list(exchanges[len(exchanges) - keep :]) if keep else []
        return encode_chat(
            chat_messages(
                system_prompt=system_prompt,
                memory=memory if memory_in else "",
                summary=summary if summary_in else "",
                exchanges=kept,
                question=question,
                **instructions_and_tail,
            )
        )

    base = encode(memory_in=False, summary_in=False, keep=0)
    if len(base) > budget:
        room = max_model_len - len(base)
        if room < min(MIN_ANSWER_TOKENS, max_tokens):
            raise PromptTooLong(
                f"This message is {len(base):,} tokens long with the instructions; the model's "
                f"context holds {max_model_len:,}. Shorten the message."
            )
        messages = chat_messages(system_prompt=system_prompt, question=question, **instructions_and_tail)
        return AssembledPrompt(
            token_ids=base, messages=messages, kept_exchanges=0,
            dropped_exchanges=len(exchanges), used_memory=False, used_summary=False,
            max_tokens=min(max_tokens, room), budget=budget,
        )  # fmt: skip
    use_memory = bool(memory.strip()) and len(encode(memory_in=True, summary_in=False, keep=0)) <= budget
    use_summary = (
        bool(summary.strip())
        and len(encode(memory_in=use_memory, summary_in=True, keep=0)) <= budget
    )
    keep = largest_fitting(
        len(exchanges),
        lambda k: len(encode(memory_in=use_memory, summary_in=use_summary, keep=k)) <= budget,
    )
    token_ids = encode(memory_in=use_memory, summary_in=use_summary, keep=keep)
    messages = chat_messages(
        system_prompt=system_prompt,
        memory=memory if use_memory else "",
        summary=summary if use_summary else "",
        exchanges=list(exchanges[len(exchanges) - keep :]) if keep else [],
        question=question,
        **instructions_and_tail,
    )
    return AssembledPrompt(
        token_ids=token_ids, messages=messages, kept_exchanges=keep,
        dropped_exchanges=len(exchanges) - keep, used_memory=use_memory,
        used_summary=use_summary, max_tokens=max_tokens, budget=budget,
    )  # fmt: skip
