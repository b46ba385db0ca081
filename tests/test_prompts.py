"""inference.prompts.prompt_fit: history fitted into the context window."""

from __future__ import annotations

import pytest

from inference.prompts import MIN_ANSWER_TOKENS, PromptTooLong, prompt_fit


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
