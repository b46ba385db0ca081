"""Project turn TTFT vs a plain turn (issue 30: "TTFT of a project turn vs a plain turn, target
p50 ratio <= 1.3x, same run").

Run through the dev stack::

    python -m chatsite.devstack exec -- python -m bench.project_ttft [--rounds 8] [--turns 2]

Through the full stack (uvicorn in this process, ``POST /v1/conversations`` and
``/v1/conversations/{id}/turns``, the real engine; bench/harness.py's server, bench/clients.py's
client): a scratch user with a project holding instructions and one file of
:data:`PASSAGES` (embedded by the real all-MiniLM-L6-v2). After a warm-up conversation each way,
``--rounds`` rounds alternate a plain conversation and one in the project: plain, project,
plain, project, ...; each round is a new conversation with ``--turns`` turns of 16 answer tokens.
Every project turn retrieves up to 5 passages (the count each answer got is reported from its
stored sources). Medians of every turn's TTFT per side, the project/plain ratio against 1.3x,
the same for first turns alone, and the plain/plain spread (the plain rounds split into odd and
even halves, their medians' ratio): the run's noise floor.

Retrieval is projects/retrieval.py (``CHAT_PROJECT_TOP_K``, ``CHAT_PROJECT_RETRIEVAL_TOKENS``).
Results: stdout and ``var/bench/project_ttft.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
TARGET = 1.3

INSTRUCTIONS = (
    "You help plan the Antares sounding-rocket campaign. Answer briefly, in metric units, and say "
    "which document a fact comes from. If the documents do not say, say so."
)
PASSAGES = [
    f"Section {i}. " + text
    for i, text in enumerate([
        "The Antares launch window opens at 04:10 UTC and closes at 04:42 UTC on each day of the campaign; a hold longer than 20 minutes moves the attempt to the next day.",
        "Range safety requires wind at the launcher below 8 metres per second and no lightning within 20 kilometres for the previous 30 minutes.",
        "The payload mass is 62 kilograms, including the 4-kilogram recovery beacon and the parachute canister mounted under the nose cone.",
        "Telemetry runs at 2.2 GHz with a 5 Mbit/s downlink; the ground station at Kiruna records it and relays a copy to the operations room.",
        "The motor is a two-stage solid design; the first stage burns for 6 seconds and the second for 12 seconds after a 3-second coast.",
        "Apogee is predicted at 248 kilometres, reached 260 seconds after lift-off; microgravity lasts about 6 minutes on the way down.",
        "Recovery is by helicopter within 90 minutes of landing; the impact zone is 70 kilometres north of the range, inside the restricted area.",
        "The campaign team is 24 people: 8 from the payload group, 10 from the range, 6 from the vehicle contractor.",
        "Weather briefings are held at T minus 6 hours and T minus 90 minutes; the launch director decides go or no-go at T minus 15 minutes.",
        "The experiment studies crystal growth of proteins in microgravity; its furnace heats to 38 degrees Celsius 40 seconds before apogee.",
        "Spare parts for the igniter and the telemetry transmitter are kept in the assembly hall; the spare motor arrives one week before the window.",
        "Cold-weather rules: below minus 25 degrees Celsius the motor heaters must run for 4 hours before the count.",
    ])
]
QUESTIONS = [
    "When does the Antares launch window open and close?",
    "What wind speed does range safety allow at the launcher?",
    "How heavy is the payload, beacon included?",
    "How is telemetry received and where is it recorded?",
    "How long do the two motor stages burn?",
    "What apogee is predicted and how long is microgravity?",
    "How is the payload recovered after landing?",
    "Who decides go or no-go, and when?",
]


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def run(rounds: int, turns: int) -> dict:
    """The alternating rounds (module docstring); returns the numbers."""
    from bench.clients import Api  # noqa: PLC0415
    from bench.harness import InProcessServer  # noqa: PLC0415
    from projects import services as project_services  # noqa: PLC0415
    from projects.models import ProjectTurnSource  # noqa: PLC0415
    from tests.projects_support import passage_file_add  # noqa: PLC0415

    retrieval = "projects/retrieval.py"
    server = InProcessServer()
    server.start()
    api = Api(server.url, prefix="projectbench", key_name="project bench")
    project = project_services.project_create(owner=api.user, name="Antares", instructions=INSTRUCTIONS, personal=True)
    passage_file_add(project, user=api.user, name="campaign.md", passages=PASSAGES)
    samples: dict[str, dict[int, list[tuple[int, float]]]] = {"plain": {}, "project": {}}
    passages_used: list[int] = []
    uncached: dict[str, list[int]] = {"plain": [], "project": []}
    errors = 0

    def conversation(mode: str) -> str:
        body = {"project_id": str(project.pk)} if mode == "project" else {}
        created = api.client.post("/v1/conversations", json=body)
        created.raise_for_status()
        api.conversations.append(created.json()["conversation_id"])
        return api.last_conversation

    try:
        for i, mode in enumerate(("plain", "project")):  # warm-up: one conversation each way
            api.turn(QUESTIONS[i], 16, "warm", -1, i, conversation_id=conversation(mode))
        for r in range(rounds * 2):
            mode = ("plain", "project")[r % 2]
            conversation_id = conversation(mode)
            for k in range(turns):
                index = (r // 2 * turns + k) % len(QUESTIONS)
                sample = api.turn(QUESTIONS[index], 16, mode, r, index, conversation_id=conversation_id)
                if sample.error is None and sample.ttft_s is not None:
                    samples[mode].setdefault(r // 2, []).append((k, sample.ttft_s))
                    usage = sample.usage or {}
                    uncached[mode].append(usage.get("prompt_tokens", 0) - usage.get("cached_tokens", 0))
                else:
                    errors += 1
                    print(f"  error: {sample.error}", file=sys.stderr)
            if mode == "project":
                counts = ProjectTurnSource.objects.filter(conversation_id=conversation_id).values_list("answer_id", flat=True)
                per_answer: dict = {}
                for answer_id in counts:
                    per_answer[answer_id] = per_answer.get(answer_id, 0) + 1
                passages_used += list(per_answer.values())
    finally:
        api.close()
        server.stop()

    def pick(mode: str, rounds_of=lambda r: True, first_only: bool = False) -> list[float]:
        return [t for r, values in samples[mode].items() if rounds_of(r)
                for k, t in values if not first_only or k == 0]  # fmt: skip

    # What each side prefilled: the prompt's tokens the prefix cache did not hold (done events).
    prefilled = {mode: statistics.median(values) if values else 0 for mode, values in uncached.items()}
    project_p50, plain_p50 = _median_ms(pick("project")), _median_ms(pick("plain"))
    project_first, plain_first = _median_ms(pick("project", first_only=True)), _median_ms(pick("plain", first_only=True))
    plain_a = _median_ms(pick("plain", lambda r: r % 2 == 0))
    plain_b = _median_ms(pick("plain", lambda r: r % 2 == 1))
    return {
        "retrieval": retrieval,
        "rounds": rounds,
        "turns_per_conversation": turns,
        "errors": errors,
        "turns": sum(len(v) for mode in samples.values() for v in mode.values()),
        "passages_per_project_answer": sorted(set(passages_used)),
        "project_p50_ms": project_p50,
        "plain_p50_ms": plain_p50,
        "ratio": project_p50 / plain_p50,
        "project_first_turn_p50_ms": project_first,
        "plain_first_turn_p50_ms": plain_first,
        "first_turn_ratio": project_first / plain_first,
        "plain_halves_p50_ms": [plain_a, plain_b],
        "plain_plain_spread": max(plain_a, plain_b) / min(plain_a, plain_b) - 1,
        "prefilled_tokens_p50": prefilled,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds each way (plain, project, ...)")
    parser.add_argument("--turns", type=int, default=2, help="turns per conversation")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", verbosity=0)
    result = run(args.rounds, args.turns)
    print("\nProject turn TTFT vs a plain turn (issue 30)")
    print(f"  retrieval: {result['retrieval']}; passages per project answer: {result['passages_per_project_answer']}")
    print(
        f"  {result['turns']} turns, {result['rounds']} rounds each way alternating, "
        f"{result['turns_per_conversation']} turns per conversation, {result['errors']} errors"
    )
    verdict = "PASS" if result["ratio"] <= TARGET else "MISS"
    print(
        f"  every turn:  project {result['project_p50_ms']:.1f} ms   plain {result['plain_p50_ms']:.1f} ms   "
        f"ratio {result['ratio']:.3f}x   {verdict} (target p50 ratio <= {TARGET}x)"
    )
    tokens = result["prefilled_tokens_p50"]
    extra = tokens["project"] - tokens["plain"]
    print(
        f"  prefilled (prompt tokens not from the prefix cache), p50: project {tokens['project']:.0f}   "
        f"plain {tokens['plain']:.0f}   "
        + (f"-> {(result['project_p50_ms'] - result['plain_p50_ms']) / extra:.2f} ms per extra token" if extra > 0 else "")
    )
    print(
        f"  first turns: project {result['project_first_turn_p50_ms']:.1f} ms   "
        f"plain {result['plain_first_turn_p50_ms']:.1f} ms   ratio {result['first_turn_ratio']:.3f}x"
    )
    a, b = result["plain_halves_p50_ms"]
    print(f"  plain/plain spread (noise floor): {result['plain_plain_spread'] * 100:.1f}% (odd rounds {a:.1f} ms, even {b:.1f} ms)")
    out = VAR / "bench" / "project_ttft.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
