"""Prompt tokens memory adds to a turn (issue 28: "<= 40 prompt tokens added by memory to a turn
it is irrelevant to"), through the turn's own assembly pieces (conversations/plan.py: the
memory block, its KV-block alignment, the relevant facts put before the question) and the
pool's tokenizer only (no engine is started)."""

from __future__ import annotations


def memory_prompt_tokens(*, user, question: str) -> tuple[int, int, str]:
    """(tokens memory adds to ``user``'s first turn ``question`` without the alignment filler,
    tokens of alignment filler on top, the relevant facts put before the question). Tokens are
    the templated prompt's (the pool's chat template), memory on minus memory off."""
    from accounts.callers import caller_for  # noqa: PLC0415
    from conversations import plan  # noqa: PLC0415
    from gateway import gate  # noqa: PLC0415
    from inference.pools import pool_engine  # noqa: PLC0415
    from inference.prompts import chat_messages  # noqa: PLC0415

    route = gate.route_for(caller_for(user))
    engine = pool_engine(route.pool)
    system_prompt = plan._system_prompt(route)
    instructions = getattr(user, "custom_instructions", "") or ""
    block, relevant = plan._memory(user, question, engine)
    aligned = plan.memory_aligned(
        block, route=route, engine=engine, system_prompt=system_prompt, custom_instructions=instructions
    )

    def tokens(memory: str, text: str) -> int:
        return len(engine.encode_chat(chat_messages(
            system_prompt=system_prompt, memory=memory, question=text, custom_instructions=instructions,
        )))  # fmt: skip

    asked = plan.with_relevant_memory(question, relevant)
    off = tokens("", question)
    on = tokens(block, asked)
    return on - off, tokens(aligned, asked) - on, relevant
