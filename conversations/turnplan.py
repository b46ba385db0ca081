"""The plan of one answer (:class:`TurnPlan`): how conversations/plan.py admitted it, what
conversations/generate.py answers from, and what the in-flight stream carries
(conversations/turnstream.py ``TurnStream.plan``).

A value object on its own, below the pipeline that builds it, so the stream registry (and the
deletion service that stops streams through it) can name it without importing the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import gate, run
from inference.router import Route
from inference.tool_format import ToolCalling
from moderation.verdicts import Verdict


@dataclass(frozen=True)
class TurnPlan:
    """How one answer was admitted, before anything was stored.

    ``admitted``: the pipeline's admission (gateway/run.py: caller, route, rate-limit decision,
    moderation policy with the turn's real system prompt, the tenant's cache salt);
    ``token_ids``: the assembled prompt; ``max_tokens``: the completion budget (tokens);
    ``context_trimmed``: earlier exchanges left out or summarised (Turn.context_trimmed);
    ``want_summary``: the conversation is outgrowing the budget (summarise after this answer);
    ``verdict``: the input gate's verdict on the new message (None: none was checked);
    ``tools``: the function calling asked for this answer (inference/tool_format.py; None: no
    tools), whose section or template tools the prompt holds; ``sources``: the project passages
    the prompt holds (projects/prompt.py; stored as the answer's sources, projects/sources.py),
    () outside a project.
    """

    admitted: run.Admitted
    token_ids: list[int]
    max_tokens: int
    context_trimmed: int
    want_summary: bool
    verdict: Verdict | None = None
    tools: ToolCalling | None = None
    sources: tuple = ()

    @property
    def route(self) -> Route:
        return self.admitted.route

    @property
    def caller(self) -> gate.Caller:
        return self.admitted.caller

    @property
    def decision(self):
        return self.admitted.decision
