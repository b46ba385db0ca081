"""Function calling on ``/v1/chat/completions`` (issue 30, part 1), as OpenAI documents it
("Function calling"; the chat completion object's ``tool_calls``, ``finish_reason:
"tool_calls"`` and the chunk object's tool-call deltas).

**The request.** ``tools`` (functions with a JSON Schema of their arguments), ``tool_choice``
(``none``, ``auto`` (the default when tools are given), ``required``, or one named function),
``parallel_tool_calls``; assistant messages carry ``tool_calls`` and ``tool`` messages carry
``tool_call_id``, the id of the call they answer. :func:`tool_calling` checks all of it and
refuses with a 400 that names the field: a ``parameters`` that is not a JSON Schema (or not an
object's), two functions of one name, a named function not in ``tools``, ``required`` or a
named function without tools, a ``tool`` message whose id matches no earlier call.

**The prompt.** SmolLM2's chat template (ChatML) has no tool format, so the tools are written
the documented Hermes way (NousResearch's Hermes function-calling format, which vLLM's
``hermes`` tool parser reads and Qwen2.5's template writes): after the system prompt, the
functions as JSON inside ``<tools></tools>``, and each call the model makes as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Earlier calls are written back the
same way and tool results go in a user message as ``<tool_response>`` blocks. The tools section
is part of the system message, so it stays in the cached prefix from turn to turn and its
tokens count as prompt tokens (TPM and cost) like any other.

**The answer.**

- ``required``: the answer is constrained (vLLM structured output) to a JSON array of
  ``{"name", "arguments"}`` objects, one per call (at most one without
  ``parallel_tool_calls``), each ``arguments`` valid against its function's schema by
  construction;
- a named function: the answer is constrained to that function's arguments object;
- ``auto``: the model writes freely and the ``<tool_call>`` blocks it writes are the calls (a
  block that is not JSON of a known function stays text);
- ``none``: no tools in the prompt; an ordinary answer.

Streamed (:class:`ToolStream`), a named function's arguments go out as string fragments as
they are generated; ``auto`` text goes out as it comes until a ``<tool_call>`` begins; the calls
of ``auto`` and ``required`` go out once each call is complete (its id and name, then its
arguments).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from jsonschema import exceptions as schema_errors
from jsonschema import validators

from api import schemas
from core.errors import ApiError

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


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


@dataclass(frozen=True)
class ToolCalling:
    """What a request asks of function calling (:func:`tool_calling`). ``mode``: ``"none"``,
    ``"auto"``, ``"required"`` or ``"named"``; ``named``: the function for ``"named"``;
    ``functions``: name -> its definition (the request's order); ``parallel``:
    ``parallel_tool_calls``."""

    mode: str
    functions: dict[str, schemas.FunctionDefinition] = field(default_factory=dict)
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
            json.dumps({"type": "function", "function": f.model_dump(exclude_none=True)}, ensure_ascii=False)
            for f in self.functions.values()
        ]
        return "\n".join([TOOLS_HEADER, *lines, TOOLS_FOOTER])

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
            try:
                json.loads(text)
            except ValueError:
                return text, []
            return None, [_call(self.named, text.strip())]
        if self.mode == "required":
            try:
                calls = json.loads(text)
            except ValueError:
                return text, []
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
        try:
            data = json.loads(block)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("name") not in self.functions:
            return None
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return _call(data["name"], json.dumps(arguments, ensure_ascii=False))


def _call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _arguments_schema(function: schemas.FunctionDefinition) -> dict:
    return function.parameters if function.parameters else {"type": "object", "properties": {}}


def tool_calling(body: schemas.ChatCompletionCreate) -> ToolCalling:
    """Check ``body``'s ``tools``, ``tool_choice`` and tool messages and return what it asks
    (module docstring). Raises ApiError 400 naming the field for each fault the module
    docstring lists, and for ``response_format`` beside a required or named tool choice (one
    answer cannot be constrained to two schemas)."""
    functions: dict[str, schemas.FunctionDefinition] = {}
    for index, tool in enumerate(body.tools or []):
        function = tool.function
        if function.name in functions:
            raise _bad(f"tools[{index}].function.name: '{function.name}' is given twice; names must be unique.")
        if function.parameters is not None:
            _schema_check(function.parameters, f"tools[{index}].function.parameters")
        functions[function.name] = function
    choice = body.tool_choice
    if isinstance(choice, schemas.NamedToolChoice):
        if choice.function.name not in functions:
            known = ", ".join(functions) or "none"
            raise _bad(f"tool_choice: the function '{choice.function.name}' is not in tools (given: {known}).")
        calling = ToolCalling("named", functions, named=choice.function.name, parallel=body.parallel_tool_calls)
    else:
        mode = choice or ("auto" if functions else "none")
        if mode == "required" and not functions:
            raise _bad("tool_choice: 'required' needs at least one function in tools.")
        calling = ToolCalling(mode, functions, parallel=body.parallel_tool_calls)
    if calling.mode in ("required", "named") and body.response_format is not None and body.response_format.type != "text":
        raise _bad("response_format cannot be combined with a required or named tool_choice.")
    messages_check(body.messages)
    return calling


def _schema_check(parameters: dict, where: str) -> None:
    """Raise ApiError 400 unless ``parameters`` is a JSON Schema (its own draft's meta-schema,
    Draft 2020-12 when it names none) of an object."""
    try:
        validators.validator_for(parameters, default=validators.Draft202012Validator).check_schema(parameters)
    except schema_errors.SchemaError as exc:
        path = "".join(f"[{p!r}]" for p in exc.path)
        raise _bad(f"{where}{path} is not a valid JSON Schema: {exc.message}") from None
    if parameters.get("type", "object") != "object":
        raise _bad(f"{where}: the arguments must be an object (\"type\": \"object\").")


def messages_check(messages: list[schemas.ChatMessage]) -> None:
    """Raise ApiError 400 naming the message when one carries what its role may not: content
    missing on a system/user/tool message or on an assistant message without calls,
    ``tool_calls`` off an assistant message, a ``tool`` message without ``tool_call_id`` or
    whose id matches no call of an earlier assistant message."""
    calls: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.tool_calls and message.role != "assistant":
            raise _bad(f"{where}: only assistant messages carry tool_calls.")
        if message.role == "assistant":
            if message.content is None and not message.tool_calls:
                raise _bad(f"{where}: an assistant message needs content or tool_calls.")
            calls.update(call.id for call in message.tool_calls or ())
            continue
        if message.content is None:
            raise _bad(f"{where}: a {message.role} message needs content.")
        if message.role == "tool":
            if not message.tool_call_id:
                raise _bad(f"{where}: a tool message needs the tool_call_id of the call it answers.")
            if message.tool_call_id not in calls:
                raise _bad(f"{where}: tool_call_id '{message.tool_call_id}' matches no tool call of an earlier assistant message.")


def prompt_messages(messages: list[schemas.ChatMessage]) -> list[dict[str, str]]:
    """``messages`` as ``[{role, content}]`` texts for the model's chat template: ``developer``
    read as ``system``; an assistant message's calls written after its text as Hermes
    ``<tool_call>`` blocks; consecutive ``tool`` results joined into one user message of
    ``<tool_response>`` blocks (ChatML has no tool role)."""
    out: list[dict[str, str]] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        text = message.text()
        if role == "assistant" and message.tool_calls:
            blocks = [
                f"{CALL_OPEN}\n{json.dumps({'name': c.function.name, 'arguments': _arguments_of(c)}, ensure_ascii=False)}\n{CALL_CLOSE}"
                for c in message.tool_calls
            ]
            text = "\n".join([text, *blocks] if text else blocks)
        if role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
                continue
            out.append({"role": "user", "content": block, "tool_results": "1"})
            continue
        out.append({"role": role, "content": text})
    for message in out:
        message.pop("tool_results", None)
    return out


def _arguments_of(call: schemas.ToolCall):
    """A call's arguments as an object for the prompt (the text itself when it is not JSON)."""
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


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
