"""A scripted stand-in for the vLLM engine (tests only; never imported by the product).

It has the same surface as ``inference.engine.VllmEngine`` (see ``EngineProtocol``): each
``generate`` call plays the next script, a list of steps: a string is a text delta, a number
is a pause in seconds before the next step, an exception instance is raised. It records
aborts and counts unfinished requests the way the real engine does. ``cached_tokens`` is what
every delta reports as prefix-cache hits (capped at the prompt's length; default 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from inference.engine import Delta, EngineUnavailable, GenerationOptions  # noqa: F401

Step = str | float | int | BaseException


@dataclass
class ScriptedEngine:
    scripts: list[list[Step]] = field(default_factory=list)
    default_script: list[Step] = field(default_factory=lambda: ["Hello", ", ", "world", "."])
    ready: bool = True
    started: int = 0
    aborted: dict[str, float] = field(default_factory=dict)  # request id -> monotonic time
    requests: list[tuple[list[int], GenerationOptions, str]] = field(default_factory=list)
    unfinished: set[str] = field(default_factory=set)
    waited_ready: int = 0
    cached_tokens: int = 0  # prompt tokens each request reports as prefix-cache hits
    # Report cached_tokens as is, even beyond the prompt (an engine quirk the serving layer
    # must clamp, issue 17); by default the double reports at most the prompt, as vLLM does.
    cached_unclamped: bool = False

    @classmethod
    def from_settings(cls) -> ScriptedEngine:
        """A fresh double; in a server subprocess, ``CHAT_SCRIPTED_ENGINE_SCRIPT`` (a JSON list
        of steps: text deltas and pauses in seconds) replaces the default script, repeated
        ``CHAT_SCRIPTED_ENGINE_REPEAT`` times (default 1: a long answer without a long
        environment variable)."""
        double = cls()
        script = os.environ.get("CHAT_SCRIPTED_ENGINE_SCRIPT")
        if script:
            double.default_script = json.loads(script) * int(
                os.environ.get("CHAT_SCRIPTED_ENGINE_REPEAT", "1")
            )
        return double

    async def ensure_started(self) -> None:
        self.started += 1
        self.ready = True

    def vocab_size(self) -> int:
        return 49152  # SmolLM2's

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        # One "token" per whitespace-separated word plus 3 per message for the template.
        ids: list[int] = []
        for m in messages:
            ids.extend([1, 2, 3])
            ids.extend(range(len(m["content"].split())))
        return ids

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def encode_text(self, text: str) -> list[int]:
        return list(range(len(text.split())))

    async def wait_ready(self, timeout_s: float) -> None:
        self.waited_ready += 1

    def check_health(self) -> None:
        pass

    async def generate(
        self, prompt_token_ids: list[int], options: GenerationOptions, request_id: str
    ) -> AsyncIterator[Delta]:
        script = self.scripts.pop(0) if self.scripts else list(self.default_script)
        self.requests.append((list(prompt_token_ids), options, request_id))
        self.unfinished.add(request_id)
        completion = 0
        finished = False
        prompt = len(prompt_token_ids)
        cached = self.cached_tokens if self.cached_unclamped else min(self.cached_tokens, prompt)
        try:
            for step in script:
                if isinstance(step, BaseException):
                    raise step
                if isinstance(step, (int, float)):
                    await asyncio.sleep(step)
                    continue
                completion += 1
                if completion >= options.max_tokens:
                    yield Delta(step, prompt, completion, "length", cached_tokens=cached)
                    finished = True
                    return
                yield Delta(step, prompt, completion, cached_tokens=cached)
            finished = True
            yield Delta("", prompt, completion, "stop", cached_tokens=cached)
        finally:
            if not finished:
                await self.abort(request_id)
            self.unfinished.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.setdefault(request_id, time.monotonic())
        self.unfinished.discard(request_id)

    def num_unfinished_requests(self) -> int:
        return len(self.unfinished)
