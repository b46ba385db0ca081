"""The Hermes function-calling format and the tool-call state of one answer: the one renderer and
parser of tool calls, for every entrypoint (``/v1/chat/completions`` through api/tools.py, which
checks the request, and conversation turns through conversations/plan.py and generate.py).

**The format** (NousResearch's Hermes function calling, which vLLM's ``hermes`` tool parser
reads and Qwen2.5's chat template writes): after the system prompt, the functions as JSON inside
``<tools></tools>``; each call the model makes as ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``. Earlier calls are written back the same way, and tool results go in a user
message as ``<tool_response>`` blocks (:func:`hermes_messages`; ChatML has no tool role). The
tools section ends the system message, so it stays in the cached prefix from turn to turn and
its tokens count as prompt tokens (TPM and cost) like any other.

**The answer** (:class:`ToolCalling`): ``required`` is constrained (vLLM structured output) to a
JSON array of ``{"name", "arguments"}`` calls (at most one without ``parallel_tool_calls``); a
named function to its arguments object; ``auto`` writes freely and the ``<tool_call>`` blocks it
writes are the calls (a block that is not JSON of a known function stays text); ``none`` puts no
tools in the prompt. :class:`ToolStream` turns streamed text into OpenAI chunk deltas.

**A model whose chat template has a tool format** (one that reads a ``tools`` variable, as HF
templates do): :func:`template_has_tools` says so, and ``tools`` then goes to
``apply_chat_template`` instead of the system-message section (:func:`prompt_style`). SmolLM2's
template has none, so the Hermes section is the default here. Pure functions and value
objects: no feature app, no engine.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

# The Hermes system-prompt section (Qwen2.5's chat template writes the same words).
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass(frozen=True)
class ToolCalling:
    """What a request asks of function calling (api/tools.py ``tool_calling`` checks a request
    and builds it). ``mode``: ``"none"``,
    ``"auto"``, ``"required"`` or ``"named"``; ``named``: the function for ``"named"``;
    ``functions``: name -> its definition (OpenAI's ``function`` object, ``name`` /
    ``description`` / ``parameters``, the request's order); ``parallel``:
    ``parallel_tool_calls``."""

    mode: str
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)
    named: str = ""
    parallel: bool = True

    @property
    def in_prompt(self) -> bool:
        """Whether the tools go into the prompt (not for ``none``)."""
        return self.mode != "none" and bool(self.functions)

    def system_section(self) -> str:
        """The Hermes tools section for the end of the system message ("" when no tools go
        into the prompt): one compact JSON line per function, in the request's order, so the
        same tools give the same tokens (the cached prefix)."""
        if not self.in_prompt:
            return ""
        lines = [
            json.dumps(spec, ensure_ascii=False) for spec in self.tool_specs()
        ]
        return "\n".join([TOOLS_HEADER, *lines, TOOLS_FOOTER])

    def tool_specs(self) -> list[dict[str, Any]]:
        """The functions as OpenAI's ``tools`` items (``{"type": "function", "function"}``), in
        the request's order: what a chat template with a tool format is given."""
        return [{"type": "function", "function": f} for f in self.functions.values()]

    def guided_schema(self) -> dict | None:
        """The JSON Schema the answer is constrained to: the named function's arguments, or
        for ``required`` an array of ``{"name", "arguments"}`` calls (one item at most without
        parallel calls); None for ``auto`` and ``none`` (free text)."""
        if self.mode == "named":
            return _arguments_schema(self.functions[self.named])
        if self.mode != "required":
            return None
        items = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": _arguments_schema(f)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, f in self.functions.items()
        ]
        schema = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool calls) of a whole answer ``text``: OpenAI's ``message.content`` (None
        when the answer is only calls) and ``message.tool_calls`` items (``{"id", "type":
        "function", "function": {"name", "arguments"}}``, arguments a JSON text). A constrained
        answer that does not parse (cut off at the token budget) is returned as content with no
        calls."""
        if self.mode == "named":
            if _json(text) is _NOT_JSON:
                return text, []
            return None, [_call(self.named, text.strip())]
        if self.mode == "required":
            calls = _json(text)
            if not isinstance(calls, list) or not calls or not all(_is_call(c) for c in calls):
                return text, []  # cut off, or (unconstrained) not the list of calls asked for
            return None, [_call(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls]
        if self.mode != "auto":
            return text, []
        calls = []
        for block in _CALL_BLOCK.findall(text):
            call = self._known_call(block)
            if call is not None:
                calls.append(call)
        if not calls:
            return text, []
        if not self.parallel:
            calls = calls[:1]
        content = _CALL_BLOCK.sub("", text).strip()
        return (content or None), calls

    def _known_call(self, block: str) -> dict | None:
        """The call a ``<tool_call>`` block holds when it is ``{"name": <a function of the
        request>, "arguments": {...}}``, else None."""
        data = _json(block)
        if not isinstance(data, dict) or data.get("name") not in self.functions:
            return None
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            arguments = _json(arguments)
        if not isinstance(arguments, dict):
            return None
        return _call(data["name"], json.dumps(arguments, ensure_ascii=False))


_NOT_JSON = object()


def _json(text: str) -> Any:
    """``text`` parsed as JSON, or :data:`_NOT_JSON` when it is not JSON or nests deeper than
    Python's parser recurses (model output is read, never trusted)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _is_call(value: Any) -> bool:
    """Whether ``value`` is one item of the required mode's list: ``{"name": str, "arguments":
    object}``."""
    return isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("arguments"), dict)


