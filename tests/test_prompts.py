"""inference.prompts.prompt_fit: history fitted into the context window."""

from __future__ import annotations

import pytest

from inference.prompts import (
    ALIGN_UNIT,
    MIN_ANSWER_TOKENS,
    PromptTooLong,
    kv_block_aligned,
    prompt_fit,
)


def encode_words(messages):
    """1 token per word plus 2 per message, like a chat template's role markers."""
    return [0] * sum(2 + len(m["content"].split()) for m in messages)


def history(n_pairs: int, words: int = 10):
    messages = []
    for i in range(n_pairs):
        messages.append({"role": "user", "content": f"q{i} " + "w " * (words - 1)})
        messages.append({"role": "assistant", "content": f"a{i} " + "w " * (words - 1)})
    messages.append({"role": "user", "content": "latest question"})
    return messages


def test_everything_is_kept_when_it_fits():
    fitted = prompt_fit(
        system_prompt="be brief", messages=history(2), encode_chat=encode_words,
        max_model_len=1000, max_tokens=100,
    )  # fmt: skip
    assert fitted.dropped_messages == 0
    assert fitted.max_tokens == 100
    assert len(fitted.token_ids) == 4 + 4 * 12 + 4


def test_oldest_exchanges_are_dropped_first_to_leave_room_for_the_answer():
    seen = []

    def encode(messages):
        seen.append([m["content"].split()[0] for m in messages])
        return encode_words(messages)

    fitted = prompt_fit(
        system_prompt="", messages=history(5), encode_chat=encode,
        max_model_len=60, max_tokens=20,
    )  # fmt: skip
    assert fitted.dropped_messages % 2 == 0 and fitted.dropped_messages > 0
    assert len(fitted.token_ids) + 20 <= 60
    assert seen[-1][-1] == "latest"  # the new message always stays
    assert seen[-1][0].startswith("q")  # a user message still leads


def test_budget_shrinks_when_only_the_last_message_is_left():
    fitted = prompt_fit(
        system_prompt="", messages=[{"role": "user", "content": "w " * 40}],
        encode_chat=encode_words, max_model_len=60, max_tokens=50,
    )  # fmt: skip
    assert fitted.max_tokens == 60 - 42


def test_message_too_long_for_any_answer_raises():
    with pytest.raises(PromptTooLong):
        prompt_fit(
            system_prompt="", messages=[{"role": "user", "content": "w " * 58}],
            encode_chat=encode_words, max_model_len=60 + MIN_ANSWER_TOKENS - 1, max_tokens=50,
        )  # fmt: skip


# --- prompt_assemble: system, memory, summary, then the newest whole exchanges (issue 4) -------

from inference.prompts import chat_messages, largest_fitting, prompt_assemble  # noqa: E402


def exchanges(n: int, words: int = 10) -> list[tuple[str, str]]:
    return [(f"q{i} " + "w " * (words - 1), f"a{i} " + "w " * (words - 1)) for i in range(n)]


def recording(encode):
    """``encode`` that also keeps the messages of its last call."""
    calls = []

    def wrapped(messages):
        calls.append(list(messages))
        return encode(messages)

    wrapped.calls = calls
    return wrapped


def assemble(**overrides):
    args = {
        "system_prompt": "be brief", "question": "latest question", "exchanges": exchanges(3),
        "encode_chat": encode_words, "max_model_len": 1000, "max_tokens": 100,
    }  # fmt: skip
    args.update(overrides)
    return prompt_assemble(**args)


def test_assembly_orders_system_memory_summary_then_exchanges_then_the_question():
    """Given memory, a summary and history that all fit, when the prompt is assembled, then one
    system message carries the instructions, then memory, then summary (that order), followed
    by every exchange oldest first and the new question last."""
    result = assemble(memory="likes tea", summary="we talked about cats")

    system = result.messages[0]
    assert system["role"] == "system"
    assert system["content"].index("be brief") < system["content"].index("likes tea")
    assert system["content"].index("likes tea") < system["content"].index("we talked about cats")
    assert [m["content"].split()[0] for m in result.messages[1:]] == [
        "q0", "a0", "q1", "a1", "q2", "a2", "latest",
    ]  # fmt: skip
    assert (result.kept_exchanges, result.dropped_exchanges) == (3, 0)
    assert result.used_memory and result.used_summary
    assert result.token_ids == encode_words(result.messages)


