"""Prefix-cache hit rate over a 10-turn conversation: the product's prompt assembly vs a naive
one that puts changing content first (issue 4, "Context assembly and summarisation").

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.context_bench [--turns 10] [--max-tokens 64]

One real vLLM engine (:class:`inference.engine.VllmEngine`, the product's engine arguments:
automatic prefix caching is vLLM V1's default) plays the same 10 user messages twice, greedy,
each run answering from its own earlier answers, with the prefix cache reset before each run:

- **ours**: ``inference.prompts.prompt_assemble``: system prompt, user memory, running summary,
  then the turns, oldest first, then the new message. What changes each turn comes last.
- **naive** (the baseline): the same content, but the system message starts with a line that
  changes on every request (the current time, as many templates do), so no two prompts share
  more than the chat template's first tokens.

Per request vLLM reports ``num_cached_tokens``: prompt tokens whose KV blocks came from the
prefix cache (whole blocks only; the last prompt token is always computed). Hit rate = cached /
prompt tokens over all turns (and over turns 2..N, since turn 1 cannot hit). TTFT (submit ->
first token) shows what the hits save. Results: a table on stdout and
``var/bench/context_bench.json``.

Every request carries its user's prefix-cache salt, as the product sends it (gateway/tenancy.py,
issue 27): one user's conversation keeps its hits. What salting costs is what users no longer
share: **a second user's first turn** is measured after another user's first turn, unsalted
(before issue 27) and salted, with the site's system prompt as configured and with a long one
(an operator's ~900-token policy), each the median of ``--repeats`` runs from an empty cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

USER_MESSAGES = [
    "I am planning a vegetable garden. Which vegetables are easy for a beginner?",
    "How much sun do tomatoes need each day?",
    "What about watering? How often should I water them?",
    "Can I grow basil next to the tomatoes?",
    "Which pests should I watch out for?",
    "Is there a natural way to keep aphids away?",
    "When should I harvest the first tomatoes?",
    "How do I store the harvest?",
    "Can I save seeds for next year?",
    "Summarise the plan for my garden in three steps.",
]
MEMORY = "The user's name is Ada. The user lives in Lyon, France, and has a small garden."
SUMMARY = (
    "Earlier, Ada asked about composting kitchen scraps; the assistant explained how to layer "
    "green and brown material and to turn the heap every two weeks."
)
# Two users' first turns: each with their own memory and question after the shared instructions.
FIRST_TURNS = [
    ("The user's name is Ada. The user lives in Lyon, France.", "Which vegetables are easy for a beginner?"),
    ("The user's name is Bo. The user works as a nurse in Oslo.", "How do I keep a sourdough starter alive?"),
]
# An operator's long site prompt (~900 tokens): what cross-user sharing could save per first turn.
LONG_POLICY = " ".join(
    f"Rule {i}: answer politely, cite the help centre for account questions, never promise refunds, "
    "escalate legal threats to a human agent, and keep every answer under two hundred words."
    for i in range(1, 25)
)


@dataclass
class Turn:
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    completion_tokens: int


@dataclass
class Run:
    name: str
    turns: list[Turn] = field(default_factory=list)

    def hit_rate(self, first: int = 0) -> float:
        turns = self.turns[first:]
        prompt = sum(t.prompt_tokens for t in turns)
        return sum(t.cached_tokens for t in turns) / prompt if prompt else 0.0


def naive_messages(system_prompt: str, question: str, exchanges) -> list[dict[str, str]]:
    """The baseline: the same content as ours, behind a per-request line."""
    from inference.prompts import chat_messages  # noqa: PLC0415

    stamp = datetime.now(UTC).isoformat(timespec="microseconds")
    return chat_messages(
        system_prompt=f"Current date and time: {stamp}.\n\n{system_prompt}",
        memory=MEMORY, summary=SUMMARY, exchanges=exchanges, question=question,
    )  # fmt: skip


def salt_of(user_id: int) -> str:
    """User ``user_id``'s prefix-cache salt, as the product derives it (gateway/tenancy.py)."""
    from gateway.gate import Caller  # noqa: PLC0415
    from gateway.tenancy import cache_salt_for  # noqa: PLC0415

    return cache_salt_for(Caller(user_id=user_id, tier="free"))


async def generate(llm, ids: list[int], max_tokens: int, request_id: str, salt: str = "") -> tuple[str, Turn]:
    """Greedy generation straight on the AsyncLLM (to read ``num_cached_tokens``), with the
    prompt salted as the product's engine sends it (inference/engine.py ``engine_prompt``)."""
    from vllm import SamplingParams  # noqa: PLC0415
    from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

    from inference.engine import GenerationOptions, engine_prompt  # noqa: PLC0415

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, output_kind=RequestOutputKind.CUMULATIVE
    )
    started = time.perf_counter()
    ttft = None
    cached = 0
    text = ""
    completion = 0
    async for output in llm.generate(engine_prompt(ids, GenerationOptions(cache_salt=salt)), params, request_id):
        if ttft is None:
            ttft = time.perf_counter() - started
        cached = output.num_cached_tokens or cached
        text = output.outputs[0].text
        completion = len(output.outputs[0].token_ids)
    return text, Turn(len(ids), cached, ttft or 0.0, completion)


