"""bench/engine_bench.py's workloads: the seeded concurrent workload (Poisson arrivals,
multi-turn conversations, realistic prompt and answer lengths) and the single-stream prompts, in
the bench tokenizer's tokens."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.harness import SENTENCES

SINGLE_PROMPT_TOKENS = 200

TOPICS = [
    "the history of the printing press", "how rainbows form", "the rules of chess",
    "growing tomatoes on a balcony", "how a refrigerator works", "the life of honey bees",
    "planning a week-long trip to Portugal", "why the moon has phases", "how to learn to swim",
    "the causes of the French revolution", "how compilers turn code into programs",
    "the water cycle", "training for a first marathon", "how vaccines teach the immune system",
    "the Roman empire's roads", "how to write a good cover letter", "the basics of photography",
    "how volcanoes erupt", "keeping a sourdough starter alive", "the solar system's planets",
]  # fmt: skip


@dataclass(frozen=True)
class Turn:
    user: int
    index: int  # turn number within the user's conversation
    content: str
    max_tokens: int
    think_s: float  # pause before this turn (after the previous answer; 0 for the first)


@dataclass(frozen=True)
class UserPlan:
    user: int
    arrival_s: float
    turns: tuple[Turn, ...]


def filler(rng: random.Random, tokens: int, count_tokens) -> str:
    """Harmless notes of about ``tokens`` tokens (the bench's tokenizer counts them)."""
    parts: list[str] = []
    text = ""
    while True:
        parts.append(rng.choice(SENTENCES))
        candidate = " ".join(parts)
        if count_tokens(candidate) > tokens:
            return text or candidate
        text = candidate


def message(rng: random.Random, prompt_tokens: int, count_tokens) -> str:
    """A user message of about ``prompt_tokens`` tokens asking for a long, detailed answer."""
    topic = rng.choice(TOPICS)
    ask = f"Please write a long, detailed explanation of {topic}, with examples."
    rest = prompt_tokens - count_tokens(ask) - 2
    if rest < 8:
        return ask
    return f"Here are my notes:\n{filler(rng, rest, count_tokens)}\n\n{ask}"


def workload(seed: int, users: int, turns_per_user: int, count_tokens,
             mean_gap_s: float = 0.5) -> list[UserPlan]:
    """The concurrent workload: ``users`` conversations arriving as a Poisson process (mean gap
    ``mean_gap_s``), each ``turns_per_user`` turns; prompt lengths log-uniform in 50..1000
    tokens, answer caps uniform in 32..300, think time exponential (mean 2 s) between turns.
    Deterministic for a seed (and tokenizer)."""
    rng = random.Random(seed)
    plans = []
    t = 0.0
    for u in range(users):
        turns = []
        for k in range(turns_per_user):
            prompt_tokens = int(round(50 * (20 ** rng.random())))  # log-uniform 50..1000
            turns.append(Turn(
                user=u, index=k, content=message(rng, prompt_tokens, count_tokens),
                max_tokens=rng.randint(32, 300),
                think_s=0.0 if k == 0 else round(rng.expovariate(1 / 2.0), 3),
            ))  # fmt: skip
        plans.append(UserPlan(user=u, arrival_s=round(t, 3), turns=tuple(turns)))
        t += rng.expovariate(1 / mean_gap_s)
    return plans


def single_prompts(n: int, count_tokens, system_tokens: int, seed: int = 200) -> list[str]:
    """``n`` different user messages; with the system prompt and the chat template each prompt
    is about SINGLE_PROMPT_TOKENS tokens (``system_tokens``: what the system prompt and the
    template add). ``seed``: another seed gives other messages (no prefix cache hits on the
    single part's)."""
    rng = random.Random(seed)
    return [message(rng, SINGLE_PROMPT_TOKENS - system_tokens, count_tokens) for _ in range(n)]


def single_plans(prompts: list[str], answer_tokens: int) -> list[UserPlan]:
    """One user after another (each waits for the previous: arrival far apart is not enough,
    so they are chained as turns of separate conversations by :func:`run_sequential`)."""
    return [UserPlan(user=i, arrival_s=0.0, turns=(Turn(i, 0, p, answer_tokens, 0.0),))
            for i, p in enumerate(prompts)]  # fmt: skip


def sweep_plans(concurrency: int, turns: int, prompts: list[str],
                answer_tokens: int) -> list[UserPlan]:
    """The sweep's level ``concurrency``: that many users arriving at once, each a conversation
    of ``turns`` turns back to back (no think time), every answer capped at ``answer_tokens``;
    user ``u``'s turn ``k`` asks ``prompts[(u * turns + k) % len(prompts)]``, so the streams
    in flight stay at ``concurrency`` and differ in content. Deterministic."""
    if concurrency < 1 or turns < 1 or not prompts:
        raise ValueError("sweep_plans: concurrency and turns must be >= 1, prompts non-empty")
    return [
        UserPlan(user=u, arrival_s=0.0, turns=tuple(
            Turn(u, k, prompts[(u * turns + k) % len(prompts)], answer_tokens, 0.0)
            for k in range(turns)
        ))
        for u in range(concurrency)
    ]  # fmt: skip


def tokenizer_counter():
    from django.conf import settings  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(settings.CHAT_MODEL_PATH))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    def chat_overhead(system_prompt: str) -> int:
        ids = tokenizer.apply_chat_template(
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": ""}],
            tokenize=True, add_generation_prompt=True,
        )  # fmt: skip
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        return len(ids)

    return count, chat_overhead