def test_oldest_whole_exchanges_are_dropped_first_when_over_budget():
    """Given 10 exchanges of 24 tokens (2 x (2 + 10)) and a budget of 100 tokens after the
    answer's share, when assembled, then only the newest whole exchanges that fit remain (never
    half of one), the count of dropped ones is reported, and the prompt is within budget."""
    result = assemble(exchanges=exchanges(10), max_model_len=150, max_tokens=50)

    assert len(result.token_ids) <= 100
    contents = [m["content"].split()[0] for m in result.messages[1:-1]]
    assert contents == ["q7", "a7", "q8", "a8", "q9", "a9"]
    assert (result.kept_exchanges, result.dropped_exchanges) == (3, 7)
    # One more exchange would not have fitted: the fewest possible were dropped.
    assert len(encode_words(chat_messages(
        system_prompt="be brief", exchanges=exchanges(10)[6:], question="latest question"
    ))) > 100  # fmt: skip
    assert result.max_tokens == 50


def test_the_summary_goes_in_before_any_exchange_and_memory_before_the_summary():
    """Given a budget that holds the system prompt, memory, summary and question but little
    history, when assembled, then memory and summary are kept and exchanges are dropped."""
    summary = "s " * 30
    result = assemble(memory="m " * 20, summary=summary, exchanges=exchanges(5), max_model_len=130, max_tokens=40)

    assert result.used_memory and result.used_summary
    assert result.dropped_exchanges >= 4
    assert len(result.token_ids) <= 90


def test_a_summary_that_does_not_fit_is_left_out_but_memory_stays():
    """Given a summary too long for the budget, when assembled, then the memory block and the
    question still go in, the summary does not, and nothing exceeds the budget."""
    result = assemble(memory="m " * 10, summary="s " * 500, exchanges=[], max_model_len=200, max_tokens=100)

    assert result.used_memory and not result.used_summary
    assert "s s s" not in result.messages[0]["content"]
    assert len(result.token_ids) <= 100


def test_the_system_prompt_is_never_trimmed():
    """Given a long system prompt and history over budget, when assembled, then the system
    prompt is in the prompt whole, and history is what gives way."""
    system = "rule " * 50
    result = assemble(system_prompt=system, exchanges=exchanges(10), max_model_len=200, max_tokens=50)

    assert result.messages[0]["content"] == system.strip()
    assert result.dropped_exchanges > 0


def test_a_system_prompt_that_alone_does_not_fit_raises_prompt_too_long():
    with pytest.raises(PromptTooLong):
        assemble(system_prompt="rule " * 100, exchanges=exchanges(2), max_model_len=100, max_tokens=20)


def test_a_long_question_shrinks_the_answer_budget_and_drops_all_history():
    """Given a question that with the instructions exceeds the budget but leaves at least
    MIN_ANSWER_TOKENS of context, when assembled, then no history goes in and the completion
    budget is what is left of the context."""
    result = assemble(question="w " * 60, exchanges=exchanges(2), max_model_len=100, max_tokens=50)

    assert result.kept_exchanges == 0 and result.dropped_exchanges == 2
    assert result.max_tokens == 100 - len(result.token_ids)
    assert result.max_tokens >= MIN_ANSWER_TOKENS


def test_consecutive_turns_share_a_prefix_up_to_the_previous_question():
    """Given a conversation that grows by one exchange a turn (all within budget), when two
    consecutive turns are assembled with the same memory and summary, then the earlier prompt's
    tokens are a prefix of the later one's up to its final assistant header: what lets vLLM's
    prefix cache reuse the KV blocks (issue 4)."""
    def encode_tokens(messages):  # distinct ids per word, so a prefix check means something
        ids = []
        for m in messages:
            ids += [hash(m["role"]) % 1000] + [hash(w) % 50_000 for w in m["content"].split()]
        return ids

    history = exchanges(4)
    turn_4 = assemble(memory="m", summary="s", exchanges=history[:3], question=history[3][0], encode_chat=encode_tokens)
    turn_5 = assemble(memory="m", summary="s", exchanges=history, question="next", encode_chat=encode_tokens)

    assert turn_5.token_ids[: len(turn_4.token_ids)] == turn_4.token_ids