async def play(engine, name: str, naive: bool, turns: int, max_tokens: int) -> Run:
    from django.conf import settings  # noqa: PLC0415

    from inference.prompts import prompt_assemble  # noqa: PLC0415

    await engine._llm.reset_prefix_cache()
    run = Run(name)
    exchanges: list[tuple[str, str]] = []
    for index, question in enumerate(USER_MESSAGES[:turns]):
        if naive:
            ids = engine.encode_chat(naive_messages(settings.CHAT_SYSTEM_PROMPT, question, exchanges))
        else:
            ids = prompt_assemble(
                system_prompt=settings.CHAT_SYSTEM_PROMPT, memory=MEMORY, summary=SUMMARY,
                exchanges=exchanges, question=question, encode_chat=engine.encode_chat,
                max_model_len=settings.CHAT_MAX_MODEL_LEN, max_tokens=max_tokens,
            ).token_ids  # fmt: skip
        answer, turn = await generate(engine._llm, ids, max_tokens, f"{name}-{index}", salt_of(1))
        run.turns.append(turn)
        exchanges.append((question, answer))
    return run


async def first_turns(engine, system_prompt: str, salted: bool, repeats: int) -> dict:
    """A second user's first turn right after another user's first turn, from an empty cache,
    ``repeats`` times: the second user's median cached prompt tokens and TTFT (ms), and the
    prompt length. ``salted``: each user's own salt (issue 27), else none (before it)."""
    from django.conf import settings  # noqa: PLC0415

    from inference.prompts import prompt_assemble  # noqa: PLC0415

    cached, ttfts, prompt = [], [], 0
    for repeat in range(repeats):
        await engine._llm.reset_prefix_cache()
        for user, (memory, question) in enumerate(FIRST_TURNS, start=1):
            ids = prompt_assemble(
                system_prompt=system_prompt, memory=memory, summary="", exchanges=[], question=question,
                encode_chat=engine.encode_chat, max_model_len=settings.CHAT_MAX_MODEL_LEN, max_tokens=1,
            ).token_ids  # fmt: skip
            salt = salt_of(user) if salted else ""
            _, turn = await generate(engine._llm, ids, 1, f"first-{salted}-{repeat}-{user}-{len(ids)}", salt)
        cached.append(turn.cached_tokens)
        ttfts.append(turn.ttft_s * 1000)
        prompt = turn.prompt_tokens
    return {
        "salted": salted, "prompt_tokens": prompt, "cached_tokens": statistics.median(cached),
        "ttft_ms": statistics.median(ttfts),
    }  # fmt: skip


async def main_async(turns: int, max_tokens: int, repeats: int = 3) -> dict:
    from inference.engine import VllmEngine  # noqa: PLC0415

    engine = VllmEngine.from_settings()
    await engine.ensure_started()
    try:
        cache_config = engine._llm.vllm_config.cache_config
        ours = await play(engine, "ours", naive=False, turns=turns, max_tokens=max_tokens)
        naive = await play(engine, "naive", naive=True, turns=turns, max_tokens=max_tokens)
        from django.conf import settings  # noqa: PLC0415

        second_user = {
            label: [await first_turns(engine, prompt, salted, repeats) for salted in (False, True)]
            for label, prompt in (
                ("site prompt", settings.CHAT_SYSTEM_PROMPT),
                ("long site prompt", f"{settings.CHAT_SYSTEM_PROMPT}\n\n{LONG_POLICY}"),
            )
        }
    finally:
        engine.shutdown()
    return {
        "second_user_first_turn": second_user,
        "prefix_caching": bool(cache_config.enable_prefix_caching),
        "block_size": cache_config.block_size,
        "turns": turns,
        "max_tokens": max_tokens,
        "runs": [
            {
                "name": run.name,
                "hit_rate": run.hit_rate(),
                "hit_rate_after_turn_1": run.hit_rate(1),
                "prompt_tokens": sum(t.prompt_tokens for t in run.turns),
                "cached_tokens": sum(t.cached_tokens for t in run.turns),
                "ttft_p50_ms": 1000 * statistics.median(t.ttft_s for t in run.turns[1:] or run.turns),
                "per_turn": [asdict(t) for t in run.turns],
            }
            for run in (ours, naive)
        ],
    }


def report(result: dict) -> None:
    print(
        f"\nPrefix-cache hit rate over a {result['turns']}-turn conversation "
        f"(prefix caching {'on' if result['prefix_caching'] else 'OFF'}, "
        f"block {result['block_size']} tokens, greedy, {result['max_tokens']}-token answers)\n"
    )
    print(f"{'assembly':<10}{'hit rate':>10}{'turns 2..N':>12}{'cached/prompt tok':>20}{'TTFT p50':>11}")
    for run in result["runs"]:
        print(
            f"{run['name']:<10}{run['hit_rate']:>10.1%}{run['hit_rate_after_turn_1']:>12.1%}"
            f"{run['cached_tokens']:>10}/{run['prompt_tokens']:<9}{run['ttft_p50_ms']:>8.0f} ms"
        )
    for run in result["runs"]:
        rates = " ".join(f"{t['cached_tokens'] / t['prompt_tokens']:.0%}" for t in run["per_turn"])
        print(f"  {run['name']:<7} per turn: {rates}")
    print(
        "\nours: system, memory, summary, turns, new message (inference/prompts.py); naive: the "
        "same content behind a per-request first line (the time). Every request carries its "
        "user's cache salt (gateway/tenancy.py)."
    )
    print("\nA second user's first turn, after another user's first turn (median of repeats)")
    print(f"{'instructions':<18}{'prompt':>8}{'unsalted: cached':>18}{'TTFT':>9}{'salted: cached':>16}{'TTFT':>9}")
    for label, (before, after) in result["second_user_first_turn"].items():
        print(
            f"{label:<18}{before['prompt_tokens']:>8}{before['cached_tokens']:>18.0f}{before['ttft_ms']:>6.0f} ms"
            f"{after['cached_tokens']:>16.0f}{after['ttft_ms']:>6.0f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs per second-user measurement")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    result = asyncio.run(main_async(min(args.turns, len(USER_MESSAGES)), args.max_tokens, args.repeats))
    report(result)
    out = VAR / "bench" / "context_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