def _call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _arguments_schema(function: dict[str, Any]) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def hermes_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """OpenAI-shaped chat messages (``{"role", "content", "tool_calls"?, "tool_call_id"?}``,
    content a text or None) as ``[{role, content}]`` texts for a chat template without a tool
    format: ``developer`` read as ``system``; an assistant message's calls written after its text
    as ``<tool_call>`` blocks; consecutive ``tool`` results joined into one user message of
    ``<tool_response>`` blocks."""
    out: list[dict[str, str]] = []
    joined_results = False  # whether out[-1] is a user message of tool results
    for message in messages:
        role = "system" if message["role"] == "developer" else message["role"]
        text = message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            blocks = [call_block(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
            text = "\n".join([text, *blocks] if text else blocks)
        if role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if joined_results:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
                joined_results = True
            continue
        out.append({"role": role, "content": text})
        joined_results = False
    return out


def call_block(name: str, arguments: str) -> str:
    """One call as the model writes it: ``<tool_call>`` JSON ``{"name", "arguments"}``
    ``</tool_call>`` (arguments as an object; the text itself when it is not JSON, or nests too
    deeply for Python's parser)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        value = arguments
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': value}, ensure_ascii=False)}\n{CALL_CLOSE}"


# --- chat templates with a tool format -----------------------------------------------------------

# A Jinja template that reads the ``tools`` variable (``{% if tools %}``, ``tools | length``,
# ``for tool in tools``): HF's convention for templates that render function definitions.
_TEMPLATE_READS_TOOLS = re.compile(r"(\{%-?|\{\{-?)[^%}]*\btools\b")


def template_has_tools(template: str | None) -> bool:
    """Whether a chat template (Jinja text; None: the tokenizer has none) renders function
    definitions itself: it reads the ``tools`` variable inside a Jinja tag (HF's convention,
    transformers' "Tool use" chat templating). Mentions in plain text do not count."""
    return bool(template) and bool(_TEMPLATE_READS_TOOLS.search(template))


HERMES, NATIVE = "hermes", "native"


def prompt_style(template: str | None) -> str:
    """How tools go into a prompt for a model with chat template ``template``: :data:`NATIVE`
    (``tools`` passed to ``apply_chat_template``, messages with ``tool_calls`` and ``tool``
    roles passed as they are) when the template has a tool format, else :data:`HERMES` (the
    system-message section and :func:`hermes_messages`). Either way the answer is read with the
    Hermes parser (:meth:`ToolCalling.parse`, what vLLM's ``hermes`` tool parser reads): the
    templates that render tools this way (Qwen2.5, Hermes) ask for ``<tool_call>`` blocks."""
    return NATIVE if template_has_tools(template) else HERMES


class ToolStream:
    """Text deltas of a streamed answer -> OpenAI chunk deltas (module docstring, "Streamed").
    :meth:`feed` each text as it comes, then :meth:`close`; each returns the deltas to send
    (``{"content": ...}`` or ``{"tool_calls": [...]}``). :attr:`calls` counts the calls sent."""

    def __init__(self, calling: ToolCalling):
        self.calling = calling
        self.calls = 0
        self._text = ""  # everything generated
        self._sent = 0  # characters of _text sent as content (auto) or arguments (named)
        self._named_id = ""

    def feed(self, text: str) -> list[dict]:
        self._text += text
        mode = self.calling.mode
        if mode == "named":
            deltas = []
            if not self._named_id:
                self._named_id = f"call_{uuid.uuid4().hex[:24]}"
                self.calls = 1
                deltas.append(_call_delta(0, id=self._named_id, name=self.calling.named, arguments=""))
            deltas.append(_call_delta(0, arguments=text))
            return deltas
        if mode == "auto":
            held = self._text[self._sent :]
            start = held.find(CALL_OPEN)  # once a call begins, all after it is held to the end
            safe = held[:start] if start >= 0 else held[: len(held) - _prefix_overlap(held, CALL_OPEN)]
            self._sent += len(safe)
            return [{"content": safe}] if safe else []
        if mode == "required":
            return []
        return [{"content": text}] if text else []

    def close(self) -> list[dict]:
        """The deltas left at the end: ``required``'s and ``auto``'s calls (or, when no call
        parses, the text held back as content)."""
        mode = self.calling.mode
        if mode in ("named", "none"):
            return []
        rest = self._text[self._sent :]
        if mode == "required":
            content, calls = self.calling.parse(self._text)
        else:
            content, calls = self.calling.parse(rest)
        if not calls:
            return [{"content": rest}] if rest else []
        deltas = []
        if mode == "auto" and content:
            deltas.append({"content": content})
        for index, call in enumerate(calls):
            function = call["function"]
            deltas.append(_call_delta(index, id=call["id"], name=function["name"], arguments=""))
            deltas.append(_call_delta(index, arguments=function["arguments"]))
        self.calls = len(calls)
        return deltas


def _call_delta(index: int, *, id: str = "", name: str = "", arguments: str | None = None) -> dict:
    item: dict = {"index": index}
    if id:
        item["id"], item["type"] = id, "function"
    function: dict = {}
    if name:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    item["function"] = function
    return {"tool_calls": [item]}


def _prefix_overlap(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (held back in case the
    marker is being written)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def chat_encoder(engine, calling: ToolCalling | None) -> tuple[Callable[[list[dict]], list[int]], str]:
    """(encode_chat, tools section) for a prompt of OpenAI-shaped messages (tool rounds
    included) to ``engine``'s model with ``calling``'s tools (None: no tools this time).
    For a chat template with a tool format (:func:`prompt_style`, read from the engine's
    ``chat_template()`` when it has one), the messages go as they are with the tools as
    ``apply_chat_template``'s ``tools`` and the section is "". Otherwise each message list is
    rendered by :func:`hermes_messages` and the section is the Hermes tools section for the end
    of the system message ("" without tools)."""
    template = engine.chat_template() if hasattr(engine, "chat_template") else None
    tools = calling is not None and calling.in_prompt
    if prompt_style(template) == NATIVE:
        specs = calling.tool_specs() if tools else None
        return (lambda messages: engine.encode_chat(messages, tools=specs)), ""
    return (lambda messages: engine.encode_chat(hermes_messages(messages))), (calling.system_section() if tools else "")