def test_assembly_tokenizes_a_logarithmic_number_of_times():
    """Given 1,000 exchanges, when assembled over budget, then the exact token count is found
    with a binary search (tens of tokenizations, not a thousand)."""
    encode = recording(encode_words)
    assemble(exchanges=exchanges(1000), encode_chat=encode, max_model_len=2000, max_tokens=100)

    assert len(encode.calls) <= 15


@pytest.mark.parametrize("limit", [0, 1, 5, 9, 10])
def test_largest_fitting_finds_the_boundary(limit):
    assert largest_fitting(10, lambda k: k <= limit) == limit


# --- the memory block aligned to a KV block boundary (issue 19 part 3) ---------------------


def word_tokens(text: str) -> int:
    """A tokenizer double: one token per whitespace-separated word."""
    return len(text.split())


def test_a_memory_block_is_padded_so_its_prefix_ends_on_a_kv_block_boundary():
    """Given a prefix of 10 + len(memory) tokens and 16-token KV blocks, the padded block's
    prefix is 32 tokens: a whole number of blocks, so the prefix cache can reuse all of it."""
    memory = "- likes tea\n- lives in Lyon"  # 7 words

    padded = kv_block_aligned(memory, prefix_tokens=lambda m: 10 + word_tokens(m), block_size=16)

    assert padded.startswith(memory + "\n") and padded.endswith(ALIGN_UNIT)
    assert (10 + word_tokens(padded)) % 16 == 0 and 10 + word_tokens(padded) == 32
    assert padded == kv_block_aligned(memory, prefix_tokens=lambda m: 10 + word_tokens(m), block_size=16)


def test_an_aligned_or_empty_block_and_alignment_off_leave_the_memory_as_it_is():
    memory = "- a b c d e f"  # 7 words; with 9 before it: 16

    assert kv_block_aligned(memory, prefix_tokens=lambda m: 9 + word_tokens(m), block_size=16) == memory
    assert kv_block_aligned("", prefix_tokens=lambda m: 3, block_size=16) == ""
    assert kv_block_aligned(memory, prefix_tokens=lambda m: 10 + word_tokens(m), block_size=1) == memory


def test_a_tokenizer_that_merges_the_filler_gets_the_block_unpadded():
    """Given a tokenizer that counts the filler as nothing (it merges every unit), no padding
    can reach a boundary: the memory comes back unchanged rather than padded in vain."""
    memory = "- likes tea"

    padded = kv_block_aligned(
        memory, prefix_tokens=lambda m: 5 + word_tokens(m.replace(ALIGN_UNIT, "")), block_size=16
    )

    assert padded == memory


class WordEngine:
    """An engine double for memory_aligned: the templated chat's words are its tokens."""

    def encode_chat(self, messages):
        return " ".join(m["content"] for m in messages).split()


def test_a_memory_block_whose_filler_would_pass_the_prompt_cap_goes_in_unpadded(settings):
    """Issue 28: memory adds at most CHAT_MEMORY_PROMPT_MAX_TOKENS to a turn. Given 128-token KV
    blocks and a 6-word profile, aligning it takes ~100 tokens of filler: with the cap at 40 the
    block goes in as it is; with a cap past the filler it is padded to the boundary."""
    from types import SimpleNamespace  # noqa: PLC0415

    from conversations.plan import memory_aligned  # noqa: PLC0415

    settings.CHAT_MEMORY_ALIGN_TOKENS = 128
    route = SimpleNamespace(pool=SimpleNamespace(name="words", version="1"))
    profile = "- The user's name is Ada."

    def aligned() -> str:
        return memory_aligned(profile, route=route, engine=WordEngine(), system_prompt="Be brief.",
                              custom_instructions="")

    settings.CHAT_MEMORY_PROMPT_MAX_TOKENS = 40
    assert aligned() == profile

    settings.CHAT_MEMORY_PROMPT_MAX_TOKENS = 1000
    padded = aligned()
    assert padded.startswith(profile + "\n") and padded.endswith(ALIGN_UNIT)
    prefix = WordEngine().encode_chat(chat_messages(system_prompt="Be brief.", memory=padded, question="1"))
    assert (len(prefix) - 1) % 128 == 0  # the prefix before the question: whole KV blocks
